"""The joining node's side (kubeadm/join_client.py): it joins with what the Coordinator's provider hands
out, against the kubeadm TEST DOUBLE at the process boundary, which checks the token and the pinned CA
hash against the control plane's cluster (KUBEADM_DOUBLE_CLUSTER) as kubeadm's discovery would."""

from __future__ import annotations

import os

import pytest
from cryptography import x509

from ansible_collections.constellation.cluster.plugins.module_utils import kubeadm
from ansible_collections.constellation.cluster.plugins.module_utils.errors import StateError
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.join_client import join_via_coordinator
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.join_provider import JoinProvider
from ansible_collections.constellation.cluster.tests.support.kubeadm_fixtures import KUBEADM_DOUBLE


@pytest.fixture
def coordinator(initialised, control_plane_dir, monkeypatch):
    """The Coordinator's side in process: the provider answers as GetJoinArgs would (node VPN IP given)."""
    monkeypatch.setenv("KUBEADM_DOUBLE_CLUSTER", control_plane_dir)
    provider = JoinProvider(KUBEADM_DOUBLE, control_plane_dir)
    calls = []

    def answer_for(node_vpn_ip):
        def fetch(csr_pem, is_control_plane):
            calls.append((node_vpn_ip, is_control_plane))
            args = dict(provider.join_args())
            issued = provider.kubelet_cert(csr_pem, node_vpn_ip)
            args["kubelet_cert"] = issued["kubelet_cert"].decode()
            if is_control_plane:
                import base64
                args["control_plane_files"] = [{"name": f["name"], "data": base64.b64encode(f["data"]).decode()}
                                               for f in provider.control_plane_files()]
            return args
        return fetch

    answer_for.calls = calls
    return answer_for


def node_dir(tmp_path, name):
    return str(tmp_path / name / "kubernetes")


def test_worker_joins_with_the_coordinators_answer_once(coordinator, tmp_path, double_log, control_plane_dir):
    directory = node_dir(tmp_path, "worker-0")
    cli = kubeadm.Kubeadm(KUBEADM_DOUBLE, directory)
    dry = join_via_coordinator(cli, coordinator("10.118.0.11"), "worker-0", "10.118.0.11", directory, check_mode=True)
    assert dry.changed and coordinator.calls == []  # check mode asks nothing (an answer makes a token)
    result = join_via_coordinator(cli, coordinator("10.118.0.11"), "worker-0", "10.118.0.11", directory,
                                  patches_dir=None)
    assert result.changed and kubeadm.is_joined(directory)
    join = [e for e in double_log.entries() if e["argv"][0] == "join"]
    assert len(join) == 1 and join[0]["rc"] == 0  # the double checked the token and the pinned hash
    assert join[0]["config"][0]["discovery"]["bootstrapToken"]["caCertHashes"] == [kubeadm.read_ca_cert_hash(control_plane_dir)]
    cert = x509.load_pem_x509_certificate(open(os.path.join(directory, "pki", "kubelet-serving.crt"), "rb").read())
    assert cert.subject.rfc4514_string() == "CN=system:node:worker-0,O=system:nodes"
    assert oct(os.stat(os.path.join(directory, "pki", "kubelet-serving.key")).st_mode & 0o777) == "0o600"
    again = join_via_coordinator(cli, coordinator("10.118.0.11"), "worker-0", "10.118.0.11", directory)
    assert not again.changed and coordinator.calls == [("10.118.0.11", False)]  # a joined node asks nothing


def test_control_plane_joins_with_the_shipped_pki_skipping_download_certs(
        coordinator, tmp_path, double_log, control_plane_dir):
    directory = node_dir(tmp_path, "control-plane-1")
    result = join_via_coordinator(kubeadm.Kubeadm(KUBEADM_DOUBLE, directory), coordinator("10.118.0.2"), "control-plane-1",
                                  "10.118.0.2", directory, control_plane=True, patches_dir=None)
    assert result.changed
    join = [e for e in double_log.entries() if e["argv"][0] == "join"][0]["config"][0]
    assert join["skipPhases"] == ["control-plane-prepare/download-certs"] and "certificateKey" not in join["controlPlane"]
    for name in kubeadm.CONTROL_PLANE_PKI_FILES:
        with open(os.path.join(control_plane_dir, "pki", name), "rb") as theirs, \
                open(os.path.join(directory, "pki", name), "rb") as ours:
            assert theirs.read() == ours.read(), name
        mode = os.stat(os.path.join(directory, "pki", name)).st_mode & 0o777
        assert mode == (0o600 if name.endswith(".key") else 0o644), name


def test_a_kubelet_cert_for_another_key_is_refused_before_anything_is_written(coordinator, tmp_path, double_log):
    directory = node_dir(tmp_path, "worker-1")
    honest = coordinator("10.118.0.12")
    other = kubeadm.kubelet_csr("worker-1", ["10.118.0.12"])

    def swapped(_csr_pem, is_control_plane):
        return honest(other.csr_pem, is_control_plane)  # a certificate for a key this node does not hold

    with pytest.raises(StateError, match="kubelet_cert is not for this node's key"):
        join_via_coordinator(kubeadm.Kubeadm(KUBEADM_DOUBLE, directory), swapped, "worker-1", "10.118.0.12", directory)
    assert not os.path.exists(directory)
    assert not [e for e in double_log.entries() if e["argv"][0] == "join"]


def test_an_answer_without_the_pinned_hash_is_refused(coordinator, tmp_path):
    directory = node_dir(tmp_path, "worker-2")
    honest = coordinator("10.118.0.13")

    def unpinned(csr_pem, is_control_plane):
        answer = honest(csr_pem, is_control_plane)
        answer.pop("discovery_token_ca_cert_hash")
        return answer

    with pytest.raises(StateError, match="join arguments lack discovery_token_ca_cert_hash"):
        join_via_coordinator(kubeadm.Kubeadm(KUBEADM_DOUBLE, directory), unpinned, "worker-2", "10.118.0.13", directory)
    assert not kubeadm.is_joined(directory)
