"""Pod CIDRs (docs/wireguard.md, "Pod CIDRs"): the allocator, the records and signed peer sets that carry them, the
registry that hands them out next to the VPN IPs, and the WireGuard AllowedIPs they add."""

from __future__ import annotations

import ipaddress
import json

import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.constellation.cluster.plugins.module_utils import wireguard as wgmod
from ansible_collections.constellation.cluster.plugins.module_utils.core import signing
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_record import PeerRecord
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_set import PeerRegistry, PeerUpdate
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.pod_cidrs import PodCIDRAllocator
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError

KEYS = [wgmod.pub_key_from_priv_key(wgmod.generate_priv_key()) for dummy_i in range(12)]


# ---------------------------------------------------------------- the allocator

def test_defaults_lowest_free_first_and_round_trip():
    alloc = PodCIDRAllocator()
    assert [alloc.allocate() for dummy_i in range(3)] == ["10.244.0.0/24", "10.244.1.0/24", "10.244.2.0/24"]
    alloc.release("10.244.1.0/24")
    alloc.release("10.244.0.0/24")
    assert alloc.allocate() == "10.244.0.0/24"
    copy = PodCIDRAllocator.from_dict(json.loads(json.dumps(alloc.to_dict())))
    assert copy.to_dict() == alloc.to_dict() == {"cluster_pod_cidr": "10.244.0.0/16", "node_pod_cidr_mask_size": 24,
                                                 "next_pod_cidr": "10.244.3.0/24", "free_pod_cidrs": ["10.244.1.0/24"]}
    assert copy.allocate() == "10.244.1.0/24" and copy.allocate() == "10.244.3.0/24"


def test_exhaustion_names_the_range():
    alloc = PodCIDRAllocator("10.245.0.0/23", 24)
    alloc.allocate()
    alloc.allocate()
    with pytest.raises(StateError, match=r"10\.245\.0\.0/23"):
        alloc.allocate()
    assert alloc.to_dict()["next_pod_cidr"] is None
    assert PodCIDRAllocator.from_dict(alloc.to_dict()).to_dict() == alloc.to_dict()


@pytest.mark.parametrize("cidr, mask, field, expected", [
    ("10.244.0.1/16", 24, "cluster_pod_cidr", "no host bits"),
    ("pods", 24, "cluster_pod_cidr", "no host bits"),
    ("10.118.0.0/17", 24, "cluster_pod_cidr", "VPN CIDR"),
    ("10.0.0.0/8", 24, "cluster_pod_cidr", "VPN CIDR"),
    ("10.244.0.0/16", 15, "node_pod_cidr_mask_size", r"between 16 \(.*\) and 30"),
    ("10.244.0.0/16", 31, "node_pod_cidr_mask_size", r"between 16 \(.*\) and 30"),
    ("10.244.0.0/16", "24", "node_pod_cidr_mask_size", "integer"),
    ("10.244.0.0/16", True, "node_pod_cidr_mask_size", "integer"),
])
def test_bad_range_names_the_field(cidr, mask, field, expected):
    with pytest.raises(InputError, match=expected) as err:
        PodCIDRAllocator(cidr, mask)
    assert err.value.field == field


def test_reserve_and_foreign_blocks():
    alloc = PodCIDRAllocator()
    alloc.reserve("10.244.3.0/24")
    assert [alloc.allocate() for dummy_i in range(4)] == ["10.244.0.0/24", "10.244.1.0/24", "10.244.2.0/24",
                                                          "10.244.4.0/24"]
    with pytest.raises(StateError, match="already in use"):
        alloc.reserve("10.244.3.0/24")
    for bad in ("10.245.0.0/24", "10.244.0.0/25", "10.244.0.1/24"):
        with pytest.raises(InputError, match="a /24 block of 10.244.0.0/16"):
            alloc.in_use(bad)


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=20, max_value=26),
       st.lists(st.tuples(st.booleans(), st.integers(min_value=0, max_value=63)), max_size=80))
def test_property_blocks_disjoint_lowest_free_first_and_persisted(mask, steps):
    """Whatever the order of allocations and releases: the blocks in use never overlap, all lie inside the
    range, an allocation takes the lowest block not in use, and the persisted form gives the same allocator."""
    alloc = PodCIDRAllocator("10.244.0.0/20", mask)
    held: list[str] = []
    for allocate, pick in steps:
        if allocate or not held:
            free_indices = [i for i in range(alloc.count) if alloc._network(i) not in held]
            if not free_indices:
                with pytest.raises(StateError):
                    alloc.allocate()
                continue
            got = alloc.allocate()
            assert got == alloc._network(min(free_indices))
            held.append(got)
        else:
            alloc.release(held.pop(pick % len(held)))
        nets = [ipaddress.ip_network(c) for c in held]
        assert all(n.subnet_of(alloc.cidr) and n.prefixlen == mask for n in nets)
        assert not any(a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1:])
        assert all(alloc.in_use(c) for c in held)
        copy = PodCIDRAllocator.from_dict(json.loads(json.dumps(alloc.to_dict())))
        assert copy.to_dict() == alloc.to_dict()


# ---------------------------------------------------------------- records and signed peer sets

def test_record_carries_pod_cidr_only_when_it_has_one():
    plain = PeerRecord.parse("10.118.0.11", KEYS[0], "10.42.0.11")
    assert "pod_cidr" not in plain.to_dict() and b"PodCIDR" not in plain.to_store_value()
    withpod = plain.with_pod_cidr("10.244.1.0/24")
    assert withpod.to_dict()["pod_cidr"] == "10.244.1.0/24"
    assert json.loads(withpod.to_store_value())["PodCIDR"] == "10.244.1.0/24"
    assert PeerRecord.from_store_value(withpod.to_store_value()) == withpod
    assert PeerRecord.from_dict(withpod.to_dict()) == withpod
    assert PeerUpdate.from_dict(PeerUpdate(3, True, (withpod,)).to_dict()).added == (withpod,)
    with pytest.raises(InputError) as err:
        PeerRecord.parse("10.118.0.11", KEYS[0], "10.42.0.11", pod_cidr="10.244.1.1/24")
    assert err.value.field == "peer.pod_cidr"


def test_signature_covers_pod_cidr_and_is_unchanged_without():
    plain = PeerRecord.parse("10.118.0.11", KEYS[0], "10.42.0.11")
    payload = signing.peers_payload(4, [plain])
    assert payload == {"resource_version": 4, "peers": [{"vpn_ip": "10.118.0.11", "vpn_pub_key": KEYS[0],
                                                         "public_ip": "10.42.0.11", "role": "node"}]}
    moved = signing.peers_payload(4, [plain.with_pod_cidr("10.244.9.0/24")])
    assert moved != payload and moved["peers"][0]["pod_cidr"] == "10.244.9.0/24"


# ---------------------------------------------------------------- the registry

def _registry_with_pods() -> PeerRegistry:
    reg = PeerRegistry()
    reg.use_pod_cidrs("10.244.0.0/16", 24)
    return reg


def test_registry_allocates_with_vpn_ip_and_frees_on_removal():
    reg = _registry_with_pods()
    coordinator = reg.add(KEYS[0], "10.42.0.1", "coordinator")
    admin = reg.add(KEYS[1], None, "admin")
    assert (coordinator.vpn_ip, coordinator.pod_cidr) == ("10.118.0.1", "10.244.0.0/24")
    assert admin.pod_cidr is None
    ip = reg.reserve()
    assert reg.pod_cidr_of(ip) == "10.244.1.0/24"
    reg.put_node(PeerRecord.parse(ip, KEYS[2], "10.42.0.12"))
    assert reg.peers.get(ip).pod_cidr == "10.244.1.0/24" and not reg.reserved_pod_cidrs
    failed = reg.reserve()
    reg.release_reserved(failed)
    assert not reg.pod_cidrs.in_use("10.244.2.0/24") and not reg.allocator.in_use(failed)
    reg.remove(ip)
    assert not reg.pod_cidrs.in_use("10.244.1.0/24")
    again = reg.reserve()
    assert reg.pod_cidr_of(again) == "10.244.1.0/24"  # freed, reused lowest first
    copy = PeerRegistry.from_dict(json.loads(json.dumps(reg.to_dict())))
    assert copy.to_dict() == reg.to_dict() and copy.pod_cidr_of(again) == "10.244.1.0/24"


def test_a_further_coordinator_gets_one_with_its_reserved_ip():
    reg = _registry_with_pods()
    reg.add(KEYS[0], "10.42.0.1", "coordinator")
    ip = reg.reserve("coordinator")
    assert (ip, reg.pod_cidr_of(ip)) == ("10.118.0.2", "10.244.1.0/24")
    reg.put_node(PeerRecord.parse(ip, KEYS[1], "10.42.0.2", "coordinator"))
    assert reg.peers.get(ip).pod_cidr == "10.244.1.0/24" and reg.peers.get(ip).role == "coordinator"


def test_put_node_keeps_the_cidr_it_holds():
    reg = _registry_with_pods()
    ip = reg.reserve()
    version = reg.put_node(PeerRecord.parse(ip, KEYS[2], "10.42.0.12"))
    assert reg.put_node(PeerRecord.parse(ip, KEYS[2], "10.42.0.12")) == version  # the same record again
    assert reg.peers.get(ip).pod_cidr == "10.244.0.0/24"


def test_registry_without_pod_network_hands_out_none():
    reg = PeerRegistry()
    assert reg.add(KEYS[0], "10.42.0.1", "coordinator").pod_cidr is None
    ip = reg.reserve()
    reg.put_node(PeerRecord.parse(ip, KEYS[2], "10.42.0.12"))
    assert reg.peers.get(ip).pod_cidr is None and "pod_cidrs" not in reg.to_dict()


def test_turning_the_pod_network_on_later_gives_every_member_one_in_one_version():
    reg = PeerRegistry()
    reg.add(KEYS[0], "10.42.0.1", "coordinator")
    reg.add(KEYS[1], None, "admin")
    reg.add(KEYS[2], "10.42.0.12", "node")
    before = reg.peers.version
    updated = reg.use_pod_cidrs("10.244.0.0/16", 24)
    assert [(r.vpn_ip, r.pod_cidr) for r in updated] == [("10.118.0.1", "10.244.0.0/24"), ("10.118.0.12", "10.244.1.0/24")]
    assert reg.peers.version == before + 1
    assert reg.use_pod_cidrs("10.244.0.0/16", 24) == [] and reg.peers.version == before + 1
    with pytest.raises(StateError, match="cannot change"):
        reg.use_pod_cidrs("10.245.0.0/16", 24)


def test_turning_on_fails_whole_when_the_members_do_not_fit():
    reg = PeerRegistry()
    for i in range(3):
        reg.add(KEYS[i], "10.42.0.%d" % (11 + i), "node")
    before = reg.to_dict()
    with pytest.raises(StateError, match="10.244.0.0/23"):
        reg.use_pod_cidrs("10.244.0.0/23", 24)
    assert reg.to_dict() == before


def test_inconsistent_persisted_pod_state_is_refused():
    reg = _registry_with_pods()
    reg.add(KEYS[0], "10.42.0.1", "coordinator")
    state = json.loads(json.dumps(reg.to_dict()))
    state["pod_cidrs"]["free_pod_cidrs"] = ["10.244.0.0/24"]
    with pytest.raises(InputError, match="marked in use"):
        PeerRegistry.from_dict(state)


# ---------------------------------------------------------------- WireGuard

def test_peer_allowed_ips_hold_vpn_ip_and_pod_cidr():
    peer = wgmod.Peer(KEYS[0], "10.118.0.12", "10.42.0.12:51820", 10, "10.244.1.0/24")
    assert peer.allowed_ips == "10.118.0.12/32,10.244.1.0/24"
    assert wgmod.wg_set_argv("wg0", wgmod.PeerDiff(added=(peer,)))[3:6] == ["peer", KEYS[0], "allowed-ips"]
    assert "AllowedIPs = 10.118.0.12/32,10.244.1.0/24" in wgmod.render_peers([peer])
    assert PeerRecord.parse("10.118.0.12", KEYS[0], "10.42.0.12", pod_cidr="10.244.1.0/24").to_peer() == peer


def _live(*peers):
    return wgmod.InterfaceState("wg0", None, 51820, 0, {
        p.pub_key: wgmod.LivePeer(p.pub_key, p.endpoint, tuple(sorted(allowed)), 0, 0, 0, p.persistent_keepalive)
        for p, allowed in peers})


def test_diff_compares_the_set_of_allowed_ips():
    peer = wgmod.Peer(KEYS[0], "10.118.0.12", "10.42.0.12:51820", 10, "10.244.1.0/24")
    same = _live((peer, ["10.244.1.0/24", "10.118.0.12/32"]))
    assert not wgmod.diff_peers([wgmod.PeerRequest(peer)], same)
    assert same.peers[KEYS[0]].to_peer() == peer
    without = _live((peer, ["10.118.0.12/32"]))
    assert wgmod.diff_peers([wgmod.PeerRequest(peer)], without).changed == (peer,)
    withdrawn = wgmod.Peer(KEYS[0], "10.118.0.12", "10.42.0.12:51820", 10)
    assert wgmod.diff_peers([wgmod.PeerRequest(withdrawn)], same).changed == (withdrawn,)
    # Another key taking over the pod CIDR replaces the old holder.
    other = wgmod.Peer(KEYS[1], "10.118.0.13", "10.42.0.13:51820", 10, "10.244.1.0/24")
    assert [p.pub_key for p in wgmod.diff_peers([wgmod.PeerRequest(other)], same).removed] == [KEYS[0]]


@pytest.mark.parametrize("pod_cidr, expected", [
    ("10.244.1.1/24", "no host bits"),
    ("10.118.5.0/24", "VPN CIDR"),
    ("0.0.0.0/0", "default route"),
    ("10.244.0.0/16", r"overlapping peers\[0\]\.pod_cidr"),
])
def test_peer_list_pod_cidr_errors_name_the_entry(pod_cidr, expected):
    items = [{"pub_key": KEYS[0], "vpn_ip": "10.118.0.11", "pod_cidr": "10.244.1.0/24"},
             {"pub_key": KEYS[1], "vpn_ip": "10.118.0.12", "pod_cidr": pod_cidr}]
    with pytest.raises(InputError, match=expected) as err:
        wgmod.parse_peer_list(items)
    assert err.value.field == "peers[1].pod_cidr"


def test_peer_list_takes_pod_cidr():
    items = [{"pub_key": KEYS[0], "vpn_ip": "10.118.0.11", "pod_cidr": "10.244.1.0/24"},
             {"pub_key": KEYS[1], "vpn_ip": "10.118.0.12"}]
    requests = wgmod.parse_peer_list(items)
    assert [r.peer.pod_cidr for r in requests] == ["10.244.1.0/24", None]


def test_store_round_trip_keeps_pod_cidrs_and_reservations():
    from ansible_collections.constellation.cluster.plugins.module_utils.core.records import state_store
    from ansible_collections.constellation.cluster.plugins.module_utils.store import MemoryStore

    store = MemoryStore()
    reg = _registry_with_pods()
    reg.add(KEYS[0], "10.42.0.1", "coordinator")
    reserved = reg.reserve()
    state_store.save_peer_state(store, reg)
    assert json.loads(store.get("peerPrefix10.118.0.1"))["PodCIDR"] == "10.244.0.0/24"
    assert json.loads(store.get("podCIDRAllocator"))["reserved"] == {reserved: "10.244.1.0/24"}
    assert state_store.load_peer_state(store) == reg.to_dict()
    plain = PeerRegistry()
    plain.add(KEYS[0], "10.42.0.1", "coordinator")
    state_store.save_peer_state(store, plain)
    assert store.get_default("podCIDRAllocator") is None
    assert state_store.load_peer_state(store) == plain.to_dict()
