"""wait_for_nodes_ready with the real kubernetes Python client.

Against a real cluster only when CONSTELLATION_TEST_KUBECONFIG names a kubeconfig (none can run here:
kubeadm/kubelet cannot be installed on this machine). Without one, the bounded failure path still runs
for real: the client connects to a closed loopback port and the wait gives up with a StateError."""

from __future__ import annotations

import base64
import os
import socket

import pytest
import yaml

from ansible_collections.constellation.cluster.plugins.module_utils import kubeadm as core

REAL_KUBECONFIG = os.environ.get("CONSTELLATION_TEST_KUBECONFIG")


@pytest.mark.skipif(not REAL_KUBECONFIG, reason="set CONSTELLATION_TEST_KUBECONFIG to a reachable cluster's "
                                                "kubeconfig to run this against a real API server")
def test_real_cluster_nodes_become_ready():
    ready = core.wait_for_nodes_ready(REAL_KUBECONFIG, expected_nodes=1, timeout=120)
    assert ready and all(isinstance(name, str) for name in ready)


@pytest.mark.skipif(not REAL_KUBECONFIG, reason="set CONSTELLATION_TEST_KUBECONFIG to a reachable cluster's "
                                                "kubeconfig to run this against a real API server")
def test_real_cluster_more_nodes_than_exist_times_out():
    with pytest.raises(core.StateError, match="nodes Ready"):
        core.wait_for_nodes_ready(REAL_KUBECONFIG, expected_nodes=10_000, timeout=5, interval=1)


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
    with pytest.raises(core.StateError, match="API server not answering"):
        core.wait_for_nodes_ready(str(path), timeout=1, interval=0.5)
