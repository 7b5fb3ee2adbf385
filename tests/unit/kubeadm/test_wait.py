"""wait_for_nodes_ready with the real kubernetes Python client.

Against a real cluster when CONSTELLATION_TEST_KUBECONFIG names a kubeconfig (none can run here:
kubeadm/kubelet cannot be installed on this machine). Everywhere else against the STAND-IN for the
Kubernetes API server (tests/doubles/kube_apiserver.py, not Kubernetes) at the HTTP boundary: it serves
the nodes the kubeadm TEST DOUBLE registered in its cluster over TLS with that cluster's CA, and the
client authenticates with the client certificate of the double's admin.conf."""

from __future__ import annotations

import base64
import os
import socket

import pytest
import yaml

from ansible_collections.constellation.cluster.plugins.module_utils import kubeadm

from ansible_collections.constellation.cluster.tests.support.kube_standin import KUBEADM_DOUBLE, NOT_READY_MESSAGE, kubeconfig_for

REAL_KUBECONFIG = os.environ.get("CONSTELLATION_TEST_KUBECONFIG")
REAL = pytest.mark.skipif(not REAL_KUBECONFIG, reason="set CONSTELLATION_TEST_KUBECONFIG to a reachable cluster's "
                                                      "kubeconfig to run this against a real API server")


@REAL
def test_real_cluster_nodes_become_ready():
    records = kubeadm.wait_for_nodes_ready(REAL_KUBECONFIG, expected_nodes=1, timeout=120)
    assert any(r.ready for r in records)
    assert all(isinstance(r.name, str) and r.kubelet_version for r in records)


@REAL
def test_real_cluster_names_its_nodes_ready():
    names = [r.name for r in kubeadm.wait_for_nodes_ready(REAL_KUBECONFIG, expected_nodes=1, timeout=120) if r.ready]
    records = kubeadm.wait_for_nodes_ready(REAL_KUBECONFIG, nodes=names, timeout=60)
    assert [r.name for r in records] == names and all(r.ready for r in records)


@REAL
def test_real_cluster_more_nodes_than_exist_times_out():
    with pytest.raises(kubeadm.StateError, match="nodes Ready"):
        kubeadm.wait_for_nodes_ready(REAL_KUBECONFIG, expected_nodes=10_000, timeout=5, interval=1)


@REAL
def test_real_cluster_unknown_node_is_named():
    with pytest.raises(kubeadm.StateError, match="no-such-node-x1 \\(NotRegistered"):
        kubeadm.wait_for_nodes_ready(REAL_KUBECONFIG, nodes=["no-such-node-x1"], timeout=3, interval=1)


# --------------------------------------------------------------------------- against the API server STAND-IN


def test_all_nodes_ready_returns_their_records(apiserver):
    records = kubeadm.wait_for_nodes_ready(apiserver.kubeconfig, nodes=["control-plane-0", "worker-0", "worker-1"],
                                           timeout=30, interval=0.2)
    assert [r.as_dict() for r in records] == [
        {"name": name, "ready": True, "reason": "KubeletReady", "message": "kubelet is posting ready status",
         "kubelet_version": "v1.31.1"} for name in ("control-plane-0", "worker-0", "worker-1")]


def test_a_count_returns_every_listed_node(apiserver):
    records = kubeadm.wait_for_nodes_ready(apiserver.kubeconfig, expected_nodes=3, timeout=30, interval=0.2)
    assert [(r.name, r.ready) for r in records] == [("control-plane-0", True), ("worker-0", True), ("worker-1", True)]


def test_one_node_not_ready_is_named_with_its_reason(apiserver):
    apiserver.not_ready("worker-1")
    with pytest.raises(kubeadm.StateError) as failure:
        kubeadm.wait_for_nodes_ready(apiserver.kubeconfig, nodes=["control-plane-0", "worker-0", "worker-1"],
                                     timeout=1, interval=0.2)
    message = str(failure.value)
    assert message.startswith("nodes not Ready after 1s: 2 of 3 nodes Ready; not Ready: worker-1 (KubeletNotReady: ")
    assert NOT_READY_MESSAGE in message
    assert "control-plane-0" not in message and "worker-0 " not in message


def test_too_few_ready_for_a_count_names_the_waiting_node(apiserver):
    apiserver.not_ready("worker-0")
    with pytest.raises(kubeadm.StateError, match=r"2 of 3 nodes Ready \(control-plane-0, worker-1\); "
                                                 r"not Ready: worker-0 \(KubeletNotReady: "):
        kubeadm.wait_for_nodes_ready(apiserver.kubeconfig, expected_nodes=3, timeout=1, interval=0.2)


def test_a_node_that_never_registered_is_named(apiserver):
    with pytest.raises(kubeadm.StateError, match=r"not Ready: worker-9 \(NotRegistered: no Node of this name"):
        kubeadm.wait_for_nodes_ready(apiserver.kubeconfig, nodes=["worker-0", "worker-9"], timeout=1, interval=0.2)


def test_a_node_ready_again_lets_the_wait_succeed(apiserver):
    apiserver.not_ready("worker-0")
    apiserver.not_ready()  # the file now names no node
    records = kubeadm.wait_for_nodes_ready(apiserver.kubeconfig, nodes=["worker-0"], timeout=30, interval=0.2)
    assert records[0].ready


def test_a_node_joined_later_is_served(apiserver, join):
    with pytest.raises(kubeadm.StateError, match="worker-2 \\(NotRegistered"):
        kubeadm.wait_for_nodes_ready(apiserver.kubeconfig, nodes=["worker-2"], timeout=0.5, interval=0.2)
    join("worker-2", "10.118.0.13")
    assert kubeadm.wait_for_nodes_ready(apiserver.kubeconfig, nodes=["worker-2"], timeout=30, interval=0.2)[0].ready


def test_wrong_ca_in_the_kubeconfig_is_refused(apiserver, tmp_path, init_params, double_log):
    """TLS verification really happens: another cluster's CA does not vouch for this API server."""
    other_dir = str(tmp_path / "other" / "kubernetes")
    kubeadm.init_control_plane(kubeadm.Kubeadm(KUBEADM_DOUBLE, other_dir), init_params(kubernetes_dir=other_dir))
    with open(os.path.join(other_dir, "pki", "ca.crt"), "rb") as handle:
        other_ca = handle.read()
    path = kubeconfig_for(apiserver.admin_conf, apiserver.url, tmp_path / "wrong-ca.conf", ca_pem=other_ca)
    with pytest.raises(kubeadm.StateError, match="the API server's certificate was not accepted: .*certificate"):
        kubeadm.wait_for_nodes_ready(path, nodes=["worker-0"], timeout=30, interval=0.2)


def test_no_client_certificate_is_refused_with_401(apiserver, tmp_path):
    path = kubeconfig_for(apiserver.admin_conf, apiserver.url, tmp_path / "token.conf", user={"token": "not-a-secret"})
    with pytest.raises(kubeadm.StateError, match=r"refused the request \(401 Unauthorized\): Unauthorized"):
        kubeadm.wait_for_nodes_ready(path, nodes=["worker-0"], timeout=30, interval=0.2)


def test_a_client_that_may_not_read_nodes_is_refused_with_403(apiserver, tmp_path):
    path = kubeconfig_for(apiserver.admin_conf, apiserver.url, tmp_path / "dev.conf", client_groups=["developers"])
    with pytest.raises(kubeadm.StateError, match=r'\(403 Forbidden\): nodes is forbidden: User "dev" cannot list'):
        kubeadm.wait_for_nodes_ready(path, nodes=["worker-0"], timeout=30, interval=0.2)


# --------------------------------------------------------------------------- bounded, bad input


def test_unreachable_api_server_gives_up_with_a_reason(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # The port is closed again: connections are refused.
    kubeconfig = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:%d" % port,
                                               "certificate-authority-data": base64.b64encode(b"x").decode()}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "not-a-secret"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    with pytest.raises(kubeadm.StateError, match="API server not answering"):
        kubeadm.wait_for_nodes_ready(str(path), timeout=1, interval=0.5)


@pytest.mark.parametrize("overrides, message", [
    ({"kubeconfig_path": "/nonexistent/admin.conf"}, "kubeconfig: expected an existing kubeconfig file"),
    ({"nodes": ["Worker_0"]}, "nodes: expected an RFC 1123 subdomain"),
    ({"nodes": []}, "nodes: expected a non-empty list of node names"),
    ({"nodes": "worker-0"}, "nodes: expected a non-empty list of node names"),
    ({"nodes": ["a", "a"]}, "nodes: expected node names without duplicates"),
    ({"nodes": ["a"], "expected_nodes": 1}, "nodes: expected either nodes (names) or expected_nodes"),
    ({"expected_nodes": 0}, "expected_nodes: expected a whole number of nodes, at least 1"),
    ({"expected_nodes": True}, "expected_nodes: expected a whole number"),
    ({"timeout": 0}, "timeout: expected seconds, more than 0 and at most 3600"),
    ({"timeout": 86400}, "timeout: expected seconds, more than 0 and at most 3600"),
    ({"interval": -1}, "interval: expected seconds"),
    ({"timeout": 5, "interval": 10}, "interval: expected at most the timeout (5s)"),
])
def test_bad_input_names_the_field(tmp_path, overrides, message):
    path = tmp_path / "admin.conf"
    path.write_text("apiVersion: v1\nkind: Config\n")
    args = dict(kubeconfig_path=str(path), timeout=10, interval=1)
    args.update(overrides)
    with pytest.raises(kubeadm.InputError) as failure:
        kubeadm.wait_for_nodes_ready(**args)
    assert str(failure.value).startswith(message)


def test_an_unusable_kubeconfig_names_the_field(tmp_path):
    path = tmp_path / "admin.conf"
    path.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    with pytest.raises(kubeadm.InputError, match="kubeconfig: expected a usable kubeconfig file"):
        kubeadm.wait_for_nodes_ready(str(path), nodes=["worker-0"], timeout=1, interval=0.5)
