# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An agent upgrade from the previous release: playbooks/upgrade_agent.yml on real agents (swtpm,
wireguard-go, namespaces), lab ``tupa``: 4 hosts, 1 Coordinator, file store, the default variant.

The previous release (tests/support/release.py: the newest ``v*`` tag, or CONSTELLATION_PREVIOUS_RELEASE) is
exported with ``git archive``; its agent is installed on every host (the lab's installed copy, which runs its own
code only), and its site.yml builds the cluster with its own collection. Then the controller moves to HEAD, and
the next release is HEAD's agent with one line changed: its archive and the signed upgrade document (both agents,
then the new one alone) are made here. ``--check`` predicts and changes nothing; retiring early is refused,
naming the peers; the roll runs with continuous pings over the mesh: nobody is evicted, the pairs that do not
involve the rebooting host keep answering, every host keeps its VPN IP, WireGuard key and disk key, is
re-attested under the new agent and runs the new code; the old agent is retired, verify.yml passes with the new
document, and a second run changes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lab.agent import CODE_DIR, agent_dir, installed_agent, start_agent
from lab.image import LAB_IMAGE, lab_measurements
from lab.lab import Lab
from tests.support import ROOT, VENV_BIN
from tests.support.cluster import LabCluster
from tests.support.pings import pinged, silent_pairs, windows
from tests.support.playbook import run_playbook
from tests.support.release import (NEXT_FILE, NEXT_LINE, agent_archive, export, next_release, previous_release,
                                   upgrade_documents)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.agent_measurement import (
    AgentMeasurement, code_digest)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import parse_policy
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.admin_key import load_priv_key

pytestmark = pytest.mark.lab

HOSTS = ("h1", "h2", "h3", "h4")
REBOOT_TASK = "Reboot with the environment's command (on the controller)"


class Upgrade(LabCluster):
    """The admin's side: its client accepts both agents (policy set once the documents exist)."""

    def __init__(self, lab: Lab, inv: Path, prev: Path, nxt: Path):
        super().__init__(lab)
        self.inv, self.prev, self.next = inv, prev, nxt

    def measured(self, name: str) -> dict:
        """The agent's last measurement of itself (its log's agent_measured)."""
        return self.events(name, "agent_measured")[-1]

    def document(self, name: str, document: dict) -> str:
        path = self.inv / ("%s.json" % name)
        path.write_text(json.dumps(document, indent=2) + "\n")
        self.lab.sign_measurements(path)
        return str(path)

    def run(self, playbook: Path, *args: str, env=None, cwd=None):
        return run_playbook(playbook, str(self.inv / "hosts.yml"), self.inv.parent / "tupa-runs",
                            ["--vault-password-file", str(self.inv / "vault_pass"),
                             "-e", "ansible_python_interpreter=%s" % (VENV_BIN / "python")] + list(args),
                            env=env, cwd=cwd, timeout=900)

    def upgrade(self, *args: str):
        reboot = "env PYTHONPATH=%s:%s %s -m lab --name tupa reboot {{ inventory_hostname }}" % (
            ROOT, ROOT / "collections", VENV_BIN / "python")
        return self.run(ROOT / "playbooks" / "upgrade_agent.yml",
                        "-e", "constellation_upgrade_measurements_file=%s" % self.upgrade_doc,
                        "-e", "constellation_retire_measurements_file=%s" % self.retire_doc,
                        "-e", "constellation_upgrade_agent=next",
                        "-e", "constellation_agent_archive=%s" % self.archive,
                        "-e", "constellation_agent_archive_sha256=%s" % self.archive_sha256,
                        "-e", "constellation_upgrade_wait_timeout=120",
                        "-e", "constellation_upgrade_reboot_command='%s'" % reboot, *args)

    def installed(self, name: str) -> str:
        """Which release's code is installed on the host: "next" (the changed line is there) or "previous"."""
        changed = installed_agent(self.hosts[name]) / CODE_DIR / NEXT_FILE
        return "next" if changed.read_text().endswith(NEXT_LINE) else "previous"


@pytest.fixture(scope="module")
def upgrade(tmp_path_factory):
    base = tmp_path_factory.mktemp("tupa")
    prev = export(previous_release(), base / "previous")
    nxt = next_release(base / "next")
    inv = base / "inventory"
    lab = Lab("tupa", inventory_dir=inv)
    made = None
    try:
        lab.up(hosts=4, tpm=True)
        made = Upgrade(lab, inv, prev, nxt)
        for name in HOSTS:  # the previous release's agent, installed; re-attestation every second
            lab.install_agent(name, prev)
            made.procs[name] = start_agent(lab, made.hosts[name], trust=True, reattest_interval=1,
                                           reattest_unreachable_limit=60)
        # The previous release's site.yml with its own collection (its ansible.cfg: collections next to it).
        site = made.run(prev / "site.yml", env={"ANSIBLE_CONFIG": str(prev / "ansible.cfg"),
                                                "ANSIBLE_COLLECTIONS_PATH": str(prev / "collections")}, cwd=prev)
        assert site.ok, site.stdout[-5000:]
        made.admin_key = load_priv_key((inv / "admin_key").read_bytes())  # the one site.yml gave the Coordinator
        config = bytes.fromhex(made.measured("h1")["agent_config"])
        old = AgentMeasurement(code_digest(str(prev / "plugins" / "module_utils")), config)
        new = AgentMeasurement(code_digest(str(nxt / "plugins" / "module_utils")), config)
        made.values = {"previous": old.value.hex(), "next": new.value.hex()}
        # The document in force after site.yml (a release whose first run lists its agent raised its version),
        # then the upgrade's: the running agent and the next one; then the next one alone.
        in_force = json.loads((inv / "measurements.json").read_text())
        made.running, both, retire = upgrade_documents(in_force, old.to_dict(), new.to_dict(), lab_measurements(LAB_IMAGE))
        made.upgrade_doc = made.document("upgrade", both)
        made.retire_version = retire["version"]
        made.retire_doc = made.document("retire", retire)
        made.policy = parse_policy(both)
        made.archive = base / "agent-next.tar.gz"
        made.archive_sha256 = agent_archive(nxt / "plugins" / "module_utils", made.archive)
        yield made
    finally:
        try:
            if made is not None:
                made.close()
        finally:
            lab.down()


def test_every_host_runs_the_installed_previous_release(upgrade):
    """The installed copy runs its own code only: what each agent measured is the previous release's code."""
    prev = code_digest(str(upgrade.prev / "plugins" / "module_utils")).hex()
    for name in HOSTS:
        assert upgrade.measured(name)["agent_code"] == prev
        assert upgrade.measured(name)["value"] == upgrade.values["previous"]


def test_bad_inputs_are_refused_before_anything_changes(upgrade):
    run = upgrade.upgrade("-e", "constellation_agent_archive_sha256=%s" % ("0" * 64))
    assert not run.ok and "SHA-256 mismatch, expected %s" % ("0" * 64) in run.stdout, run.stdout[-3000:]
    run = upgrade.upgrade("-e", "constellation_upgrade_agent=unlisted")
    assert not run.ok and "expected an agent named unlisted" in run.stdout, run.stdout[-3000:]
    # The next release's archive, but the document's entry of the running agent named as the new one.
    run = upgrade.upgrade("-e", "constellation_upgrade_agent=%s" % upgrade.running[0])
    assert not run.ok and "accepts %s as %s (another agent" % (upgrade.values["previous"], upgrade.running[0]) in run.stdout, \
        run.stdout[-3000:]
    assert [upgrade.installed(n) for n in HOSTS] == ["previous"] * 4


def test_the_playbook_rolls_every_host_onto_the_next_agent_without_downtime(upgrade):
    before = upgrade.snapshot(*HOSTS)
    vpn_ips = {name: before[name][0] for name in HOSTS}
    prev_code = code_digest(str(upgrade.prev / "plugins" / "module_utils"))
    next_code = code_digest(str(upgrade.next / "plugins" / "module_utils"))

    check = upgrade.upgrade("--check")
    assert check.ok, check.stdout[-5000:]
    assert check.results("h1")["Give the Coordinator the accepted agents (SetMeasurements)"]["changed"] is True
    for name in HOSTS:
        assert check.results(name)["Report the host's agent"]["msg"].endswith("would get next and reboot")
    # Retiring the running agent now: refused by the Coordinator, naming every peer (reported in check mode).
    refused = check.results("h1")["Report what was retired"]["msg"]
    assert refused.startswith("refused now") and all(vpn_ips[n] in refused for n in HOSTS), refused
    assert [upgrade.installed(n) for n in HOSTS] == ["previous"] * 4  # nothing installed
    assert all(upgrade.measured(n)["value"] == upgrade.values["previous"] for n in HOSTS)  # nothing rebooted

    run, replies = pinged(upgrade, vpn_ips, upgrade.upgrade)
    assert run.ok, run.stdout[-5000:]
    reboots = windows(run, REBOOT_TASK)
    assert sorted(reboots) == sorted(HOSTS), reboots
    # The Nodes first, the Coordinator last.
    assert max(reboots, key=lambda n: reboots[n][0]) == "h1"

    assert upgrade.state("h1")["evicted"] == []  # nobody was evicted during the roll
    assert upgrade.snapshot(*HOSTS) == before  # VPN IPs, WireGuard keys and disk keys kept
    assert silent_pairs(replies, reboots) == []  # the pairs without the rebooting host kept answering
    for name in HOSTS:  # the next release's code installed and running, measured after a reboot
        assert upgrade.installed(name) == "next"
        marker = installed_agent(upgrade.hosts[name]) / CODE_DIR / ".archive-sha256"
        assert marker.read_text().strip() == upgrade.archive_sha256
        measured = upgrade.measured(name)
        assert measured["agent_code"] == next_code.hex() != prev_code.hex() and measured["outcome"] == "measured", measured
        assert measured["value"] == upgrade.values["next"]
        policy = json.loads((agent_dir(upgrade.hosts[name]) / "measurements.json").read_text())
        assert list(policy["agents"]) == ["next"] and policy["version"] == upgrade.retire_version  # retired everywhere

    verify = upgrade.run(ROOT / "playbooks" / "verify.yml", "-e", "constellation_measurements_file=%s" % upgrade.retire_doc)
    assert verify.ok, verify.stdout[-5000:]

    again = upgrade.upgrade()
    assert again.ok and again.changed() == 0, again.stdout[-3000:]
