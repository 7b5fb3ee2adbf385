"""kubernetes.core's k8s_drain and k8s_info as the playbooks and roles use them (in place of the deprecated
kubernetes_node_drain and kubernetes_nodes_ready), through ansible-playbook, against the STAND-IN for the Kubernetes
API server (tests/doubles/kube_apiserver.py: the kubernetes client's discovery, nodes, pods, evictions) serving a
cluster the kubeadm TEST DOUBLE made: control-plane-0 initialised, worker-0 and worker-1 joined.

The role entry point kubeadm_control_plane/nodes_ready waits until the nodes are Ready and fails naming each node
still not Ready and why; a drain (as playbooks/tasks/upgrade_kubernetes_node.yml and remove_node.yml drain) cordons,
evicts a Deployment's pod, leaves the DaemonSet's and the static pods, and is idempotent; a PodDisruptionBudget's
refusal names the pod; uncordon makes the node schedulable again.

Against a real cluster when CONSTELLATION_TEST_KUBECONFIG names an admin kubeconfig: the Ready wait of its nodes
(read-only)."""

from __future__ import annotations

import json
import os
import socket

import pytest

from ansible_collections.constellation.cluster.tests.support.kube_standin import ApiServerStandIn, build_double_cluster
from tests.support.playbook import run_tasks

REAL_KUBECONFIG = os.environ.get("CONSTELLATION_TEST_KUBECONFIG")
REAL = pytest.mark.skipif(not REAL_KUBECONFIG, reason="set CONSTELLATION_TEST_KUBECONFIG to a reachable cluster's "
                                                      "admin kubeconfig to run this against a real API server")
NODES = ["control-plane-0", "worker-0", "worker-1"]


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def apiserver(tmp_path):
    endpoint = "127.0.0.1:%d" % _free_port()
    dirs = build_double_cluster(str(tmp_path / "nodes"), endpoint, "v1.31.1", control_planes=NODES[:1],
                                workers=NODES[1:])
    standin = ApiServerStandIn(dirs[NODES[0]], str(tmp_path), listen=endpoint)
    yield standin
    standin.stop()


def _state_path(apiserver):
    return os.path.join(apiserver.cluster_dir, ".kubeadm-double", "state.json")


def _state(apiserver):
    with open(_state_path(apiserver), encoding="utf-8") as handle:
        return json.load(handle)


def _put_pods(apiserver, *pods):
    state = _state(apiserver)
    state["pods"] = list(pods)
    with open(_state_path(apiserver), "w", encoding="utf-8") as handle:
        json.dump(state, handle)


def _nodes_ready(title, kubeconfig, nodes, timeout):
    return {"name": title, "ignore_errors": True, "ansible.builtin.include_role": {
        "name": "constellation.cluster.kubeadm_control_plane", "tasks_from": "nodes_ready"},
        "vars": {"kubeadm_control_plane_nodes_ready_nodes": nodes, "kubeadm_control_plane_nodes_ready_kubeconfig": kubeconfig,
                 "kubeadm_control_plane_nodes_ready_timeout": timeout, "kubeadm_control_plane_nodes_ready_interval": 1}}


def _report(title):
    return {"name": title, "ansible.builtin.debug": {"var": "kubeadm_control_plane_nodes_ready"}}


def test_nodes_ready_waits_and_names_each_node_not_ready(apiserver, tmp_path):
    apiserver.not_ready("worker-1")
    run = run_tasks(tmp_path / "runs", [
        _nodes_ready("ready", apiserver.kubeconfig, NODES[:2], 30), _report("ready report"),
        _nodes_ready("not ready", apiserver.kubeconfig, NODES + ["ghost-0"], 2)])
    assert run.rc != 0
    ready = run.results()["ready report"]["kubeadm_control_plane_nodes_ready"]
    assert ready["ready"] == NODES[:2]
    assert [(n["name"], n["ready"], n["reason"], n["kubelet_version"]) for n in ready["nodes"]] == [
        ("control-plane-0", True, "KubeletReady", "v1.31.1"), ("worker-0", True, "KubeletReady", "v1.31.1")]
    failed = run.results()["Every node is Ready"]
    assert failed["failed"]
    assert failed["msg"].startswith("nodes not Ready after 2s: 2 of 4 nodes Ready; not Ready: worker-1 (KubeletNotReady: "
                                    "container runtime network not ready")
    assert failed["msg"].endswith(", ghost-0 (NotRegistered: no Node of this name in the cluster)")
    assert "control-plane-0" not in failed["msg"] and "worker-0" not in failed["msg"]
    assert all(not counts["changed"] for counts in run.recap().values())  # read-only


def _drain(title, name, state="drain", timeout=30):
    # The options of playbooks/tasks/upgrade_kubernetes_node.yml's drain (its retry on a PodDisruptionBudget aside).
    options = {"name": name, "state": state, "kubeconfig": "{{ kubeconfig }}"}
    if state == "drain":
        options["delete_options"] = {"ignore_daemonsets": True, "wait_timeout": timeout}
    return {"name": title, "kubernetes.core.k8s_drain": options, "ignore_errors": True}


def test_drain_evicts_what_kubectl_drain_evicts_and_uncordon_reverts_it(apiserver, tmp_path):
    _put_pods(apiserver, {"namespace": "default", "name": "web-0", "node": "worker-0"},
              {"namespace": "kube-system", "name": "cni-worker-0", "node": "worker-0", "daemonset": True},
              {"namespace": "default", "name": "web-1", "node": "worker-1"},
              {"namespace": "db", "name": "db-0", "node": "control-plane-0", "pdb_blocked": True})
    run = run_tasks(tmp_path / "runs", [
        _drain("drain", "worker-0"), _drain("drain again", "worker-0"), _drain("refused", "control-plane-0"),
        _drain("ghost", "ghost-0"), _drain("uncordon", "worker-0", "uncordon"),
        _drain("uncordon again", "worker-0", "uncordon")], play={"vars": {"kubeconfig": apiserver.kubeconfig}})
    results = run.results()
    assert results["drain"]["changed"] and not results["drain"]["failed"], results["drain"]
    assert "Ignoring DaemonSet-managed Pods: kube-system/cni-worker-0." in results["drain"]["warnings"][0]
    assert not results["drain again"]["changed"] and not results["drain again"]["failed"]
    assert results["refused"]["failed"] and "db/db-0" in results["refused"]["msg"]
    assert "disruption budget" in results["refused"]["msg"]  # what the playbooks' retry looks for
    assert results["ghost"]["failed"] and results["ghost"]["msg"] == "Node ghost-0 not found."
    assert results["uncordon"]["changed"] and not results["uncordon again"]["changed"]
    state = _state(apiserver)
    assert sorted(p["name"] for p in state["pods"]) == ["cni-worker-0", "db-0", "web-1"]
    assert {name: bool(record.get("unschedulable")) for name, record in state["nodes"].items()} == {
        "control-plane-0": True, "worker-0": False, "worker-1": False}  # the refused drain left its cordon


@REAL
def test_real_cluster_nodes_ready(tmp_path):
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=REAL_KUBECONFIG, client_configuration=configuration)
    with client.ApiClient(configuration) as api_client:
        names = sorted(n.metadata.name for n in client.CoreV1Api(api_client).list_node().items)
    run = run_tasks(tmp_path / "runs", [_nodes_ready("ready", REAL_KUBECONFIG, names, 120), _report("report")])
    assert run.rc == 0, run.stdout[-3000:]
    assert [n["name"] for n in run.results()["report"]["kubeadm_control_plane_nodes_ready"]["nodes"]] == names


def test_the_replaced_modules_are_deprecated_and_used_nowhere():
    import yaml
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    with open(os.path.join(root, "meta", "runtime.yml"), encoding="utf-8") as handle:
        routing = yaml.safe_load(handle)["plugin_routing"]["modules"]
    with open(os.path.join(root, "galaxy.yml"), encoding="utf-8") as handle:
        assert "kubernetes.core" in yaml.safe_load(handle)["dependencies"]
    for name in ("kubernetes_node_drain", "kubernetes_nodes_ready"):
        assert routing[name]["deprecation"]["removal_version"] == "2.0.0"
        for folder in ("playbooks", "roles", "molecule"):
            for top, _dirs, files in os.walk(os.path.join(root, folder)):
                for file_name in files:
                    if file_name.endswith((".yml", ".yaml", ".j2")):
                        with open(os.path.join(top, file_name), encoding="utf-8") as handle:
                            assert "constellation.cluster." + name not in handle.read(), (top, file_name)
    with open(os.path.join(root, "site.yml"), encoding="utf-8") as handle:
        assert "kubernetes_node" not in handle.read()
