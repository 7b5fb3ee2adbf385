# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Eviction (Kubernetes side): an eviction must reach Kubernetes. A real Core (Coordinator)
with its kubeadm provider on a control plane made by the kubeadm TEST DOUBLE and the STAND-IN for the
Kubernetes API server (tests/doubles/kube_apiserver.py, not Kubernetes): the evicted Node's Node object
is deleted (the stand-in sees the DELETE), its kubelet certificate is short-lived and a renewal by the
evicted Node gets nothing."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509

from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import AgentConfig
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AccessDenied, InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.join_provider import JoinProvider
from ansible_collections.constellation.cluster.tests.support.kubeadm_fixtures import KUBEADM_DOUBLE
from ansible_collections.constellation.cluster.tests.support.kube_standin import kubeconfig_for
from ansible_collections.constellation.cluster.tests.support.join_chain import kubeadm_coordinator, kubelet_node, make_csr

KUBELET_CERT_DAYS = 7  # kubeadm/join_provider.py's default (checked below)


def test_eviction_deletes_the_node_object_and_a_renewal_gets_no_certificate(apiserver, control_plane_dir, tmp_path):
    provider = JoinProvider(KUBEADM_DOUBLE, control_plane_dir)
    provider.kubeconfig = apiserver.kubeconfig  # the stand-in's address instead of admin.conf's
    coordinator = kubeadm_coordinator(tmp_path, provider)
    evicted_ip, csr = kubelet_node(coordinator, "worker-0")
    kept_ip, kept_csr = kubelet_node(coordinator, "worker-1")
    issued = coordinator.kubernetes.kubelet_cert_for(csr, evicted_ip, "GetJoinArgs")
    coordinator.kubernetes.kubelet_cert_for(kept_csr, kept_ip, "GetJoinArgs")
    assert apiserver.node_names() == ["control-plane-0", "worker-0", "worker-1"]

    coordinator.peer_trust.evict_peer(evicted_ip, "attestation failed: PCR 4 (test)")

    # The API server no longer has its Node object; the other Node keeps its own.
    assert apiserver.node_names() == ["control-plane-0", "worker-1"]
    # Its certificate runs out within days, and it cannot get another one (a renewal is a new CSR).
    cert = x509.load_pem_x509_certificate(issued["kubelet_cert"])
    assert cert.not_valid_after_utc - cert.not_valid_before_utc <= datetime.timedelta(days=KUBELET_CERT_DAYS, hours=2)
    with pytest.raises(AccessDenied) as err:
        coordinator.kubernetes.kubelet_cert_for(csr, evicted_ip, "GetJoinArgs")
    assert err.value.reason == "evicted"
    with pytest.raises(AccessDenied):
        coordinator.kubernetes.kubernetes_join_for(evicted_ip, "GetJoinArgs", csr)
    # The Node in good standing renews.
    assert coordinator.kubernetes.kubelet_cert_for(kept_csr, kept_ip, "GetJoinArgs")["node_name"] == "worker-1"


def test_delete_node_is_refused_to_a_kubeconfig_that_may_not_delete(apiserver, control_plane_dir, tmp_path):
    reader = kubeconfig_for(apiserver.admin_conf, apiserver.url, str(tmp_path / "reader.conf"),
                            client_groups=["system:nodes"])
    provider = JoinProvider(KUBEADM_DOUBLE, control_plane_dir, kubeconfig=reader)
    with pytest.raises(StateError, match="delete node worker-0: the API server answered 403"):
        provider.delete_node("worker-0")
    admin = JoinProvider(KUBEADM_DOUBLE, control_plane_dir, kubeconfig=apiserver.kubeconfig)
    assert admin.delete_node("worker-0") is True
    assert admin.delete_node("worker-0") is False  # already gone: not an error
    with pytest.raises(InputError):
        admin.delete_node("Not_A_Name")


def test_kubelet_cert_days_is_configurable_and_bounded(initialised, control_plane_dir):
    provider = JoinProvider(KUBEADM_DOUBLE, control_plane_dir, kubelet_cert_days=2)
    csr, _key = make_csr(sans=("worker-0", "10.118.0.11"))
    cert = x509.load_pem_x509_certificate(provider.kubelet_cert(csr, "10.118.0.11")["kubelet_cert"])
    assert cert.not_valid_after_utc - cert.not_valid_before_utc <= datetime.timedelta(days=2, hours=2)
    for bad in (0, 366, "7", True):
        with pytest.raises(InputError, match="kubelet_cert_days"):
            JoinProvider(KUBEADM_DOUBLE, control_plane_dir, kubelet_cert_days=bad)
    base = {"state_dir": "/tmp/x", "public_endpoint": "127.0.0.1:9000", "variant": "dummy",
            "insecure_unauthenticated_activation": True}
    with pytest.raises(InputError, match="kubelet_cert_days"):
        AgentConfig.from_mapping(dict(base, kubelet_cert_days=0))
    from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm import join_provider

    assert AgentConfig.from_mapping(base).kubelet_cert_days == join_provider.KUBELET_CERT_DAYS == KUBELET_CERT_DAYS
