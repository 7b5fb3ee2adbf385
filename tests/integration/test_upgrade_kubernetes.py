# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""playbooks/upgrade_kubernetes.yml end to end, on a cluster the kubeadm TEST DOUBLE made (tests/doubles/kubeadm:
h1 = control-plane-0 initialised at v1.31.1, h2 = control-plane-1 joined as a control plane, h3 = worker-0),
served by the STAND-IN for the Kubernetes API server (tests/doubles/kube_apiserver.py) on loopback, with the
TEST DOUBLE of the environment's kubelet installation (tests/doubles/kubelet_package) as the kubelet hooks.
The hosts are local (ansible_connection=local, one kubernetes directory each): kubeadm is a process-boundary
double here, nothing of the lab's attestation or WireGuard is involved, so no lab is needed.

--check predicts the roll and changes nothing; two minor versions are refused naming the node, the versions
and the rule; the roll upgrades control planes first (apply on h1, then node on h2), then the workers, each
drained, its kubelet upgraded and restarted, and uncordoned; a second run changes nothing."""

from __future__ import annotations

import json
import os
import socket

import pytest
import yaml
from tests.support import ROOT, VENV_BIN
from tests.support.playbook import run_playbook

from ansible_collections.constellation.cluster.tests.support.kube_standin import KUBEADM_DOUBLE, ApiServerStandIn, build_double_cluster

OLD, NEW = "v1.31.1", "v1.32.0"
HOSTS = {"h1": "control-plane-0", "h2": "control-plane-1", "h3": "worker-0"}
PLAYBOOK = ROOT / "playbooks" / "upgrade_kubernetes.yml"
KUBELET_PACKAGE = ROOT / "tests" / "doubles" / "kubelet_package"


class Upgrade:
    """The double's cluster, its stand-in, an inventory of four local hosts and a way to run the playbook."""

    def __init__(self, work):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            endpoint = "127.0.0.1:%d" % sock.getsockname()[1]
        self.work = work
        self.dirs = build_double_cluster(str(work / "nodes"), endpoint, OLD, control_planes=("control-plane-0", "control-plane-1"),
                                         workers=("worker-0",))
        self.cluster_dir = self.dirs["control-plane-0"]
        self.log = work / "double.log"
        self.apiserver = ApiServerStandIn(self.cluster_dir, str(work), lifetime=600, listen=endpoint)
        kubelet = "%s {} --kubernetes-dir {{{{ kubernetes_upgrade_dir }}}}" % KUBELET_PACKAGE
        host_vars = {host: {"kubernetes_upgrade_node_name": node, "kubernetes_upgrade_kubernetes_dir": self.dirs[node]}
                     for host, node in HOSTS.items()}
        self.inventory = work / "hosts.yml"
        self.inventory.write_text(yaml.safe_dump({"all": {
            "vars": {"ansible_connection": "local", "ansible_python_interpreter": str(VENV_BIN / "python"),
                     "kubernetes_upgrade_kubeadm_path": KUBEADM_DOUBLE,
                     "kubernetes_upgrade_kubelet_command": kubelet.format("install {{ kubernetes_version }}"),
                     "kubernetes_upgrade_kubelet_restart_command": kubelet.format("restart"),
                     "kubernetes_upgrade_wait_delay": 0.5},
            "children": {"coordinators": {"hosts": {"h1": host_vars["h1"]}},
                         "nodes": {"hosts": {h: host_vars[h] for h in ("h2", "h3")}}}}}))

    def play(self, *args):
        env = {"KUBEADM_DOUBLE_CLUSTER": self.cluster_dir, "KUBEADM_DOUBLE_LOG": str(self.log),
               "KUBEADM_DOUBLE_VERSION": NEW, "ANSIBLE_PIPELINING": "1"}
        return run_playbook(PLAYBOOK, str(self.inventory), self.work / "runs", list(args), env=env, timeout=300)

    def state(self):
        with open(os.path.join(self.cluster_dir, ".kubeadm-double", "state.json"), encoding="utf-8") as handle:
            return json.load(handle)

    def calls(self):
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def changes(self):
        """The calls that change something: kubeadm upgrade apply/node, the kubelet hooks."""
        return [(c.get("command") or c["argv"][0], c.get("upgrade", {}).get("node") or c["argv"][-1])
                for c in self.calls() if c.get("command") in ("upgrade apply", "upgrade node")
                or c.get("tool") == "kubelet_package"]


@pytest.fixture(scope="module")
def upgrade(tmp_path_factory):
    made = Upgrade(tmp_path_factory.mktemp("upgrade-kubernetes"))
    state = made.state()
    state["pods"] = [{"namespace": "default", "name": "web-0", "node": "worker-0"},
                     {"namespace": "kube-system", "name": "cni-worker-0", "node": "worker-0", "daemonset": True}]
    with open(os.path.join(made.cluster_dir, ".kubeadm-double", "state.json"), "w", encoding="utf-8") as handle:
        json.dump(state, handle)
    yield made
    made.apiserver.stop()


def test_check_mode_predicts_the_roll_and_changes_nothing(upgrade):
    before = upgrade.state()
    proc = upgrade.play("--check", "-e", "kubernetes_version=" + NEW)
    assert proc.rc == 0, proc.stdout[-4000:]
    prediction = proc.results("h1")["Predicted roll (which node goes from which version)"]["msg"]
    assert "h1 (control-plane-0, control-plane): control plane v1.31.1 -> v1.32.0, kubelet v1.31.1 -> v1.32.0" in prediction
    assert "h3 (worker-0, worker): kubelet v1.31.1 -> v1.32.0" in prediction
    assert proc.results("h1")["Kubeadm upgrade (apply on the first control plane, node elsewhere)"]["command"][:3] \
        == ["kubeadm", "upgrade", "apply"]
    assert proc.results("h3")["Drain (on the first control plane)"]["skipped"]  # kubernetes.core.k8s_drain: no check mode
    assert upgrade.changes() == [] and upgrade.state() == before


def test_two_minor_versions_are_refused_naming_each_control_plane(upgrade):
    proc = upgrade.play("-e", "kubernetes_version=v1.33.0")
    assert proc.rc != 0
    failed = proc.results("h1")["Read the cluster's versions and check the skew (on the first control plane)"]
    assert failed["failed"] and [(r["node"], r["found"], r["wanted"], r["rule"]) for r in failed["refusals"]] == [
        ("control-plane-0", "API server v1.31.1", "v1.33.0", "one-minor"),
        ("control-plane-1", "API server v1.31.1", "v1.33.0", "one-minor")]
    assert "control-plane-0: found API server v1.31.1, wanted v1.33.0: one minor version at a time" in failed["msg"]
    proc = upgrade.play("-e", "kubernetes_version=" + NEW, "-e", "kubernetes_upgrade_kubelet_command=")
    assert proc.rc != 0 and "kubernetes_upgrade_kubelet_command: how the kubelet is installed" in proc.stdout
    assert upgrade.changes() == []


def test_the_roll_control_planes_first_one_node_at_a_time_then_nothing_to_do(upgrade):
    proc = upgrade.play("-e", "kubernetes_version=" + NEW)
    assert proc.rc == 0, proc.stdout[-5000:]
    assert all(proc.counts(h)["changed"] >= 3 for h in HOSTS), proc.recap()
    state = upgrade.state()
    assert state["kubernetes_version"] == NEW
    assert {n: (r.get("control_plane_version"), r["kubelet_version"], bool(r.get("unschedulable")))
            for n, r in state["nodes"].items()} == {
        "control-plane-0": (NEW, NEW, False), "control-plane-1": (NEW, NEW, False),
        "worker-0": (None, NEW, False)}
    assert [p["name"] for p in state["pods"]] == ["cni-worker-0"]  # web-0 evicted; the DaemonSet's pod stays
    # One node after the other, control planes first: kubeadm, then its kubelet, before the next node starts.
    assert upgrade.changes() == [
        ("upgrade apply", "control-plane-0"), ("install", upgrade.dirs["control-plane-0"]),
        ("restart", upgrade.dirs["control-plane-0"]),
        ("upgrade node", "control-plane-1"), ("install", upgrade.dirs["control-plane-1"]),
        ("restart", upgrade.dirs["control-plane-1"]),
        ("upgrade node", "worker-0"), ("install", upgrade.dirs["worker-0"]), ("restart", upgrade.dirs["worker-0"])]
    plans = [c for c in upgrade.calls() if c.get("command") == "upgrade plan" and c["rc"] == 0]
    apply_at = next(i for i, c in enumerate(upgrade.calls()) if c.get("command") == "upgrade apply")
    assert plans and upgrade.calls().index(plans[-1]) < apply_at  # kubeadm upgrade plan, then apply

    again = upgrade.play("-e", "kubernetes_version=" + NEW)
    assert again.rc == 0, again.stdout[-4000:]
    assert again.changed() == 0, again.recap()
    assert "nothing to do: every node is at v1.32.0" in again.results("h1")[
        "Predicted roll (which node goes from which version)"]["msg"]
    assert len(upgrade.changes()) == 9
