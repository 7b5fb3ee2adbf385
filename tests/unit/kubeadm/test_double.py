"""The kubeadm TEST DOUBLE itself refuses what kubeadm (or our policy) refuses, so module tests that pass
against it mean something: hand-written configurations are fed to it directly."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

DOUBLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "doubles", "kubeadm")
HASH = "sha256:" + "ab" * 32


def run(tmp_path, argv, docs):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    os.chmod(path, 0o600)
    return subprocess.run([sys.executable, DOUBLE] + argv + ["--config", str(path)], capture_output=True, text=True,
                          env=dict(os.environ, KUBEADM_DOUBLE_LOG=str(tmp_path / "log")), check=False)


def join_doc(tmp_path, **bootstrap):
    token = {"apiServerEndpoint": "10.118.0.1:6443", "token": "abcdef.0123456789abcdef", "caCertHashes": [HASH]}
    token.update(bootstrap)
    return [{"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "JoinConfiguration",
             "caCertPath": str(tmp_path / "k" / "pki" / "ca.crt"),
             "nodeRegistration": {"name": "worker-0"}, "discovery": {"bootstrapToken": token}}]


def test_accepts_a_pinned_join(tmp_path):
    proc = run(tmp_path, ["join"], join_doc(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "k" / "kubelet.conf").exists()


@pytest.mark.parametrize("bootstrap, message", [
    ({"unsafeSkipCAVerification": True}, "unsafeSkipCAVerification is forbidden"),
    ({"unsafeSkipCAVerification": False, "caCertHashes": []}, "unsafeSkipCAVerification is forbidden"),
    ({"caCertHashes": []}, "caCertHashes is required"),
    ({"caCertHashes": ["sha256:zz"]}, "invalid caCertHashes"),
    ({"token": "abcdef0123456789abcdef"}, "bootstrap token was not of the form"),
])
def test_refuses_unpinned_or_malformed_joins(tmp_path, bootstrap, message):
    proc = run(tmp_path, ["join"], join_doc(tmp_path, **bootstrap))
    assert proc.returncode == 1 and message in proc.stderr
    assert not (tmp_path / "k" / "kubelet.conf").exists()


def test_refuses_v1beta3_style_extra_args_in_v1beta4(tmp_path):
    docs = join_doc(tmp_path)
    docs[0]["nodeRegistration"]["kubeletExtraArgs"] = {"node-ip": "10.118.0.11"}
    proc = run(tmp_path, ["join"], docs)
    assert proc.returncode == 1 and "v1beta4 extraArgs must be a list" in proc.stderr


def test_refuses_a_world_readable_config(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump_all(join_doc(tmp_path)))
    os.chmod(path, 0o644)
    proc = subprocess.run([sys.executable, DOUBLE, "join", "--config", str(path)], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 1 and "readable by others" in proc.stderr


def test_refuses_system_directory(tmp_path):
    docs = join_doc(tmp_path)
    docs[0]["caCertPath"] = "/etc/kubernetes/pki/ca.crt"
    proc = run(tmp_path, ["join"], docs)
    assert proc.returncode == 1 and "refuses to write under /etc/kubernetes" in proc.stderr


def test_unknown_flag(tmp_path):
    proc = run(tmp_path, ["join", "--discovery-token-unsafe-skip-ca-verification"], join_doc(tmp_path))
    assert proc.returncode == 1 and "unknown flag" in proc.stderr
