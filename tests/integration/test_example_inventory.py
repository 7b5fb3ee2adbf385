# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The README's way on the lab: ``inventories/example`` copied as it is, with only what the README tells an
operator to change or put beside it: the hosts' endpoints (the lab's), the EK roots (the lab CA stands for the TPM
vendor), the image's measurements with their signature and the pinned key, the vault-encrypted init secret and the vault-encrypted admin key in their
default places
(``init_secret``, ``admin_key``; HOME points into the test's directory). Two lab-only variables are added to
the hosts file: the namespace the controller opens its sockets in, and Kubernetes off (kubeadm cannot be
installed here). Everything else is the example's and the roles' defaults.

The cluster this gives must be secure as docs/security.md says, and no insecure choice may be in force (none is
warned about); choosing the insecure variant without its acknowledgement is refused, naming the option.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from lab.lab import Lab
from tests.support import ROOT
from tests.support.playbook import PlayRun, run_playbook
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import settings_from_args
from ansible_collections.constellation.cluster.plugins.plugin_utils.controller import open_peer

pytestmark = pytest.mark.lab

VENV_BIN = ROOT / ".venv" / "bin"


class Example:
    def __init__(self, lab: Lab, lab_inv: Path, inv: Path, home: Path, vault_pass: Path):
        self.lab, self.lab_inv, self.inv, self.home, self.vault_pass = lab, lab_inv, inv, home, vault_pass

    def play(self, playbook: str, *extra: str) -> PlayRun:
        return run_playbook(ROOT / playbook, str(self.inv / "hosts.yml"), self.inv.parent / "runs",
                            ["--vault-password-file", str(self.vault_pass)] + list(extra), env={"HOME": self.home})


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    base = tmp_path_factory.mktemp("example")
    lab_inv = base / "lab-inventory"
    lab = Lab("texam", inventory_dir=lab_inv)
    lab.up(hosts=3, tpm=True, agents=True)
    try:
        inv = base / "mycluster"
        shutil.copytree(ROOT / "inventories" / "example", inv)  # cp -r inventories/example inventories/mycluster
        example_hosts = yaml.safe_load((inv / "hosts.yml").read_text())
        lab_hosts = yaml.safe_load((lab_inv / "hosts.yml").read_text())
        lab_vars = yaml.safe_load((lab_inv / "group_vars" / "all" / "lab.yml").read_text())
        # The operator's edits: the endpoints (the groups keep the example's shape) ...
        hosts = {"all": {"children": {
            group: {"hosts": {name: {"constellation_public_endpoint": values["constellation_public_endpoint"]}
                              for name, values in lab_hosts["all"]["children"][group]["hosts"].items()}}
            for group in ("coordinators", "nodes")}}}
        assert set(hosts["all"]["children"]) == set(example_hosts["all"]["children"])
        # ... and, lab only, where the controller's sockets are opened and that kubeadm cannot run here.
        hosts["all"]["vars"] = {"constellation_atls_netns": lab_vars["constellation_atls_netns"],
                                "constellation_kubernetes": False,
                                "ansible_python_interpreter": lab_vars["ansible_python_interpreter"]}
        (inv / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
        shutil.copy(lab_inv / "ek_ca.pem", inv / "ek_ca.pem")  # the TPM vendor's EK roots
        shutil.copy(lab_inv / "measurements.json", inv / "measurements.json")  # the image's measurements
        shutil.copy(lab_inv / "measurements.json.sig", inv / "measurements.json.sig")  # ... signed
        shutil.copy(lab_inv / "measurements.pub", inv / "measurements.pub")  # the pinned key they are signed with
        vault_pass = base / "vault_pass"
        vault_pass.write_text(os.urandom(16).hex() + "\n")
        vault_pass.chmod(0o600)
        (inv / "init_secret").write_text((lab_inv / "init_secret").read_text())  # the agents were given its hashes
        subprocess.run([str(VENV_BIN / "ansible-vault"), "encrypt", "--vault-password-file", str(vault_pass),
                        str(inv / "init_secret")], check=True, capture_output=True, timeout=60)
        home = base / "home"
        home.mkdir()
        shutil.copy(lab_vars["constellation_admin_priv_key_file"], inv / "admin_key")  # read decrypted in memory
        subprocess.run([str(VENV_BIN / "ansible-vault"), "encrypt", "--vault-password-file", str(vault_pass),
                        str(inv / "admin_key")], check=True, capture_output=True, timeout=60)
        yield Example(lab, lab_inv, inv, home, vault_pass)
    finally:
        lab.down()


def test_the_example_inventory_chooses_nothing_insecure(example):
    group_vars = yaml.safe_load((example.inv / "group_vars" / "all" / "cluster.yml").read_text())
    assert "constellation_attestation_variant" not in group_vars  # the default: qemu-vtpm-ek
    assert not any(key.startswith("constellation_insecure") for key in group_vars), group_vars
    assert group_vars["constellation_ek_ca_path"] and group_vars["constellation_init_secret_file"]
    assert group_vars["constellation_measurements_pub_key_file"]  # the policy must be signed


def test_the_insecure_variant_without_its_acknowledgement_is_refused_naming_it(example):
    proc = example.play("site.yml", "-e", "constellation_attestation_variant=qemu-vtpm")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "constellation_insecure_trust_any_ak" in out or "insecure_trust_any_ak" in out, out[-3000:]
    assert not list(example.inv.glob("constellation-*.json")), "no secret may be made for a refused run"


def test_site_yml_from_the_example_inventory_builds_a_secure_cluster(example):
    proc = example.play("site.yml")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    rows = proc.recap()
    assert set(rows) == {"h1", "h2", "h3"}, rows
    assert all(r["failed"] == 0 and r["unreachable"] == 0 for r in rows.values()), rows
    # No insecure choice is in force: nothing is warned about as insecure or trusting any key.
    assert not re.search(r"insecure|trusts? any", out, re.I), [line for line in out.splitlines()
                                                               if re.search(r"insecure|trusts? any", line, re.I)]
    # The cluster's secrets were made next to the inventory, vault-encrypted.
    for name in ("constellation-mastersecret.json", "constellation-measurement-salt.json"):
        assert (example.inv / name).read_text().startswith("$ANSIBLE_VAULT;"), name
    # A second run changes nothing.
    again = example.play("site.yml")
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert all(r["changed"] == 0 for r in again.recap().values()), again.recap()


def test_a_stranger_learns_state_and_role_only_from_the_example_cluster(example):
    settings = settings_from_args({"measurements_file": str(example.inv / "measurements.json"),
                                   "ek_ca_path": str(example.inv / "ek_ca.pem"), "netns": example.lab.bridge_netns,
                                   "timeout": 10.0, "attestation_timeout": 30.0})
    for name in ("h1", "h2"):
        with open_peer(example.lab.host(name).public_endpoint, settings) as client:  # attested, no admin key
            state = client.get_state()
        assert state["state"] in ("ActivatingNodes", "IsNode"), state
        assert not state.get("vpn_pub_key") and not state.get("state_disk_uuid") and not state.get("evicted"), state
