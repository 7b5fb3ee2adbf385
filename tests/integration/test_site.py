# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""site.yml, add_nodes.yml and verify.yml end to end on one lab (real agents, swtpm, wireguard-go).

Hosts h1-h4 form the cluster (h1 the Coordinator); h5 booted a modified image (its PCR 9 differs
from the policy); h6 boots later and is added with add_nodes.yml; h7 boots last with a TPM from
another vendor (its EK certificate does not chain to the lab CA). The lab attests with its default
variant, qemu-vtpm-ek; h1's agent runs on /usr/bin/python3 with Debian 12's packages only (as the
node_agent role installs it). The tests run in file order and share the lab: the tampered run comes first,
while the Coordinator is still fresh.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from ansible.parsing.vault import VaultLib, VaultSecret

from lab.image import lab_measurements
from lab.lab import Lab
from tests.support import ROOT
from tests.support.playbook import PlayRun, run_playbook
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose, signature
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.agent_measurement import AgentMeasurement
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import settings_from_args
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.admin_key import load_priv_key
from ansible_collections.constellation.cluster.plugins.plugin_utils.controller import open_peer, peer_report
from ansible_collections.constellation.cluster.plugins.module_utils.kms import MasterSecret

pytestmark = pytest.mark.lab

VENV_BIN = ROOT / ".venv" / "bin"
CLUSTER = "!h5"  # every run but the tampered one leaves h5 out (--limit)
# Step 6's mesh check (playbooks/tasks/verify_peer.yml): one command per peer waits for its WireGuard
# peers, pings them and reads the handshakes.
MESH_TASK = "Wait until the peer's WireGuard lists every other peer, then ping each over the VPN and read the handshakes"
COORDINATOR_VPN_CHECK = "The Coordinator's WireGuard interface carries its VPN IP"
NODE_VPN_CHECK = "The node's WireGuard interface carries its VPN IP"
AGENT_ENTRY = "The measurements document lists this collection's agent (on the controller)"
GIVE_DOCUMENT = "Give the Coordinator the measurements document that lists this collection's agent (SetMeasurements)"
ACTIVATE_COORDINATOR = "Activate the Coordinator (ActivateAsCoordinator over aTLS; nothing if it already is ours)"


class Site:
    def __init__(self, lab: Lab, inv: Path):
        self.lab = lab
        self.inv = inv
        self.hosts_file = inv / "hosts.yml"
        self.vault_pass = inv / "vault_pass"

    def play(self, playbook: str, *extra: str, limit: str = CLUSTER) -> PlayRun:
        args = ["--vault-password-file", str(self.vault_pass), "-e", "ansible_python_interpreter=%s" % (VENV_BIN / "python")]
        return run_playbook(ROOT / playbook, str(self.hosts_file), self.inv.parent / ("%s-runs" % self.inv.name),
                            args + list(extra) + (["--limit", limit] if limit else []))

    def status(self, name: str, cluster_id=None):
        settings = settings_from_args({"measurements_file": str(self.inv / "measurements.json"),
                                       "variant": self.lab.variant, "ek_ca_path": str(self.inv / "ek_ca.pem"),
                                       "netns": self.lab.bridge_netns, "timeout": 10.0, "attestation_timeout": 30.0})
        key_file = self.inv / "admin_key"  # GetState's details (VPN IP and key) only after AdminAuth
        admin_key = load_priv_key(key_file.read_bytes()) if key_file.exists() else None
        return peer_report(self.lab.host(name).public_endpoint, settings, cluster_id, admin_key)

    def secrets(self):
        vault = VaultLib([("default", VaultSecret(self.vault_pass.read_text().strip().encode()))])
        master = MasterSecret.from_json(vault.decrypt((self.inv / "constellation-mastersecret.json").read_bytes()))
        salt_doc = json.loads(vault.decrypt((self.inv / "constellation-measurement-salt.json").read_bytes()))
        return master, base64.b64decode(salt_doc["measurementSalt"])


def wg_peers(lab: Lab, name: str):
    out = lab.host(name).run(["wg", "show", "wg0", "peers"], check=False).stdout
    return set(out.split())


def tasks_run(output: str):
    """The names of the tasks that ran (TASK [role : name] headers), in order."""
    return [m.group(1).split(" : ", 1)[-1] for m in re.finditer(r"^TASK \[(.+?)\] \**$", output, re.M)]


def task_hosts(output: str, task: str):
    """The hosts a task reported ok/changed for (from the lines under its TASK header)."""
    hosts = set()
    for block in re.split(r"^TASK \[", output, flags=re.M)[1:]:
        name, _sep, body = block.partition("]")
        if name.split(" : ", 1)[-1] == task:
            hosts |= set(re.findall(r"^(?:ok|changed): \[([^\]\s]+)", body, re.M))
    return hosts


def image_pcrs(document: dict) -> dict:
    """The image's PCRs of the lab's document: site.yml's first run turned its plain form into the named form (the
    set ``default``) when it listed the agent."""
    return document["accepted"]["default"] if "accepted" in document else document


def secret_files(inv: Path):
    return sorted(p.name for p in inv.glob("constellation-*.json"))


def forbidden_strings(site):
    """Every spelling of the cluster's secrets (KMS URI, master key and salt, measurement salt)."""
    master, salt = site.secrets()
    forbidden = {master.to_uri(), master.key.hex(), master.salt.hex(), salt.hex()}
    for raw in (master.key, master.salt, salt):
        forbidden |= {base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode(),
                      base64.b64encode(raw).decode().rstrip("=")}
    return forbidden


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    inv = tmp_path_factory.mktemp("site-inventory")
    lab = Lab("tsite", inventory_dir=inv)
    lab.up(hosts=5, tpm=True, agents=True)
    lab.tamper("h5")
    try:
        start_on_debians_python(lab, DEBIAN_HOST)
        yield Site(lab, inv)
    finally:
        lab.down()


# The Coordinator's agent runs on /usr/bin/python3 with only Debian 12's packages (python3-cryptography 38,
# python3-tpm2-pytss 1.2, ...: what the node_agent role installs): it issues the default variant's
# certificates to the controller and verifies every Node's on that cryptography.
DEBIAN_HOST = "h1"
SYSTEM_PYTHON = "/usr/bin/python3"


def start_on_debians_python(lab: Lab, name: str) -> None:
    """Restarts the agent of ``name`` (not activated yet) on Debian's Python, as test_verify_service.py does."""
    from lab.agent import start_agent
    from tests.support.wait import until as wait_until

    host = lab.host(name)
    for pid in lab._agent_pids(host):  # pylint: disable=protected-access
        os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not lab._agent_pids(host), what="%s's agent stops" % name)  # pylint: disable=protected-access
    lab.host_python = lambda: [SYSTEM_PYTHON]
    try:
        start_agent(lab, host)
    finally:
        del lab.host_python


def test_tampered_host_stops_the_run_before_any_secret(site):
    proc = site.play("site.yml", limit="")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    # Step 1 refused h5, naming the PCR, and nothing later ran.
    assert re.search(r"h5.*attestation refused.*PCR 9", out, re.S)
    assert "activate the Coordinator" not in out.split("PLAY RECAP")[0].split("Step 1")[-1]
    assert not (site.inv / "constellation-mastersecret.json").exists()
    rows = proc.recap()  # h5 fails alone (docs/site.md, "When a peer is refused"); nothing changed anywhere
    assert rows["h5"]["failed"] == 1 and all(rows[h]["changed"] == 0 for h in rows), rows
    assert all(rows[h]["failed"] == 0 for h in ("h1", "h2", "h3", "h4")), rows
    said = " ".join(out.split())  # the yaml callback folds long messages
    assert "refused or unreachable: h5 (1 of 5 hosts" in said and "the run stops here" in said
    for name in ("h1", "h2"):
        status = site.status(name)
        assert status.state == "AcceptingInit"
        assert status.membership == "fresh"


def test_check_mode_on_a_fresh_cluster_predicts_and_writes_nothing(site):
    """site.yml --check --diff before the first run: every peer is attested, the Coordinator and each
    node are predicted to be activated, and nothing is written or sent (no secret file exists, so
    none can have been sent; every peer is still fresh)."""
    proc = site.play("site.yml", "--check", "--diff")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert secret_files(site.inv) == []
    rows = proc.recap()
    assert set(rows) == {"h1", "h2", "h3", "h4"}
    assert all(r["failed"] == 0 and r["unreachable"] == 0 for r in rows.values())
    # Every peer was attested in check mode too (steps 1 and 6): each is reported from its attested state.
    for name in ("h1", "h2", "h3", "h4"):
        assert "%s: AcceptingInit (PCR 15 fresh): would be activated, then verified" % name in out, name
    assert "Coordinator %s would be activated" % site.lab.host("h1").public_endpoint in out
    # Would list the agent in the measurements document, would activate (making the master secret and the salt
    # with the activation, written only once it succeeded).
    assert rows["h1"]["changed"] == 2
    assert "agents" not in json.loads((site.inv / "measurements.json").read_text())  # predicted, not written
    for name in ("h2", "h3", "h4"):
        assert "%s: would be activated by the Coordinator (check mode: nothing sent)" % name in out
        assert rows[name]["changed"] == 1, (name, rows[name])  # its own predicted activation, credited to it
    assert "RETRYING" not in out
    for name in ("h1", "h2", "h3", "h4"):
        status = site.status(name)
        assert (status.state, status.membership) == ("AcceptingInit", "fresh"), name

    # add_nodes.yml needs an activated Coordinator: in check mode too it says so, and writes nothing.
    proc = site.play("playbooks/add_nodes.yml", "--check")
    assert proc.returncode != 0
    assert "is not activated yet, run site.yml first" in proc.stdout, proc.stdout[-3000:]
    assert secret_files(site.inv) == []
    assert site.status("h1").state == "AcceptingInit"


def test_first_run_activates_everything_and_leaks_nothing(site):
    proc = site.play("site.yml", "-vvv")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    rows = proc.recap()
    assert set(rows) == {"h1", "h2", "h3", "h4"}
    assert all(r["failed"] == 0 and r["unreachable"] == 0 for r in rows.values())
    assert rows["h1"]["changed"] >= 1  # the activation, which wrote the master secret and the salt
    assert secret_files(site.inv) == ["constellation-mastersecret.json", "constellation-measurement-salt.json"]
    for name in ("h2", "h3", "h4"):  # one line per node, the activation credited to it, then its pod network
        assert re.search(r"%s: activated by the Coordinator \(VPN IP 10\.118\.[0-9.]+\)" % name, out), name
        assert rows[name]["changed"] == 2, (name, rows[name])
    # The lab's inventory turns Kubernetes off (constellation_kubernetes: false): no kubeadm role ran.
    assert "kubeadm_control_plane :" not in out and "kubeadm_worker :" not in out

    master, salt = site.secrets()
    uri = master.to_uri()
    forbidden = forbidden_strings(site)
    leaked = sorted(s[:8] + "..." for s in forbidden if s in out or s.lower() in out.lower())
    assert not leaked, "secrets in the -vvv output: %s" % leaked

    cluster_id = base64.b64decode(re.search(r"cluster ID ([A-Za-z0-9+/=]{44})", out).group(1))
    from ansible_collections.constellation.cluster.plugins.module_utils.kms import open_kms
    assert cluster_id == open_kms(uri).cluster_id(salt)
    states = {name: site.status(name, cluster_id) for name in ("h1", "h2", "h3", "h4")}
    assert states["h1"].state == "ActivatingNodes" and states["h1"].role == "coordinator"
    for name in ("h2", "h3", "h4"):
        assert states[name].state == "IsNode" and states[name].role == "node"
    assert {s.membership for s in states.values()} == {"ours"}

    # The lab's inventory names its signing key: the document lists the running agent under the collection's
    # version, signed with the lab's key, and the Coordinator took it (every agent fetches it from there).
    pub = signature.load_public_key_file(str(site.inv / "measurements.pub"))
    document = json.loads(signature.read_signed_file(str(site.inv / "measurements.json"), pub))
    version = yaml.safe_load((ROOT / "galaxy.yml").read_text())["version"]
    trust = choose.load_trust(site.lab.variant, str(site.lab.ek_ca_path), insecure_trust_any_ak=True)
    assert document["agents"] == {version: AgentMeasurement.of(site.lab.variant, trust.ek_ca_certs).to_dict()}
    assert document["version"] == 1 and document["accepted"] == {"default": lab_measurements(site.lab.state.image)}
    assert proc.results("h1")[AGENT_ENTRY]["changed"] is True
    assert proc.results("h1")[GIVE_DOCUMENT]["changed"] is True


def test_vpn_mesh_carries_traffic(site):
    vpn_ips = {}
    for name in ("h1", "h2", "h3", "h4"):
        out = site.lab.host(name).run(["ip", "-o", "-4", "addr", "show", "dev", "wg0"]).stdout
        vpn_ips[name] = re.search(r"inet (10\.118\.[0-9.]+)/", out).group(1)
    assert vpn_ips["h1"] == "10.118.0.1"
    for src, dst in (("h2", "h1"), ("h3", "h4"), ("h4", "h2"), ("h1", "h3")):
        ping = site.lab.host(src).run(["ping", "-c", "1", "-W", "3", vpn_ips[dst]], check=False)
        assert ping.returncode == 0, "%s -> %s: %s" % (src, dst, ping.stdout + ping.stderr)


def test_second_run_changes_nothing(site):
    proc = site.play("site.yml")
    assert proc.returncode == 0, proc.stdout[-3000:]
    rows = proc.recap()
    assert set(rows) == {"h1", "h2", "h3", "h4"}
    assert sum(r["changed"] for r in rows.values()) == 0
    assert proc.results("h1")[AGENT_ENTRY]["changed"] is False  # listed already
    assert proc.results("h1")[GIVE_DOCUMENT]["skipped"] is True  # in force already
    assert "already activated" in proc.stdout
    # Nothing is left for the roles after the activations (step 6 reads the interfaces, Kubernetes is
    # not managed): each ends there instead of skipping every later task on every host.
    ran = tasks_run(proc.stdout)
    for task in (COORDINATOR_VPN_CHECK, NODE_VPN_CHECK, "Kubernetes control plane", "Kubernetes worker"):
        assert task not in ran, task
    assert MESH_TASK in ran


def test_check_mode_on_the_converged_cluster_changes_nothing(site):
    """--check --diff on a converged cluster: exit 0, changed=0, no waiting (the read-only commands
    run in check mode; the mesh is there); the secret files are left as they are."""
    before = {p.name: p.read_bytes() for p in site.inv.glob("constellation-*.json")}
    for playbook, extra in (("site.yml", ("--check", "--diff")), ("playbooks/add_nodes.yml", ("--check",))):
        proc = site.play(playbook, *extra)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, (playbook, out[-4000:])
        rows = proc.recap()
        assert set(rows) == {"h1", "h2", "h3", "h4"}, playbook
        assert sum(r["changed"] for r in rows.values()) == 0, (playbook, rows)
        assert "RETRYING" not in out, playbook
        assert "already activated" in out, playbook
        for name in ("h2", "h3", "h4"):
            assert re.search(r"%s: already active \(VPN IP 10\.118\." % name, out), (playbook, name)
        assert MESH_TASK in tasks_run(proc.stdout)
    assert {p.name: p.read_bytes() for p in site.inv.glob("constellation-*.json")} == before


def test_tags_select_the_steps(site):
    """--tags verify only verifies (it still derives the cluster ID, read-only, to check PCR 15);
    --tags attest only attests; --tags wireguard checks the WireGuard addresses and the mesh."""
    proc = site.play("site.yml", "--tags", "verify")
    assert proc.returncode == 0, proc.stdout[-3000:]
    ran = tasks_run(proc.stdout)
    assert "The peer passed every check" in ran
    assert MESH_TASK in ran
    for step in ("Master secret on the controller (made once, Ansible Vault)",
                 "The Coordinator activates the fresh nodes and further Coordinators (ActivateAdditionalNodes)",
                 COORDINATOR_VPN_CHECK):
        assert step not in ran, step
    assert sum(r["changed"] for r in proc.recap().values()) == 0

    proc = site.play("site.yml", "--tags", "attest")
    assert proc.returncode == 0, proc.stdout[-3000:]
    # (tasks tagged `always` print their header, skipped: the role's argument validation, the
    # Coordinator's facts when no step after step 1 is selected)
    ran = [t for t in tasks_run(proc.stdout) if not t.startswith("Validating arguments") and task_hosts(proc.stdout, t)]
    # Step 1 also keeps the agent in the measurements document (on the controller; listed already: no change).
    assert set(ran) == {"Pre-flight - every address of this host is set (none still says CHANGE-ME)",
                        "Attest the peer and read its state",
                        "The run goes on without the refused or unreachable peers, or stops here "
                        "(constellation_max_fail_percentage)",
                        AGENT_ENTRY}

    # --tags wireguard: step 6 reads every peer's interface (its VPN IP, then the mesh); the roles'
    # own interface checks are off where step 6 follows.
    proc = site.play("site.yml", "--tags", "wireguard")
    assert proc.returncode == 0, proc.stdout[-3000:]
    ran = tasks_run(proc.stdout)
    assert MESH_TASK in ran
    assert task_hosts(proc.stdout, "The peer passed every check") == {"h1", "h2", "h3", "h4"}
    assert "The Coordinator activates the fresh nodes and further Coordinators (ActivateAdditionalNodes)" not in ran
    assert not task_hosts(proc.stdout, COORDINATOR_VPN_CHECK) and not task_hosts(proc.stdout, NODE_VPN_CHECK)
    assert sum(r["changed"] for r in proc.recap().values()) == 0
    # Skipping a later step never skips the Coordinator's activation and facts the others need.
    for skipped in ("kubernetes", "verify", "wireguard", "nodes"):
        proc = site.play("site.yml", "--skip-tags", skipped)
        assert proc.returncode == 0, (skipped, proc.stdout[-3000:])
        assert task_hosts(proc.stdout, ACTIVATE_COORDINATOR) == {"h1"}, skipped
        assert sum(r["changed"] for r in proc.recap().values()) == 0, skipped
    # Without step 6 the roles check the interfaces themselves.
    proc = site.play("site.yml", "--tags", "coordinator,nodes")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert MESH_TASK not in tasks_run(proc.stdout)
    assert task_hosts(proc.stdout, COORDINATOR_VPN_CHECK) == {"h1"}
    assert task_hosts(proc.stdout, NODE_VPN_CHECK) == {"h2", "h3", "h4"}


def test_module_defaults_group_reaches_the_action_plugins(site, tmp_path):
    """meta/runtime.yml's action group: module_defaults for group/constellation.cluster.attestation
    set the shared options of the action plugins (a wrong policy there makes them refuse; an
    option given on the task wins over the group's)."""
    wrong = json.loads((site.inv / "measurements.json").read_text())
    image_pcrs(wrong)["9"]["expected"] = "00" * 32
    (tmp_path / "wrong.json").write_text(json.dumps(wrong))
    playbook = tmp_path / "defaults.yml"
    playbook.write_text("""
- name: module_defaults group
  hosts: h1
  gather_facts: false
  module_defaults:
    group/constellation.cluster.attestation:
      measurements_file: %(wrong)s
      variant: qemu-vtpm-ek
      ek_ca_path: %(inv)s/ek_ca.pem
      netns: %(netns)s
  tasks:
    - name: agent_state with the group's (wrong) policy
      constellation.cluster.agent_state:
        endpoint: "{{ constellation_public_endpoint }}"
      register: refused
      ignore_errors: true
    - name: verify_attestation with the group's options and its own policy
      constellation.cluster.verify_attestation:
        endpoint: "{{ constellation_public_endpoint }}"
        measurements_file: %(inv)s/measurements.json
    - name: The group reached the action plugins
      ansible.builtin.assert:
        that:
          - refused is failed
          - "'PCR 9' in refused.msg"
""" % {"wrong": tmp_path / "wrong.json", "inv": site.inv, "netns": site.lab.bridge_netns})
    proc = run_playbook(playbook, str(site.hosts_file), tmp_path / "runs",
                        ["-e", "ansible_python_interpreter=%s" % (VENV_BIN / "python")], timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert proc.recap()["h1"]["failed"] == 0


def test_kubernetes_on_without_kubeadm_fails_naming_the_host(site):
    """No silent green without Kubernetes: with it on and no kubeadm on the hosts the run fails,
    naming the host and what is missing."""
    proc = site.play("site.yml", "-e", '{"constellation_kubernetes": true}')
    assert proc.returncode != 0
    assert "host h1: no kubeadm (kubeadm on PATH not found)" in proc.stdout
    rows = proc.recap()
    assert rows["h1"]["failed"] == 1


def test_ansible_runner_event_stream_and_stats(site):
    runner = site.play("site.yml")  # through ansible-runner (tests/support/playbook.py)
    assert runner.status == "successful", runner.stdout[-3000:]
    assert runner.rc == 0
    oks = [e["event_data"] for e in runner.events if e["event"] == "runner_on_ok"]
    activation = [e for e in oks if e.get("task", "").startswith("Activate the Coordinator")]
    assert [e["host"] for e in activation] == ["h1"]
    assert "censored" in activation[0]["res"]  # no_log: the result is hidden from the event stream too
    nodes = [e for e in oks if e.get("task", "").startswith("The Coordinator activates the fresh nodes")]
    assert len(nodes) == 1 and nodes[0]["res"]["changed"] is False
    assert not [e for e in runner.events if e["event"] in ("runner_on_failed", "runner_on_unreachable")]
    stats = runner.stats
    assert set(stats["ok"]) == {"h1", "h2", "h3", "h4"}
    assert stats["changed"] == {} and stats["failures"] == {} and stats["dark"] == {}


def test_add_nodes_joins_one_host_and_changes_nothing_else(site):
    before = {name: wg_peers(site.lab, name) for name in ("h1", "h2", "h3", "h4")}
    (new,) = site.lab.grow(6)
    assert new.name == "h6"
    # --check first: h6 alone would be activated; nothing is sent.
    proc = site.play("playbooks/add_nodes.yml", "--check")
    assert proc.returncode == 0, proc.stdout[-3000:]
    rows = proc.recap()
    assert {h: r["changed"] for h, r in rows.items()} == {"h1": 0, "h2": 0, "h3": 0, "h4": 0, "h6": 1}
    assert "h6: would be activated by the Coordinator (check mode: nothing sent)" in proc.stdout
    assert "RETRYING" not in proc.stdout
    assert (site.status("h6").state, site.status("h6").membership) == ("AcceptingInit", "fresh")

    proc = site.play("playbooks/add_nodes.yml")
    assert proc.returncode == 0, proc.stdout[-3000:]
    rows = proc.recap()
    assert set(rows) == {"h1", "h2", "h3", "h4", "h6"}
    # The one activation, credited to the node activated (one line per node), and its pod network; nothing else.
    assert {h: r["changed"] for h, r in rows.items()} == {"h1": 0, "h2": 0, "h3": 0, "h4": 0, "h6": 2}
    assert re.search(r"h6: activated by the Coordinator \(VPN IP 10\.118\.[0-9.]+\)", proc.stdout)
    for name in ("h2", "h3", "h4"):
        assert re.search(r"%s: already active \(VPN IP 10\.118\." % name, proc.stdout), name
    assert site.status("h6").state == "IsNode"
    new_key = new.run(["wg", "show", "wg0", "public-key"]).stdout.strip()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not all(new_key in wg_peers(site.lab, n) for n in before):
        time.sleep(0.2)
    for name, peers in before.items():
        after = wg_peers(site.lab, name)
        assert after == peers | {new_key}, name  # learnt h6; no other peer changed


def verify_with_reports(site, tmp_path, name="ci"):
    report_json, report_junit = tmp_path / name / "verify.json", tmp_path / name / "verify.xml"
    report_json.parent.mkdir()
    proc = site.play("playbooks/verify.yml", "-e", "verify_report_json=%s" % report_json,
                     "-e", "verify_report_junit=%s" % report_junit)
    return proc, report_json, report_junit


VERIFY_MESH_TASKS = (MESH_TASK,)


def test_verify_prints_one_table_and_writes_the_ci_reports(site, tmp_path):
    import xml.etree.ElementTree as ET

    proc, report_json, report_junit = verify_with_reports(site, tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    peers = ("h1", "h2", "h3", "h4", "h6")
    for name in peers:
        for pcr in ("4", "9", "11", "13"):  # 13: the agent's (docs/attestation.md)
            assert re.search(r"%s\s+\S+\s+%s\s+\S+\s+\S+\s+yes\s+ok\s+plain\s+host\s+trusted\s+-\s+-\s+(?:-|\S+/\d+\s+ok)\s+"
                             r"(ActivatingNodes|IsNode)\s+pcr15=ours" % (name, pcr), proc.stdout), (name, pcr)
    assert "every peer passed: attested, in its role's state, PCR 15 ours, the mesh complete" in proc.stdout
    # deployment_mode host: the table, and a warning per peer, say that host root is trusted there.
    assert "host root is trusted on this peer: " in proc.stdout and "[WARNING]" in proc.stdout
    # Every check ran on every peer: the mesh (WireGuard peers and allowed IPs, a ping and a recent
    # handshake per pair) and the verdict.
    for task in VERIFY_MESH_TASKS + ("Every check passed (a peer with problems fails, one line per problem)",):
        assert task_hosts(proc.stdout, task) == set(peers), task
    assert sum(r["changed"] for r in proc.recap().values()) == 0

    # JSON: one record per peer, with the per-PCR table.
    assert report_json.stat().st_mode & 0o777 == 0o644
    report = json.loads(report_json.read_text())
    assert report["passed"] is True
    records = {r["name"]: r for r in report["peers"]}
    assert set(records) == set(peers)
    policy = image_pcrs(json.loads((site.inv / "measurements.json").read_text()))
    trust = choose.load_trust(site.lab.variant, str(site.lab.ek_ca_path), insecure_trust_any_ak=True)
    agent_pcr = AgentMeasurement.of(site.lab.variant, trust.ek_ca_certs).value
    for name, record in records.items():
        assert record["endpoint"] == site.lab.host(name).public_endpoint
        assert record["attested"] is True and record["error"] is None
        assert record["problems"] == [] and record["passed"] is True, record["problems"]
        assert record["vpn_ip"] == vpn_ip(site.lab, name)
        assert record["membership"] == "ours"
        assert record["state"] == ("ActivatingNodes" if name == "h1" else "IsNode")
        # The image's PCRs as the policy file says, and the agent's PCR 13 as this collection measures it.
        assert {str(p["index"]) for p in record["pcrs"]} == set(policy) | {"13"}
        for pcr in record["pcrs"]:
            expected = agent_pcr.hex() if pcr["index"] == 13 else policy[str(pcr["index"])]["expected"]
            assert pcr["ok"] is True and pcr["expected"] == pcr["found"] == expected

    # JUnit: one testcase per peer, no failure.
    assert report_junit.stat().st_mode & 0o777 == 0o644
    suite = ET.parse(report_junit).getroot()
    cases = suite.findall(".//testcase")
    assert sorted(c.get("name") for c in cases) == sorted(peers)
    assert suite.get("tests") == "5" and suite.get("failures") == "0"
    assert not suite.findall(".//failure")

    # Neither holds a secret.
    text = report_json.read_text() + report_junit.read_text()
    assert not [s[:8] for s in forbidden_strings(site) if s in text or s.lower() in text.lower()]


def vpn_ip(lab: Lab, name: str):
    out = lab.host(name).run(["ip", "-o", "-4", "addr", "show", "dev", "wg0"]).stdout
    return re.search(r"inet (10\.118\.[0-9.]+)/", out).group(1)


def test_verify_fails_naming_each_broken_peer_and_what_is_wrong(site, tmp_path):
    """Two breakages verify.yml must not pass: h3's WireGuard loses its peer h2 (the agents re-apply
    peers only when the Coordinator's version changes, so the removal stays), and h4's agent stops
    (h4 cannot be attested). verify.yml fails naming each broken peer and what is wrong, in its
    output and in both reports; repaired (the peer re-added as it was, the agent started again), the
    cluster passes verify.yml again, so the tests after this one run on a healthy cluster."""
    import signal
    import xml.etree.ElementTree as ET

    from lab.agent import start_agent
    from tests.support.wait import until as wait_until

    h2_key = site.lab.host("h2").run(["wg", "show", "wg0", "public-key"]).stdout.strip()
    ips = {name: vpn_ip(site.lab, name) for name in ("h2", "h3")}
    # h3's entry for h2, to restore it as it was (the dump's first line is the interface's private key: skipped).
    entry = next(line.split("\t") for line in site.lab.host("h3").run(["wg", "show", "wg0", "dump"]).stdout.splitlines()[1:]
                 if line.startswith(h2_key + "\t"))
    endpoint, allowed_ips, keepalive = entry[2], entry[3], entry[7]
    # h2's VPN IP and its pod CIDR (activate_coordinator's default cluster_pod_cidr, docs/wireguard.md "Pod CIDRs").
    vpn, pods = sorted(allowed_ips.split(","))
    assert vpn == ips["h2"] + "/32" and re.fullmatch(r"10\.244\.[0-9]+\.0/24", pods), allowed_ips
    h4 = site.lab.host("h4")
    (agent_pid,) = site.lab._agent_pids(h4)  # pylint: disable=protected-access
    try:
        site.lab.host("h3").run(["wg", "set", "wg0", "peer", h2_key, "remove"])
        os.kill(agent_pid, signal.SIGTERM)
        wait_until(lambda: not site.lab._agent_pids(h4), what="h4's agent stops")  # pylint: disable=protected-access

        proc, report_json, report_junit = verify_with_reports(site, tmp_path, "broken")
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0
        expected = {
            "h3": "h3: no WireGuard peer h2 (key %s, VPN IP %s) on wg0" % (h2_key, ips["h2"]),
            "h2": "h2: no traffic to h3: ping %s over wg0 got no answer" % ips["h3"],
            "h4": "h4: not attested: cannot connect to %s" % h4.public_endpoint,
        }
        # The table marks each broken peer FAIL, then lists every problem, one line each.
        listing = re.search(r"^\s*(\d+) problems?:$(.*?)^TASK ", proc.stdout, re.M | re.S)
        assert listing, out[-4000:]
        lines = [line.strip() for line in listing.group(2).splitlines() if line.strip()]
        assert len(lines) == int(listing.group(1))
        assert {line.split(":")[0] for line in lines} == {"h2", "h3", "h4"}, lines
        for name, line in expected.items():
            assert any(problem.startswith(line) for problem in lines), (name, lines)
            assert re.search(r"^\s*%s\s.*\sFAIL\s" % name, proc.stdout, re.M), name
        assert re.search(r"^\s*h4\s+%s\s.*FAIL\s+-\s+-\s+-\s+-\s+-\s+-\s+refused$" % re.escape(h4.public_endpoint), proc.stdout, re.M)
        # Each broken peer fails, naming itself and what is wrong; the others pass.
        rows = proc.recap()
        assert {name: rows[name]["failed"] for name in rows} == {"h1": 0, "h2": 1, "h3": 1, "h4": 1, "h6": 0}
        for name, line in expected.items():
            assert re.search(r"fatal: \[%s\]: FAILED!" % name, proc.stdout), name
            assert re.search(r"Action failed: \[.*%s" % re.escape(line), out), (name, out[-4000:])
        assert not re.search(r"fatal: \[h[16]\]", proc.stdout)
        # The removal stayed (no version change, so the agent did not re-apply its peers).
        assert h2_key not in wg_peers(site.lab, "h3")

        # The reports carry the same verdict, line for line.
        report = json.loads(report_json.read_text())
        records = {r["name"]: r for r in report["peers"]}
        assert report["passed"] is False
        for name, line in expected.items():
            assert any(problem.startswith(line) for problem in records[name]["problems"]), records[name]["problems"]
            assert records[name]["passed"] is False
            assert all(p.startswith(name + ": ") for p in records[name]["problems"]), records[name]["problems"]
        assert records["h3"]["problems"] == [expected["h3"]]
        assert records["h4"]["attested"] is False and records["h4"]["state"] is None
        assert records["h4"]["problems"] == ["h4: not attested: " + records["h4"]["error"]]
        assert records["h1"]["problems"] == records["h6"]["problems"] == []
        suite = ET.parse(report_junit).getroot()
        failures = {c.get("name"): c.find("failure") for c in suite.findall(".//testcase")}
        assert suite.get("failures") == "3"
        assert failures["h1"] is None and failures["h6"] is None
        for name in ("h2", "h3", "h4"):
            assert failures[name].get("message") == "; ".join(records[name]["problems"]), name
        assert failures["h4"].get("type") == "refused" and failures["h3"].get("type") == "check"
    finally:
        # Repair: h3's peer back as it was, h4's agent started again (it resumes IsNode from its store).
        site.lab.host("h3").run(["wg", "set", "wg0", "peer", h2_key, "endpoint", endpoint, "allowed-ips", allowed_ips,
                                 "persistent-keepalive", keepalive])
        if not site.lab._agent_pids(h4):  # pylint: disable=protected-access
            start_agent(site.lab, h4)
    assert site.lab.healthy()
    proc, report_json, _junit = verify_with_reports(site, tmp_path, "repaired")
    assert proc.returncode == 0, proc.stdout[-4000:]
    report = json.loads(report_json.read_text())
    assert report["passed"] is True
    assert all(r["problems"] == [] for r in report["peers"]), report["peers"]


def test_a_peer_whose_interface_lost_its_vpn_ip_fails_verify_and_site(site, tmp_path):
    """h2's wg0 loses its VPN IP: verify.yml names it, site.yml's step 6 fails it (the node role's own
    check is off there) and, without step 6, the node role's check fails it. Repaired, verify passes."""
    h2 = site.lab.host("h2")
    address = re.search(r"inet (10\.118\.[0-9.]+/[0-9]+) ", h2.run(["ip", "-o", "-4", "addr", "show", "dev", "wg0"]).stdout)
    ip = address.group(1).split("/")[0]
    h2.run(["ip", "addr", "del", address.group(1), "dev", "wg0"])
    try:
        proc, report_json, _junit = verify_with_reports(site, tmp_path, "noaddr")
        assert proc.returncode != 0
        problems = {r["name"]: r["problems"] for r in json.loads(report_json.read_text())["peers"]}
        line = "h2: WireGuard wg0 does not carry its VPN IP %s (addresses: " % ip
        assert any(problem.startswith(line) for problem in problems["h2"]), problems["h2"]
        assert not any("does not carry" in problem for name in problems if name != "h2" for problem in problems[name])

        # site.yml: h2 fails in step 6 with that line among its problems (the others too: no ping to h2).
        proc = site.play("site.yml")
        assert proc.returncode != 0
        assert proc.recap()["h2"]["failed"] == 1
        verdict = re.search(r"^fatal: \[h2\]: FAILED!.*?(?=^(?:fatal|ok|changed|skipping): |^PLAY RECAP)",
                            proc.stdout.split("TASK [The peer passed every check]", 1)[1], re.M | re.S)
        assert verdict and line in verdict.group(0), proc.stdout[-3000:]
        assert not task_hosts(proc.stdout, NODE_VPN_CHECK)

        proc = site.play("site.yml", "--tags", "coordinator,nodes")  # without step 6
        assert proc.returncode != 0
        after_check = proc.stdout.split("TASK [constellation.cluster.node : %s]" % NODE_VPN_CHECK, 1)[1]
        assert re.search(r"^fatal: \[h2\]: FAILED!", after_check, re.M)
    finally:
        h2.run(["ip", "addr", "add", address.group(1), "dev", "wg0"])
    proc, report_json, _junit = verify_with_reports(site, tmp_path, "readdressed")
    assert proc.returncode == 0, proc.stdout[-4000:]


def test_the_coordinator_on_debians_packages_took_part_with_the_default_variant(site):
    """Every site.yml, add_nodes.yml and verify.yml run before this one passed with h1's agent on
    /usr/bin/python3 and Debian's packages only: the same process still runs, nothing of the venv is in it,
    and it attests with the default variant's OID (1.3.9900.5.100, which cryptography 38 encodes)."""
    host = site.lab.host(DEBIAN_HOST)
    (pid,) = site.lab._agent_pids(host)  # pylint: disable=protected-access
    proc = Path("/proc/%d" % pid)
    assert os.path.realpath(proc / "exe") == os.path.realpath(SYSTEM_PYTHON)
    assert proc.joinpath("cmdline").read_bytes().split(b"\0")[0].decode() == SYSTEM_PYTHON
    # The compiled parts it loaded (cryptography's Rust bindings, tpm2-pytss, PyYAML's, grpcio's) are Debian's.
    mapped = {line.split()[-1] for line in proc.joinpath("maps").read_text().splitlines() if len(line.split()) >= 6}
    venv = str(ROOT / ".venv")
    assert not [path for path in mapped if path.startswith(venv) or os.path.realpath(path).startswith(venv)]
    for part in ("cryptography/hazmat/bindings/_rust", "tpm2_pytss/_libtpm2_pytss"):
        assert any(p.startswith("/usr/lib/python3/dist-packages/" + part) for p in mapped), (part, sorted(mapped))
    # The same interpreter, environment and namespaces: each module the agent imports is Debian's.
    env = dict(line.split("=", 1) for line in proc.joinpath("environ").read_text().split("\0") if "=" in line)
    probe = ("import json, sys, cryptography, tpm2_pytss, yaml, grpc, google.protobuf\n"
             "print(json.dumps({'cryptography': cryptography.__version__, 'path': sys.path,\n"
             "                  'files': [m.__file__ for m in (cryptography, tpm2_pytss, yaml, grpc, google.protobuf)]}))")
    loaded = json.loads(host.run(["env", "-i", "PYTHONPATH=" + env["PYTHONPATH"], SYSTEM_PYTHON, "-c", probe]).stdout)
    assert not [entry for entry in loaded["path"] if ".venv" in entry or "site-packages" in entry], loaded["path"]
    assert all(f.startswith("/usr/lib/python3/dist-packages/") for f in loaded["files"]), loaded["files"]
    debian = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "python3-cryptography"], capture_output=True,
                            text=True, check=True).stdout
    assert loaded["cryptography"] == debian.split("-")[0]
    # Attested under the default variant, its certificate carrying the new OID.
    settings = settings_from_args({"measurements_file": str(site.inv / "measurements.json"),
                                   "ek_ca_path": str(site.inv / "ek_ca.pem"), "netns": site.lab.bridge_netns,
                                   "timeout": 10.0, "attestation_timeout": 30.0})
    assert settings.variant == choose.DEFAULT_VARIANT == site.lab.variant
    with open_peer(host.public_endpoint, settings) as client:
        assert client.attested.variant_oid == choose.QEMU_VTPM_EK_OID == "1.3.9900.5.100"
        assert client.get_state()["state"] == "ActivatingNodes"


def test_lab_attests_with_the_ek_variant(site):
    assert site.lab.variant == "qemu-vtpm-ek"
    status = site.status("h1")
    assert status.state == "ActivatingNodes"  # attested through the EK chain: EnrollAK, then aTLS


def test_foreign_tpm_is_refused_by_add_nodes_and_verify(site, tmp_path):
    (new,) = site.lab.grow(7)
    site.lab.foreign_tpm(new.name)  # same image and PCRs; only the EK chain differs
    before = {name: wg_peers(site.lab, name) for name in ("h1", "h2", "h3", "h4", "h6")}
    proc = site.play("playbooks/add_nodes.yml")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert re.search(r"h7.*EK certificate does not chain to the trusted CAs", out, re.S), out[-3000:]
    assert sum(r["changed"] for r in proc.recap().values()) == 0
    pcr15 = new.run(["tpm2_pcrread", "-T", new.tcti, "sha256:15"], env=dict(os.environ, TSS2_LOG="all+none"))
    assert pcr15.stdout.strip().endswith("0x" + "0" * 64)  # never locked: nothing was activated
    for name, peers in before.items():
        assert wg_peers(site.lab, name) == peers, name
    proc, report_json, report_junit = verify_with_reports(site, tmp_path)
    assert proc.returncode != 0
    assert re.search(r"h7.*EK certificate does not chain to the trusted CAs", proc.stdout + proc.stderr, re.S)
    # The reports are written for the failed run too: h7 refused, with the reason; the others pass.
    import xml.etree.ElementTree as ET

    report = json.loads(report_json.read_text())
    records = {r["name"]: r for r in report["peers"]}
    assert report["passed"] is False
    assert records["h7"]["attested"] is False
    assert "EK certificate does not chain to the trusted CAs" in records["h7"]["error"]
    assert all(records[n]["attested"] for n in ("h1", "h2", "h3", "h4", "h6"))
    # h7 fails for that reason alone; the others pass every check (the mesh among the attested peers).
    assert records["h7"]["problems"] == ["h7: not attested: " + records["h7"]["error"]]
    assert all(records[n]["problems"] == [] for n in ("h1", "h2", "h3", "h4", "h6"))
    assert {name: row["failed"] for name, row in proc.recap().items()} == {
        "h1": 0, "h2": 0, "h3": 0, "h4": 0, "h6": 0, "h7": 1}
    suite = ET.parse(report_junit).getroot()
    failed = {c.get("name"): c.find("failure") for c in suite.findall(".//testcase")}
    assert suite.get("failures") == "1"
    assert failed["h7"] is not None and "EK certificate does not chain" in failed["h7"].get("message")
    assert all(failed[n] is None for n in ("h1", "h2", "h3", "h4", "h6"))


KUBE_DIR = "/run/kubernetes"  # every lab host has a private /run: one kubernetes directory per host
KUBE_VARS = {"constellation_kubernetes": True, "constellation_kubernetes_wait_ready": False,
             "kubeadm_control_plane_kubernetes_dir": KUBE_DIR, "kubeadm_worker_kubernetes_dir": KUBE_DIR,
             "kubeadm_control_plane_patches_dir": "/run/kubernetes-patches",
             "kubeadm_worker_patches_dir": "/run/kubernetes-patches"}


def _kube_hosts(site):
    """The cluster's hosts (h6 once add_nodes.yml added it), without the tampered h5 and the foreign h7."""
    return tuple(h.name for h in site.lab.hosts if h.name not in ("h5", "h7"))


def _restart_agents_with_the_kubeadm_double(site, tmp_path, monkeypatch):
    """The kubeadm TEST DOUBLE (tests/doubles/kubeadm) on every agent's PATH, as the hosts' kubeadm; the
    Coordinator's agent finds its control plane in /run/kubernetes (kubernetes_dir); the double on the
    nodes checks their joins against h1's cluster (through /proc/<h1 agent>/root: h1's private /run)."""
    import signal

    from lab.agent import start_agent
    from tests.support.wait import until as wait_until

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubeadm").symlink_to(ROOT / "tests" / "doubles" / "kubeadm")
    monkeypatch.setenv("PATH", "%s:%s:%s" % (bin_dir, VENV_BIN, os.environ.get("PATH", "")))
    monkeypatch.setenv("KUBEADM_DOUBLE_LOG", str(tmp_path / "kubeadm-double.log"))
    for name in _kube_hosts(site):
        host = site.lab.host(name)
        for pid in site.lab._agent_pids(host):  # pylint: disable=protected-access
            os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not site.lab._agent_pids(host), what="%s's agent stops" % name)  # pylint: disable=protected-access
        if name == "h1":
            start_agent(site.lab, host, kubernetes_dir=KUBE_DIR)
            (h1_pid,) = site.lab._agent_pids(host)  # pylint: disable=protected-access
            monkeypatch.setenv("KUBEADM_DOUBLE_CLUSTER", "/proc/%d/root%s" % (h1_pid, KUBE_DIR))
        else:
            start_agent(site.lab, host)
    assert site.lab.healthy()
    return tmp_path / "kubeadm-double.log"


def test_kubernetes_joins_inside_the_chain_of_trust(site, tmp_path, monkeypatch):
    """site.yml with Kubernetes on, kubeadm being the TEST DOUBLE on each host's PATH: h1 initialises the
    control plane; each node asks the Coordinator's vpnapi through its WireGuard tunnel for a fresh token,
    the pinned CA hash and its kubelet certificate, and joins (the double checks token and hash against
    h1's cluster). No token reaches the controller's output. A second run changes nothing and waits until
    every node is Ready (the STAND-IN for the Kubernetes API server on h1); --check changes nothing."""
    log_path = _restart_agents_with_the_kubeadm_double(site, tmp_path, monkeypatch)
    hosts, limit = _kube_hosts(site), "!h5:!h7"
    proc = site.play("site.yml", "-v", "-e", json.dumps(KUBE_VARS), limit=limit)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    rows = proc.recap()
    assert set(rows) == set(hosts) and all(rows[h]["failed"] == 0 for h in hosts), rows
    assert all(rows[h]["changed"] >= 1 for h in hosts), rows  # kubeadm init on h1, a join on each node
    calls = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    joins = [c for c in calls if c["argv"][0] == "join"]
    assert len(joins) == len(hosts) - 1 and all(c["rc"] == 0 for c in joins), [c.get("error") for c in joins]
    cluster_state = json.loads(site.lab.host("h1").run(["cat", KUBE_DIR + "/.kubeadm-double/state.json"]).stdout)
    h1_ca = site.lab.host("h1").run(["cat", KUBE_DIR + "/pki/ca.crt"]).stdout
    from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm import ca_cert_hash
    tokens = [c["config"][0]["discovery"]["bootstrapToken"]["token"] for c in joins]
    assert len(set(tokens)) == len(joins)  # a fresh token per node
    assert {t.split(".")[0] for t in tokens} <= set(cluster_state["tokens"])  # made on h1 by its kubeadm
    for call in joins:
        assert call["config"][0]["discovery"]["bootstrapToken"]["caCertHashes"] == [ca_cert_hash(h1_ca)]
    assert sorted(cluster_state["nodes"]) == sorted(hosts)
    leaked = [t[:6] for t in tokens if t in out or t.split(".")[1] in out]
    assert not leaked, "join tokens in the -v output: %s" % leaked
    for name in hosts[1:]:  # the kubelet serving certificate, signed by the cluster CA for the node
        host = site.lab.host(name)
        host.run(["openssl", "verify", "-CAfile", KUBE_DIR + "/pki/ca.crt", KUBE_DIR + "/pki/kubelet-serving.crt"])
        subject = host.run(["openssl", "x509", "-noout", "-subject", "-ext", "subjectAltName", "-in",
                            KUBE_DIR + "/pki/kubelet-serving.crt"]).stdout
        assert re.search(r"CN ?= ?system:node:%s\b" % name, subject) and "IP Address:%s" % vpn_ip(site.lab, name) in subject

    # The STAND-IN for the Kubernetes API server (not Kubernetes) on h1's VPN IP, serving h1's cluster.
    standin = [str(VENV_BIN / "python"), str(ROOT / "tests" / "doubles" / "kube_apiserver.py"),
               "--cluster", KUBE_DIR, "--listen", "10.118.0.1:6443", "--lifetime", "600",
               "--pid-file", "/run/kube-apiserver-standin.pid"]
    site.lab.host("h1").run(standin + ["--background", "--log", str(tmp_path / "standin.log")])
    try:
        again = dict(KUBE_VARS, constellation_kubernetes_wait_ready=True)
        proc = site.play("site.yml", "-e", json.dumps(again), limit=limit)
        assert proc.returncode == 0, proc.stdout[-5000:]
        assert sum(r["changed"] for r in proc.recap().values()) == 0, proc.recap()
        for name in hosts:
            assert re.search(r"node %s: Ready \(KubeletReady\)" % name, proc.stdout), name
        proc = site.play("site.yml", "--check", "-e", json.dumps(KUBE_VARS), limit=limit)
        assert proc.returncode == 0, proc.stdout[-5000:]
        assert sum(r["changed"] for r in proc.recap().values()) == 0, proc.recap()
    finally:
        site.lab.host("h1").run(standin + ["--stop"], check=False)
    calls = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    assert len([c for c in calls if c["argv"][0] == "join"]) == len(joins)  # joined nodes were not joined again
    # One token per join, none on the second run or in check mode: a joined node asks the Coordinator nothing.
    assert len([c for c in calls if c["argv"][:2] == ["token", "create"]]) == len(joins)


def test_a_host_tampered_since_is_refused_by_the_next_run_before_anything(site):
    """Last (it tampers a cluster host for good): a run after the cluster converged still attests every
    peer in full. The run shares each peer's certified AK between its tasks and connections, never a
    verdict: h4, whose PCR 9 changed since the last run, is refused by step 1, naming the PCR, and
    the run stops there (no step 2 task runs, nothing changes); h4 alone is failed."""
    site.lab.tamper("h4")
    proc = site.play("site.yml", limit="h1,h2,h3,h4")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert re.search(r"h4.*attestation refused.*PCR 9", out, re.S), out[-4000:]
    assert "Master secret on the controller" not in "\n".join(tasks_run(proc.stdout))
    rows = proc.recap()
    assert {name: (row["failed"], row["changed"]) for name, row in rows.items()} == {
        "h1": (0, 0), "h2": (0, 0), "h3": (0, 0), "h4": (1, 0)}


def test_site_activates_further_coordinators_with_their_etcd_members(tmp_path_factory):
    """A lab of 5 hosts with 3 Coordinators (`--coordinators 3`: h1-h3, each agent with an etcd member)
    and 2 Nodes: site.yml (without h3) activates h1, h1 activates h2 and the Nodes in one request;
    add_nodes.yml then adds h3 as a further Coordinator; a second run changes nothing; every Node's
    WireGuard knows every Coordinator (key and VPN IP)."""
    inv = tmp_path_factory.mktemp("coordinators-inventory")
    lab = Lab("tcoords", inventory_dir=inv)
    try:
        lab.up(hosts=5, tpm=True, agents=True, coordinators=3)
        config = json.loads((lab.host("h2").dir / "agent" / "config.json").read_text())
        assert set(config["etcd_member"]) >= {"heartbeat_ms", "election_ms"}, config
        assert "etcd_member" not in json.loads((lab.host("h4").dir / "agent" / "config.json").read_text())
        site = Site(lab, inv)
        # Check mode predicts the further Coordinators' activation and sends nothing.
        check = site.play("site.yml", "--check", limit="")
        assert check.returncode == 0, (check.stdout + check.stderr)[-4000:]
        assert "h3: would be activated as a further Coordinator by the Coordinator" in check.stdout, \
            check.stdout[-3000:]
        assert site.status("h2").state == "AcceptingInit"
        # site.yml without h3 (it boots later), then add_nodes.yml adds it as a further Coordinator.
        first = site.play("site.yml", limit="all:!h3")
        assert first.returncode == 0, (first.stdout + first.stderr)[-4000:]
        assert site.status("h3").state == "AcceptingInit"
        proc = site.play("playbooks/add_nodes.yml", limit="")
        out = first.stdout + proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-4000:]
        assert re.search(r"h3: activated as a further Coordinator by the Coordinator", proc.stdout), proc.stdout[-3000:]
        rows = proc.recap()
        assert all(r["failed"] == 0 for r in rows.values()), rows
        master, salt = site.secrets()
        from ansible_collections.constellation.cluster.plugins.module_utils.kms import open_kms
        cluster_id = open_kms(master.to_uri()).cluster_id(salt)
        states = {name: site.status(name, cluster_id) for name in ("h1", "h2", "h3", "h4", "h5")}
        assert {n: (s.state, s.role, s.membership) for n, s in states.items()} == dict(
            **{n: ("ActivatingNodes", "coordinator", "ours") for n in ("h1", "h2", "h3")},
            **{n: ("IsNode", "node", "ours") for n in ("h4", "h5")})
        # h2 and h3 were activated as further Coordinators by h1 (not by the admin): their etcd members run.
        assert re.search(r"h2: activated as a further Coordinator by the Coordinator", out), out[-3000:]
        for name in ("h1", "h2", "h3"):  # each Coordinator's etcd member serves on its VPN IP
            listening = lab.host(name).run(["ss", "-Hltn", "sport = :2379"], check=False).stdout
            assert "%s:2379" % states[name].vpn_ip in listening, (name, listening)
        for node in ("h4", "h5"):
            allowed = lab.host(node).run(["wg", "show", "wg0", "allowed-ips"], check=False).stdout
            routes = {line.split()[0]: line.split()[1:] for line in allowed.splitlines() if line.strip()}
            for coordinator in ("h1", "h2", "h3"):
                key, ip = states[coordinator].vpn_pub_key, states[coordinator].vpn_ip
                assert key in routes and any(r.startswith(ip + "/") for r in routes[key]), (node, coordinator, allowed)
        again = site.play("site.yml", limit="")
        assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
        rows = again.recap()
        assert set(rows) == {"h1", "h2", "h3", "h4", "h5"}, rows
        assert all(r["changed"] == 0 and r["failed"] == 0 for r in rows.values()), rows
        # Two of the three Coordinators reboot (TPM reset, agent and etcd member gone): recover.yml gives both
        # the KMS URI back at once (neither alone has the etcd majority it waits for), the mesh stays as it was.
        from lab.agent import agent_dir, start_agent
        from tests.support.wait import until as wait_until
        before = {name: (states[name].vpn_ip, states[name].vpn_pub_key) for name in ("h1", "h2")}
        for name in ("h1", "h2"):
            host = lab.host(name)
            member_dir = Path(lab.agent_etcd_member(host).get("data_dir") or agent_dir(host) / "state" / "etcd")
            for pid in lab._agent_pids(host) + [int((member_dir / "etcd.pid").read_text())]:  # pylint: disable=protected-access
                os.kill(pid, signal.SIGKILL)
            wait_until(lambda h=host: not lab._agent_pids(h), what="%s's agent ends" % name)  # pylint: disable=protected-access
            lab.reboot_tpm(name)
            start_agent(lab, host)
        assert site.status("h1").state == "AcceptingInit"  # its state is stored: it waits for Recover
        recovered = site.play("playbooks/recover.yml", limit="")
        assert recovered.returncode == 0, (recovered.stdout + recovered.stderr)[-4000:]
        for name in ("h1", "h2"):
            assert re.search(r"%s: recovered\s+\(AcceptingInit -> ActivatingNodes\)" % name, recovered.stdout), \
                recovered.stdout[-3000:]
            status = site.status(name, cluster_id)
            assert (status.state, status.membership, status.vpn_ip, status.vpn_pub_key) == (
                ("ActivatingNodes", "ours") + before[name])
    finally:
        lab.down()
    assert not [ns for ns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                            check=False).stdout.split() if ns.startswith("cl-tcoords-")]
    assert lab.etcd_tmpfs_dir is None or not lab.etcd_tmpfs_dir.exists()
