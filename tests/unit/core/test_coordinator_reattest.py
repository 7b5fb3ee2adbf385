# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Coordinators re-attested by the leader, at the Core through its ports (no sockets, no etcd; the real etcd case is
tests/unit/store/test_shared_evictions.py): the leader re-attests the other Coordinators and evicts one
that fails attestation; one that is only unreachable is never evicted (the admin removes a dead
Coordinator: remove_coordinator.yml); the leader never re-attests or evicts itself."""

from __future__ import annotations

import os

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import expected_pcr15
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    AccessDenied, AttestationError, ConstellationError)
from ansible_collections.constellation.cluster.plugins.module_utils.agent.wiring import vpnapi_handlers
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import generate_priv_key, pub_key_from_priv_key

from ansible_collections.constellation.cluster.tests.support.core_fakes import FakePeerClient, MemoryTPM


@pytest.fixture
def leader(make_core):
    c, vpn = make_core(MemoryTPM(), public_ip="10.42.0.1")
    c.recovery.load()
    admin = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    c.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), admin)
    peers = {}
    for octet in (2, 3):
        key = pub_key_from_priv_key(generate_priv_key())
        vpn_ip = c.context.peer_registry.update(lambda r: r.allocator.allocate("coordinator"))
        c.coordinator.add_node_peer(vpn_ip, key, "10.42.0.%d" % octet, role="coordinator")
        peers["10.42.0.%d" % octet] = {"vpn_ip": vpn_ip, "vpn_pub_key": key, "state": "ActivatingNodes"}
    return c, vpn, peers


def test_a_tampered_coordinator_is_re_attested_and_evicted(leader):
    c, vpn, peers = leader
    ours = expected_pcr15(c.context.cluster_id)
    asked = []

    def connect(public_ip):
        asked.append(public_ip)
        if public_ip == "10.42.0.3":
            return FakePeerClient(error=AttestationError("measurements mismatch: PCR 11: expected aa, found bb"))
        return FakePeerClient(ours, peers[public_ip])

    rows = {r["public_ip"]: r for r in c.peer_trust.reattest_peers(connect)}
    assert sorted(asked) == ["10.42.0.2", "10.42.0.3"]  # the other Coordinators, never itself
    assert rows["10.42.0.3"]["outcome"] == "evicted" and rows["10.42.0.2"]["outcome"] == "passed"
    tampered = peers["10.42.0.3"]["vpn_ip"]
    assert not c.coordinator.is_known_peer_ip(tampered) and c.evictions.is_evicted(tampered)
    assert peers["10.42.0.3"]["vpn_pub_key"] not in [p.vpn_pub_key for p in vpn.peers]
    (eviction,) = c.get_state()["evicted"]
    assert eviction["role"] == "coordinator" and "PCR 11" in eviction["reason"]
    assert "evicted" in vpnapi_handlers(c).accept_check((tampered, 4000))
    with pytest.raises(AccessDenied):
        c.evictions.require_not_evicted(tampered, "GetDataKey")
    assert c.peer_trust.evict_peer(c.context.vpn_ip, "test") is None and c.coordinator.is_known_peer_ip(c.context.vpn_ip)


def test_an_unreachable_coordinator_is_never_evicted(leader):
    c, _vpn, peers = leader
    ours = expected_pcr15(c.context.cluster_id)

    def connect(public_ip):
        if public_ip == "10.42.0.2":
            return FakePeerClient(error=ConstellationError("cannot connect to 10.42.0.2:9000: timed out"))
        return FakePeerClient(ours, peers[public_ip])

    for _round in range(5):
        rows = {r["public_ip"]: r["outcome"] for r in c.peer_trust.reattest_peers(connect, unreachable_limit=3)}
        assert rows == {"10.42.0.2": "unreachable", "10.42.0.3": "passed"}
    assert c.get_state()["evicted"] == [] and c.coordinator.is_known_peer_ip(peers["10.42.0.2"]["vpn_ip"])


def test_a_coordinator_whose_activation_is_under_way_is_not_evicted(leader):
    """Recorded and locked to us, but its activation as Coordinator has not finished: no VPN IP in its
    GetState yet. That is not another identity (which would evict it and remove its learner member)."""
    c, _vpn, peers = leader
    ours = expected_pcr15(c.context.cluster_id)
    joining = dict(peers["10.42.0.3"], state="AcceptingInit", vpn_ip=None, vpn_pub_key=None)

    def connect(public_ip):
        return FakePeerClient(ours, joining if public_ip == "10.42.0.3" else peers[public_ip])

    rows = {r["public_ip"]: r for r in c.peer_trust.reattest_peers(connect, unreachable_limit=1)}
    assert rows["10.42.0.3"]["outcome"] == "unreachable" and "not finished" in rows["10.42.0.3"]["error"]
    assert c.get_state()["evicted"] == [] and c.coordinator.is_known_peer_ip(peers["10.42.0.3"]["vpn_ip"])
