"""The module constellation.cluster.kubernetes_nodes_ready (its main, with the arguments Ansible would pass)
against the STAND-IN for the Kubernetes API server (tests/doubles/kube_apiserver.py, not Kubernetes)."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.constellation.cluster.plugins.modules import kubernetes_nodes_ready


def run_module(capsys, args):
    """Runs the module's main; returns its JSON result (exit_json and fail_json both end the process)."""
    with patch_module_args(args), pytest.raises(SystemExit) as done:
        kubernetes_nodes_ready.main()
    result = json.loads(capsys.readouterr().out)
    assert (done.value.code == 0) != bool(result.get("failed"))
    return result


@pytest.mark.parametrize("check_mode", [False, True])
def test_reports_every_node_ready_and_changes_nothing(apiserver, capsys, check_mode):
    result = run_module(capsys, {"kubeconfig": apiserver.kubeconfig, "nodes": ["worker-1", "control-plane-0"],
                                 "timeout": 30, "interval": 0.2, "_ansible_check_mode": check_mode})
    assert not result.get("failed") and result["changed"] is False
    assert result["ready"] == ["worker-1", "control-plane-0"]
    assert result["nodes"] == [
        {"name": name, "ready": True, "reason": "KubeletReady", "message": "kubelet is posting ready status",
         "kubelet_version": "v1.31.1"} for name in ("worker-1", "control-plane-0")]


def test_expected_nodes_counts_ready_nodes(apiserver, capsys):
    result = run_module(capsys, {"kubeconfig": apiserver.kubeconfig, "expected_nodes": 3, "timeout": 30, "interval": 0.2})
    assert result["ready"] == ["control-plane-0", "worker-0", "worker-1"]


def test_a_node_not_ready_fails_naming_it(apiserver, capsys):
    apiserver.not_ready("worker-0")
    result = run_module(capsys, {"kubeconfig": apiserver.kubeconfig, "nodes": ["control-plane-0", "worker-0"],
                                 "timeout": 1, "interval": 0.2})
    assert result["failed"] and result["msg"].startswith(
        "nodes not Ready after 1.0s: 1 of 2 nodes Ready; not Ready: worker-0 (KubeletNotReady: container runtime network not ready")
    assert "nodes" not in result


@pytest.mark.parametrize("args, message", [
    ({"nodes": ["Worker_0"]}, "nodes: expected an RFC 1123 subdomain"),
    ({"expected_nodes": 0}, "expected_nodes: expected a whole number of nodes, at least 1"),
    ({"timeout": -5}, "timeout: expected seconds, more than 0 and at most 3600"),
    ({"timeout": 10, "interval": 60}, "interval: expected at most the timeout"),
    ({"kubeconfig": "/nonexistent/admin.conf"}, "kubeconfig: expected an existing kubeconfig file"),
    ({"nodes": ["a"], "expected_nodes": 1}, "parameters are mutually exclusive: nodes|expected_nodes"),
    ({"timeout": "soon"}, "argument 'timeout' is of type str and we were unable to convert to float"),
])
def test_bad_input_names_the_field(tmp_path, capsys, args, message):
    kubeconfig = tmp_path / "admin.conf"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    result = run_module(capsys, dict({"kubeconfig": str(kubeconfig)}, **args))
    assert result["failed"] and message in result["msg"]
