# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Removing a node (Kubernetes side): a removed Node's Node object is deleted, its kubelet name is free for the
next node, and it gets no kubelet certificate any more. A real Core (Coordinator) with its kubeadm provider on a
control plane made by the kubeadm TEST DOUBLE and the STAND-IN for the Kubernetes API server
(tests/doubles/kube_apiserver.py, not Kubernetes)."""

from __future__ import annotations

import os

from ansible_collections.constellation.cluster.plugins.module_utils import core as core_mod
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.join_provider import JoinProvider
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import generate_priv_key, pub_key_from_priv_key
from ansible_collections.constellation.cluster.tests.support.kubeadm_fixtures import KUBEADM_DOUBLE
from ansible_collections.constellation.cluster.tests.support.join_chain import kubeadm_coordinator, kubelet_node, make_csr


def test_removal_deletes_the_node_object_and_frees_its_name(apiserver, control_plane_dir, tmp_path):
    provider = JoinProvider(KUBEADM_DOUBLE, control_plane_dir)
    provider.kubeconfig = apiserver.kubeconfig  # the stand-in's address instead of admin.conf's
    coordinator = kubeadm_coordinator(tmp_path, provider)
    rows = {}
    for name in ("worker-0", "worker-1"):
        vpn_ip, csr = kubelet_node(coordinator, name)
        coordinator.kubernetes.kubelet_cert_for(csr, vpn_ip, "GetJoinArgs")
        rows[name] = (vpn_ip, csr)
    assert apiserver.node_names() == ["control-plane-0", "worker-0", "worker-1"]

    result = coordinator.removal.remove_node(public_ip="10.42.0.20")
    assert result["kubernetes_node_names"] == ["worker-0"]
    assert apiserver.node_names() == ["control-plane-0", "worker-1"]
    removed_ip = rows["worker-0"][0]
    # The removed Node is no peer: the vpnapi's PeerAuth finds no key recorded for its address (nothing more for it).
    assert coordinator.peer_access.vpn_peer_record(removed_ip) is None
    assert coordinator.peer_access.check_peer_proof(removed_ip, "10.118.0.1", os.urandom(32), os.urandom(32)) is None
    # Its name is free: the next node (here on the freed VPN IP, as the next activation gets it) may be certified.
    reused = coordinator.coordinator.reserve_node_ip()
    assert reused == removed_ip
    coordinator.activation.record_node(reused, pub_key_from_priv_key(generate_priv_key()), "10.42.0.22",
                                       core_mod.new_disk_uuid())
    new_csr, _key = make_csr(cn="system:node:worker-0", sans=("worker-0", reused))
    assert coordinator.kubernetes.kubelet_cert_for(new_csr, reused, "GetJoinArgs")["node_name"] == "worker-0"
