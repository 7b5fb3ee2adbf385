"""The kubeadm TEST DOUBLE registers its cluster's nodes, and the STAND-IN for the Kubernetes API server
(tests/doubles/kube_apiserver.py, not Kubernetes) serves them as the real API does, bounded in place and time."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from ansible_collections.constellation.cluster.plugins.module_utils import kubeadm
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ExternalCommandError
from ansible_collections.constellation.cluster.tests.support.kube_standin import KUBE_APISERVER_STANDIN


def _state(control_plane_dir):
    with open(os.path.join(control_plane_dir, ".kubeadm-double", "state.json"), encoding="utf-8") as handle:
        return json.load(handle)


def test_init_and_joins_register_their_nodes_in_the_cluster(initialised, join, control_plane_dir):
    join("worker-0", "10.118.0.11")
    nodes = _state(control_plane_dir)["nodes"]
    assert sorted(nodes) == ["control-plane-0", "worker-0"]
    assert nodes["control-plane-0"]["control_plane"] and not nodes["worker-0"]["control_plane"]
    assert nodes["worker-0"]["node_ip"] == "10.118.0.11"
    assert {n["kubelet_version"] for n in nodes.values()} == {"v1.31.1"}


def test_a_join_under_a_name_the_cluster_has_is_refused(initialised, join, control_plane_dir, tmp_path):
    with pytest.raises(ExternalCommandError, match="a Node with name 'control-plane-0' .* already exists in the cluster"):
        join("control-plane-0", "10.118.0.11")
    assert not kubeadm.is_joined(str(tmp_path / "control-plane-0" / "kubernetes"))
    assert sorted(_state(control_plane_dir)["nodes"]) == ["control-plane-0"]


def _api(kubeconfig):
    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return client.ApiClient(configuration)


def test_serves_a_node_its_version_and_not_found(apiserver):
    with _api(apiserver.kubeconfig) as api_client:
        node = client.CoreV1Api(api_client).read_node("worker-0")
        assert node.metadata.name == "worker-0" and "node-role.kubernetes.io/control-plane" not in node.metadata.labels
        assert [(a.type, a.address) for a in node.status.addresses][0] == ("InternalIP", "10.118.0.11")
        assert client.VersionApi(api_client).get_code().git_version == "v1.31.1"
        with pytest.raises(ApiException) as missing:
            client.CoreV1Api(api_client).read_node("worker-9")
        assert missing.value.status == 404 and json.loads(missing.value.body)["reason"] == "NotFound"


def test_listens_on_loopback_only_outside_a_lab_namespace(initialised, control_plane_dir):
    proc = subprocess.run([sys.executable, KUBE_APISERVER_STANDIN, "--cluster", control_plane_dir,
                           "--listen", "0.0.0.0:0", "--lifetime", "5"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 1 and "--listen: 0.0.0.0 is not a loopback address" in proc.stderr


def test_a_lifetime_above_an_hour_is_refused(control_plane_dir):
    proc = subprocess.run([sys.executable, KUBE_APISERVER_STANDIN, "--cluster", control_plane_dir,
                           "--lifetime", "86400"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "--lifetime: expected 0 < seconds <= 3600" in proc.stderr


def test_exits_by_itself_after_its_lifetime(initialised, control_plane_dir):
    proc = subprocess.run([sys.executable, KUBE_APISERVER_STANDIN, "--cluster", control_plane_dir,
                           "--lifetime", "0.5"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and proc.stdout.startswith("listening https://127.0.0.1:")


def test_background_start_is_idempotent_and_stops(initialised, control_plane_dir, tmp_path):
    pid_file = str(tmp_path / "standin.pid")
    argv = [sys.executable, KUBE_APISERVER_STANDIN, "--cluster", control_plane_dir, "--lifetime", "60",
            "--pid-file", pid_file, "--background"]
    try:
        first = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
        second = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
        with open(pid_file, encoding="utf-8") as handle:
            pid = int(handle.read())
        assert first.stdout.startswith("started (pid %d), listening https://127.0.0.1:" % pid)
        assert second.stdout == "already running (pid %d)\n" % pid
    finally:
        stop = subprocess.run([sys.executable, KUBE_APISERVER_STANDIN, "--stop", "--pid-file", pid_file],
                              capture_output=True, text=True, timeout=60, check=True)
    assert stop.stdout == "stopped (pid %d)\n" % pid
    assert not os.path.exists(pid_file)
