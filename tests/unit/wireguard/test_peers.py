"""Versioned peer sets and VPN IP allocation (docs/wireguard.md, "Addresses and ports"; docs/store.md, "Typed records")."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.constellation.cluster.plugins.module_utils import wireguard as wgmod
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_set import PeerRegistry, PeerUpdate, VersionedPeerSet
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_record import PeerRecord, wireguard_peer_list
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.vpn_ips import VPNIPAllocator

KEYS = [wgmod.pub_key_from_priv_key(wgmod.generate_priv_key()) for dummy_i in range(40)]


def rec(i: int, public_ip: str | None = None, key: int | None = None) -> PeerRecord:
    return PeerRecord.parse("10.118.0.%d" % (11 + i), KEYS[i if key is None else key], public_ip or "10.42.0.%d" % (11 + i))


# ---------------------------------------------------------------- allocation

def test_allocation_ranges_and_reuse():
    alloc = VPNIPAllocator()
    assert [alloc.allocate("coordinator") for dummy_i in range(2)] == ["10.118.0.1", "10.118.0.2"]
    assert alloc.allocate("node") == "10.118.0.11"
    assert alloc.allocate("admin") == "10.118.0.12"
    assert alloc.allocate("node") == "10.118.0.13"
    alloc.release("10.118.0.12")
    alloc.release("10.118.0.11")
    assert alloc.allocate("node") == "10.118.0.11"  # freed first, lowest first
    assert alloc.allocate("node") == "10.118.0.12"
    assert alloc.allocate("node") == "10.118.0.14"
    alloc.release("10.118.0.1")
    assert alloc.allocate("coordinator") == "10.118.0.1"


def test_coordinator_range_exhausts():
    alloc = VPNIPAllocator()
    ips = [alloc.allocate("coordinator") for dummy_i in range(10)]
    assert ips[-1] == "10.118.0.10"
    with pytest.raises(StateError):
        alloc.allocate("coordinator")
    assert alloc.allocate("node") == "10.118.0.11"


def test_small_cidr_node_range_exhausts_before_broadcast():
    alloc = VPNIPAllocator("10.9.0.0/28")
    assert [alloc.allocate("node") for dummy_i in range(4)] == ["10.9.0.11", "10.9.0.12", "10.9.0.13", "10.9.0.14"]
    with pytest.raises(StateError):
        alloc.allocate("node")


def test_allocator_roundtrip_and_reserve():
    alloc = VPNIPAllocator()
    alloc.allocate("coordinator")
    alloc.reserve("10.118.0.15")
    assert alloc.allocate("node") == "10.118.0.11"
    with pytest.raises(StateError):
        alloc.reserve("10.118.0.15")
    alloc.release("10.118.0.15")
    copy = VPNIPAllocator.from_dict(json.loads(json.dumps(alloc.to_dict())))
    assert copy.to_dict() == alloc.to_dict()
    assert copy.allocate("node") == alloc.allocate("node") == "10.118.0.12"
    with pytest.raises(InputError):
        alloc.allocate("king")


# ---------------------------------------------------------------- versioned set

def test_no_change_answer_is_just_the_version():
    peers = VersionedPeerSet()
    v = peers.apply(put=[rec(i) for i in range(20)])
    assert v == 1
    update = peers.updates_since(v)
    assert not update and update.to_dict() == {"resource_version": 1}
    assert peers.put(rec(3)) == 1  # identical put is no change


def test_delta_is_net_change():
    peers = VersionedPeerSet()
    base = peers.apply(put=[rec(i) for i in range(5)])
    peers.put(rec(5))                     # added
    peers.put(rec(1, public_ip="10.42.9.9"))  # changed
    peers.remove("10.118.0.13")           # removed (i=2)
    peers.put(rec(6))
    peers.remove("10.118.0.17")           # added then removed: nothing
    update = peers.updates_since(base)
    assert update.resource_version == peers.version == 6 and not update.full
    assert [r.vpn_ip for r in update.added] == ["10.118.0.16"]
    assert update.removed == ("10.118.0.13",)
    assert [r.public_ip for r in update.changed] == ["10.42.9.9"]


def test_changed_back_is_no_change_but_new_version():
    peers = VersionedPeerSet()
    base = peers.apply(put=[rec(0)])
    peers.put(rec(0, public_ip="10.42.1.1"))
    peers.put(rec(0))
    update = peers.updates_since(base)
    assert update.resource_version == 3 and not update.added and not update.changed and not update.removed


def test_too_far_behind_or_ahead_gets_full_set():
    peers = VersionedPeerSet(max_log_changes=3)
    peers.apply(put=[rec(i) for i in range(3)])  # 3 changes in version 1
    for i in range(3, 6):
        peers.put(rec(i))
    update = peers.updates_since(1)
    assert not update.full and len(update.added) == 3
    full = peers.updates_since(0)
    assert full.full and len(full.added) == 6
    assert peers.updates_since(99).full


def test_duplicate_key_refused_and_nothing_changes():
    peers = VersionedPeerSet()
    peers.apply(put=[rec(0), rec(1)])
    before = peers.to_dict()
    with pytest.raises(InputError):
        peers.apply(put=[rec(2), PeerRecord.parse("10.118.0.40", KEYS[0])])
    assert peers.to_dict() == before


def test_record_validation_and_store_value():
    with pytest.raises(InputError) as err:
        PeerRecord.parse("10.118.0.11", "nope")
    assert err.value.field == "peer.vpn_pub_key"
    with pytest.raises(InputError):
        PeerRecord.parse("10.118.0.11", KEYS[0], role="king")
    admin = PeerRecord.parse("10.118.0.12", KEYS[1], None, "admin")
    assert admin.to_peer().endpoint is None
    assert rec(0).to_peer() == wgmod.Peer(KEYS[0], "10.118.0.11", "10.42.0.11:51820", 10)
    value = json.loads(admin.to_store_value())
    assert value == {"PublicIP": "", "VPNIP": "10.118.0.12", "VPNPubKey": KEYS[1], "Role": "Admin"}
    assert PeerRecord.from_store_value(admin.to_store_value()) == admin


def test_serialisation_keeps_deltas():
    peers = VersionedPeerSet(max_log_changes=8)
    base = peers.apply(put=[rec(i) for i in range(4)])
    peers.put(rec(4))
    peers.remove("10.118.0.11")
    copy = VersionedPeerSet.from_dict(json.loads(json.dumps(peers.to_dict())))
    assert copy.to_dict() == peers.to_dict()
    assert copy.updates_since(base) == peers.updates_since(base)
    assert PeerUpdate.from_dict(json.loads(json.dumps(copy.updates_since(base).to_dict()))) == peers.updates_since(base)


def test_registry_allocates_and_is_idempotent():
    reg = PeerRegistry()
    coord = reg.add(KEYS[0], "10.42.0.11", "coordinator")
    node = reg.add(KEYS[1], "10.42.0.12", "node")
    admin = reg.add(KEYS[2], None, "admin")
    assert (coord.vpn_ip, node.vpn_ip, admin.vpn_ip) == ("10.118.0.1", "10.118.0.11", "10.118.0.12")
    version = reg.peers.version
    assert reg.add(KEYS[1], "10.42.0.12", "node") == node and reg.peers.version == version
    reg.remove(node.vpn_ip)
    assert reg.add(KEYS[3], "10.42.0.13", "node").vpn_ip == "10.118.0.11"
    copy = PeerRegistry.from_dict(json.loads(json.dumps(reg.to_dict())))
    assert copy.to_dict() == reg.to_dict()
    assert copy.add(KEYS[4], "10.42.0.14", "node").vpn_ip == reg.add(KEYS[4], "10.42.0.14", "node").vpn_ip


ops = st.lists(st.tuples(st.sampled_from(["put", "remove", "batch"]), st.integers(0, 11), st.integers(0, 3)),
               max_size=40)


@settings(max_examples=60, deadline=None)
@given(ops=ops, max_log=st.integers(1, 12))
def test_any_client_converges(ops, max_log):
    """Whatever happened, a client at any past version that applies updates_since reaches the set."""
    peers = VersionedPeerSet(max_log_changes=max_log)
    history = {0: {}}
    for op, i, variant in ops:
        if op == "put":
            peers.put(rec(i, public_ip="10.42.%d.1" % variant, key=i))
        elif op == "remove":
            peers.remove("10.118.0.%d" % (11 + i))
        else:
            peers.apply(put=[rec(i, key=i), rec((i + 1) % 12, key=(i + 1) % 12)], remove=["10.118.0.%d" % (11 + (i + 5) % 12)])
        history[peers.version] = peers.peers
    for version, snapshot in history.items():
        update = peers.updates_since(version)
        assert update.apply_to(snapshot) == peers.peers
        assert update.resource_version == peers.version
        if version == peers.version:
            assert not update


def test_peer_set_feeds_the_wireguard_list_without_own_entry():
    peers = VersionedPeerSet()
    peers.apply(put=[rec(2), rec(0), rec(1), PeerRecord.parse("10.118.0.30", KEYS[30], None, "admin")])
    items = wireguard_peer_list(peers.peers.values(), own_pub_key=KEYS[1])
    assert [i["vpn_ip"] for i in items] == ["10.118.0.11", "10.118.0.13", "10.118.0.30"]
    assert items[0]["endpoint"] == "10.42.0.11:51820" and items[2]["endpoint"] is None
    requests = wgmod.parse_peer_list(items, own_pub_key=KEYS[1], exclusive=True)
    assert [r.peer.pub_key for r in requests] == [KEYS[0], KEYS[2], KEYS[30]]
