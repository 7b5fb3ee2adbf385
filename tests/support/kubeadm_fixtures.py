"""Fixtures of the kubeadm TEST DOUBLE for the kubeadm and vpnapi tests (tests/unit/conftest.py registers them).
``KUBEADM_DOUBLE`` is the TEST DOUBLE of the kubeadm executable
(tests/doubles/kubeadm): kubeadm cannot be installed here, so the Core is driven through it at the
process boundary."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils import kubeadm
from ansible_collections.constellation.cluster.tests.support.kube_standin import ApiServerStandIn

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KUBEADM_DOUBLE = os.path.join(REPO, "tests", "doubles", "kubeadm")


class DoubleLog:
    """The invocations the kubeadm test double recorded (one JSON object per line)."""

    def __init__(self, path):
        self.path = path

    def entries(self):
        if not os.path.exists(self.path):
            return []
        with open(self.path, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]

    def commands(self):
        return [e["argv"][:2] for e in self.entries()]


@pytest.fixture
def double_log(tmp_path, monkeypatch):
    path = str(tmp_path / "kubeadm-double.log")
    monkeypatch.setenv("KUBEADM_DOUBLE_LOG", path)
    monkeypatch.delenv("KUBEADM_DOUBLE_CLUSTER", raising=False)
    return DoubleLog(path)


@pytest.fixture
def control_plane_dir(tmp_path):
    return str(tmp_path / "cp" / "kubernetes")


@pytest.fixture
def init_params(control_plane_dir, tmp_path):
    def make(**overrides):
        values = dict(kubernetes_version="v1.31.1", node_name="control-plane-0", node_vpn_ip="10.118.0.1",
                      kubernetes_dir=control_plane_dir, patches_dir=str(tmp_path / "patches"))
        values.update(overrides)
        return kubeadm.InitParams(**values)
    return make


@pytest.fixture
def initialised(double_log, control_plane_dir, init_params):
    """A control plane initialised by the test double; returns the InitResult."""
    cli = kubeadm.Kubeadm(KUBEADM_DOUBLE, control_plane_dir)
    return kubeadm.init_control_plane(cli, init_params(), upload_certs=True)


@pytest.fixture
def join(initialised, double_log, tmp_path, monkeypatch, control_plane_dir):
    """Joins a worker to the ``initialised`` cluster with the test double (which registers the node there)."""
    monkeypatch.setenv("KUBEADM_DOUBLE_CLUSTER", control_plane_dir)

    def make(node_name, node_vpn_ip):
        node_dir = str(tmp_path / node_name / "kubernetes")
        params = kubeadm.JoinParams(api_server_endpoint="10.118.0.1:6443", token=initialised.token,
                                    ca_cert_hash=initialised.ca_cert_hash, node_name=node_name, node_vpn_ip=node_vpn_ip,
                                    kubernetes_dir=node_dir, patches_dir=None)
        return kubeadm.join_node(kubeadm.Kubeadm(KUBEADM_DOUBLE, node_dir), params)
    return make


@pytest.fixture
def apiserver(join, control_plane_dir, tmp_path):
    """The STAND-IN for the Kubernetes API server (not Kubernetes) on 127.0.0.1, serving the cluster of
    ``initialised`` (control-plane-0) with worker-0 and worker-1 joined."""
    join("worker-0", "10.118.0.11")
    join("worker-1", "10.118.0.12")
    server = ApiServerStandIn(control_plane_dir, str(tmp_path))
    yield server
    server.stop()
