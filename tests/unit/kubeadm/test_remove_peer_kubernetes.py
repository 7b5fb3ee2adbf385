# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Removing a node (Kubernetes side): a removed Node's Node object is deleted, its kubelet name is free for the
next node, and it gets no kubelet certificate any more. A real Core (Coordinator) with its kubeadm provider on a
control plane made by the kubeadm TEST DOUBLE and the STAND-IN for the Kubernetes API server
(tests/doubles/kube_apiserver.py, not Kubernetes)."""

from __future__ import annotations

import os

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from ansible_collections.constellation.cluster.plugins.module_utils import core as core_mod
from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.join_provider import JoinProvider
from ansible_collections.constellation.cluster.plugins.module_utils.store import MemoryStore
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import generate_priv_key, pub_key_from_priv_key
from ansible_collections.constellation.cluster.tests.unit.agent.agent_fakes import MemoryTPM, RecordingVPN
from ansible_collections.constellation.cluster.tests.unit.kubeadm.conftest import KUBEADM_DOUBLE
from ansible_collections.constellation.cluster.tests.unit.kubeadm.test_join_provider import make_csr


def _node_names(apiserver):
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=apiserver.kubeconfig, client_configuration=configuration)
    with client.ApiClient(configuration) as api_client:
        return sorted(n.metadata.name for n in client.CoreV1Api(api_client).list_node().items)


def test_removal_deletes_the_node_object_and_frees_its_name(apiserver, control_plane_dir, tmp_path):
    provider = JoinProvider(KUBEADM_DOUBLE, control_plane_dir)
    provider.kubeconfig = apiserver.kubeconfig  # the stand-in's address instead of admin.conf's
    state_dir = tmp_path / "coordinator"
    state_dir.mkdir()
    coordinator = core_mod.Core(MemoryStore(), MemoryTPM(), RecordingVPN(), str(state_dir), "10.42.0.10",
                                core_mod.new_disk_uuid())
    coordinator.recovery.load()
    admin = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    coordinator.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), admin)
    coordinator.kubernetes.kubeadm_provider = provider
    rows = {}
    for name, octet in (("worker-0", 20), ("worker-1", 21)):
        vpn_ip = coordinator.coordinator.reserve_node_ip()
        coordinator.activation.record_node(vpn_ip, pub_key_from_priv_key(generate_priv_key()), "10.42.0.%d" % octet,
                                           core_mod.new_disk_uuid())
        csr, _key = make_csr(cn="system:node:" + name, sans=(name, vpn_ip))
        coordinator.kubernetes.kubelet_cert_for(csr, vpn_ip, "GetJoinArgs")
        rows[name] = (vpn_ip, csr)
    assert _node_names(apiserver) == ["control-plane-0", "worker-0", "worker-1"]

    result = coordinator.removal.remove_node(public_ip="10.42.0.20")
    assert result["kubernetes_node_names"] == ["worker-0"]
    assert _node_names(apiserver) == ["control-plane-0", "worker-1"]
    removed_ip = rows["worker-0"][0]
    # The removed Node is no peer: the vpnapi's PeerAuth finds no key recorded for its address (nothing more for it).
    assert coordinator.access.vpn_peer_record(removed_ip) is None
    assert coordinator.access.check_peer_proof(removed_ip, "10.118.0.1", os.urandom(32), os.urandom(32)) is None
    # Its name is free: the next node (here on the freed VPN IP, as the next activation gets it) may be certified.
    reused = coordinator.coordinator.reserve_node_ip()
    assert reused == removed_ip
    coordinator.activation.record_node(reused, pub_key_from_priv_key(generate_priv_key()), "10.42.0.22",
                                       core_mod.new_disk_uuid())
    new_csr, _key = make_csr(cn="system:node:worker-0", sans=("worker-0", reused))
    assert coordinator.kubernetes.kubelet_cert_for(new_csr, reused, "GetJoinArgs")["node_name"] == "worker-0"
