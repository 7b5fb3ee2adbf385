# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cluster's secrets on a lab (real agents, swtpm): a missing init secret file is named with its fix before
anything is made or sent; an activation the Coordinator refuses (the proof of another init secret) writes neither
the master secret nor the salt and changes nothing; with the admin key vault-encrypted, and then
passphrase-protected with its passphrase in a `!vault` variable, site.yml activates the cluster, verify.yml passes
and a second run changes nothing. The tests run in file order and share the lab."""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible.parsing.vault import VaultLib, VaultSecret, is_encrypted

from lab.lab import Lab
from tests.support import ROOT, VENV_BIN
from tests.support.playbook import PlayRun, run_playbook

pytestmark = pytest.mark.lab

AGENT_ENTRY = "The measurements document lists this collection's agent (on the controller)"
SECRETS = ("constellation-mastersecret.json", "constellation-measurement-salt.json")


class Cluster:
    def __init__(self, lab: Lab, inv: Path):
        self.lab, self.inv = lab, inv

    def play(self, playbook: str, *extra: str) -> PlayRun:
        args = ["--vault-password-file", str(self.inv / "vault_pass"),
                "-e", "ansible_python_interpreter=%s" % (VENV_BIN / "python")] + list(extra)
        return run_playbook(ROOT / playbook, str(self.inv / "hosts.yml"), self.inv.parent / "sc-runs", args)

    def vault(self) -> VaultLib:
        return VaultLib([("default", VaultSecret((self.inv / "vault_pass").read_text().strip().encode()))])

    def secret_files(self):
        return sorted(name for name in SECRETS if (self.inv / name).exists())

    def state(self, name: str) -> str:
        from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import settings_from_args
        from ansible_collections.constellation.cluster.plugins.plugin_utils.controller import peer_report

        settings = settings_from_args({"measurements_file": str(self.inv / "measurements.json"),
                                       "variant": self.lab.variant, "ek_ca_path": str(self.inv / "ek_ca.pem"),
                                       "netns": self.lab.bridge_netns, "timeout": 10.0, "attestation_timeout": 30.0})
        return peer_report(self.lab.host(name).public_endpoint, settings, None).state


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    inv = tmp_path_factory.mktemp("sc-inventory")
    lab = Lab("sc", inventory_dir=inv)
    lab.up(hosts=2, tpm=True, agents=True)
    try:
        yield Cluster(lab, inv)
    finally:
        lab.down()


def changed_tasks(run: PlayRun, host: str):
    return sorted(name for name, res in run.results(host).items() if res.get("changed") and name != AGENT_ENTRY)


def test_a_missing_init_secret_file_is_named_with_its_fix(cluster):
    missing = str(cluster.inv / "no_init_secret")
    run = cluster.play("site.yml", "-e", "constellation_init_secret_file=%s" % missing)
    assert not run.ok
    assert "constellation_init_secret_file: %s does not exist" % missing in run.stdout, run.stdout[-3000:]
    assert "playbooks/secrets.yml" in run.stdout
    assert cluster.secret_files() == [] and changed_tasks(run, "h1") == []
    assert cluster.state("h1") == "AcceptingInit"


def test_a_refused_activation_writes_neither_master_secret_nor_salt(cluster):
    other = cluster.inv / "other_init_secret"
    other.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")  # not the one the agents were given
    run = cluster.play("site.yml", "-e", "constellation_init_secret_file=%s" % other)
    assert not run.ok
    assert "init secret" in run.stdout and "init_secret_hash" in run.stdout, run.stdout[-3000:]
    assert cluster.secret_files() == []  # nothing written
    assert changed_tasks(run, "h1") == [] and run.counts("h2")["changed"] == 0
    assert cluster.state("h1") == "AcceptingInit"


def test_a_vaulted_then_passphrase_protected_admin_key_runs_the_cluster(cluster):
    from cryptography.hazmat.primitives import serialization

    from ansible_collections.constellation.cluster.plugins.module_utils.rpc.admin_key import load_priv_key

    key_file = Path(yaml.safe_load((cluster.inv / "group_vars" / "all" / "lab.yml").read_text())
                    ["constellation_admin_priv_key_file"])
    plain = key_file.read_bytes()
    subprocess.run([str(VENV_BIN / "ansible-vault"), "encrypt", "--vault-password-file",
                    str(cluster.inv / "vault_pass"), str(key_file)], check=True, capture_output=True, timeout=60)
    assert is_encrypted(key_file.read_bytes())
    run = cluster.play("site.yml")
    assert run.ok, run.stdout[-4000:]
    for name in SECRETS:  # written once the Coordinator accepted them, vault-encrypted
        assert is_encrypted((cluster.inv / name).read_bytes()), name
    assert cluster.state("h1") == "ActivatingNodes" and cluster.state("h2") == "IsNode"
    again = cluster.play("site.yml")
    assert again.ok and sum(row["changed"] for row in again.recap().values()) == 0, again.recap()

    # The same key passphrase-protected, its passphrase a `!vault` variable: the atls connection and the actions.
    key_file.write_bytes(load_priv_key(plain).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pp")))
    passphrase = cluster.vault().encrypt(b"pp").decode()
    (cluster.inv / "group_vars" / "all" / "passphrase.yml").write_text(
        "constellation_admin_key_passphrase: !vault |\n" + "".join("  %s\n" % line for line in passphrase.splitlines()))
    verify = cluster.play("playbooks/verify.yml")
    assert verify.ok, verify.stdout[-4000:]
    again = cluster.play("site.yml")
    assert again.ok and sum(row["changed"] for row in again.recap().values()) == 0, again.stdout[-3000:]
