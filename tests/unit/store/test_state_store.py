"""Peer state, node state and KMS settings through every store, including re-opening."""

from __future__ import annotations

import base64
import ipaddress
import json
import os

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.core.records import state_store
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_record import PeerRecord
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_set import PeerRegistry
from ansible_collections.constellation.cluster.plugins.module_utils.store import MemoryStore, StoreError, transfer
from ansible_collections.constellation.cluster.tests.support.threads import run_in_threads


def _key(n: int) -> str:
    return base64.b64encode(bytes([n]) * 32).decode()


def _registry() -> PeerRegistry:
    reg = PeerRegistry(max_log_changes=4)
    reg.add(_key(1), "192.0.2.1", "coordinator")
    for n in range(2, 8):
        reg.add(_key(n), "192.0.2.%d" % n, "node")
    reg.add(_key(50), None, "admin")
    reg.remove("10.118.0.12")
    reg.remove("10.118.0.14")
    return reg


def test_peer_state_round_trip_and_reopen(store_factory):
    reg = _registry()
    state_store.save_peer_state(store_factory(), reg.to_dict())
    loaded = state_store.load_peer_state(store_factory())  # a second handle: a restarted agent
    assert loaded == reg.to_dict()
    again = PeerRegistry.from_dict(loaded)
    assert again.peers.version == reg.peers.version
    assert again.allocator.to_dict()["free_node_ips"] == ["10.118.0.12", "10.118.0.14"]
    # The reloaded registry behaves like the original: freed IPs are reused first, deltas work.
    assert again.add(_key(60), "192.0.2.60", "node").vpn_ip == "10.118.0.12"
    assert again.peers.updates_since(reg.peers.version).added[0].vpn_ip == "10.118.0.12"


def test_peer_state_uses_the_coordinator_key_layout(store):
    reg = _registry()
    state_store.save_peer_state(store, reg)
    assert store.get("peersResourceVersion") == str(reg.peers.version).encode()
    peer = json.loads(store.get("peerPrefix10.118.0.1"))
    assert peer == {"PublicIP": "192.0.2.1", "VPNIP": "10.118.0.1", "VPNPubKey": _key(1), "Role": "Coordinator"}
    assert json.loads(store.get("peerPrefix10.118.0.17"))["Role"] == "Admin"
    assert ipaddress.IPv4Address(store.get("highestAvailableNodeIP")) == ipaddress.IPv4Address("10.118.0.18")
    assert ipaddress.IPv4Address(store.get("highestAvailableCoordinatorIP")) == ipaddress.IPv4Address("10.118.0.2")
    assert [k for k, dummy in store.items("freeNodeVPNIPs")] == ["freeNodeVPNIPs10.118.0.12", "freeNodeVPNIPs10.118.0.14"]
    assert store.items("peerPrefix10.118.0.12") == []


def test_saving_again_writes_only_the_difference(store):
    reg = _registry()
    state_store.save_peer_state(store, reg)
    before = dict(store.items(""))
    reg.add(_key(70), "192.0.2.70", "node")  # takes the freed 10.118.0.12
    state_store.save_peer_state(store, reg)
    after = dict(store.items(""))
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert changed == {"peerPrefix10.118.0.12", "freeNodeVPNIPs10.118.0.12", "peersResourceVersion",
                       "peersChangeLog"}
    assert state_store.load_peer_state(store) == reg.to_dict()


def test_no_saved_state(store):
    assert state_store.load_peer_state(store) is None
    assert state_store.load_peer_registry(store) is None
    assert state_store.load_node_state(store) is None
    assert state_store.load_kms_data(store) is None


def test_update_peer_registry_loses_no_peer(store_factory):
    """8 threads, each with its own handle, add peers through read-modify-write transactions."""

    def work(n):
        own = store_factory()
        for i in range(4):
            state_store.update_peer_registry(own, lambda reg: reg.add(_key(10 + n * 4 + i), None, "admin"))

    run_in_threads(work, 8, 120)
    reg = state_store.load_peer_registry(store_factory())
    assert len(reg.peers) == 32 and reg.peers.version == 32
    assert sorted(reg.peers.peers, key=lambda a: int(ipaddress.ip_address(a))) == \
        ["10.118.0.%d" % i for i in range(11, 43)]


def test_inconsistent_stored_peer_state_is_refused(store):
    state_store.save_peer_state(store, _registry())
    store.delete("highestAvailableNodeIP")
    with pytest.raises(StoreError, match="peer state is inconsistent"):
        state_store.load_peer_state(store)
    state_store.save_peer_state(store, _registry())
    store.put("peerPrefix10.118.0.99", PeerRecord.parse("10.118.0.99", _key(99)).to_store_value())
    with pytest.raises(StoreError, match="inconsistent"):  # an IP the allocator never handed out
        state_store.load_peer_state(store)


@pytest.mark.parametrize("state", [None, "x", {}, {"allocator": {}, "peers": {}}])
def test_bad_peer_state_input(state):
    store = MemoryStore()
    with pytest.raises(InputError):
        state_store.save_peer_state(store, state)
    assert store.items("") == []


NODE = {"role": "coordinator", "vpn_ip": "10.118.0.1", "vpn_priv_key": base64.b64encode(os.urandom(32)).decode(),
        "owner_id": base64.b64encode(b"o" * 32).decode(), "cluster_id": base64.b64encode(b"c" * 32).decode(),
        "disk_uuid": "1234"}


def test_node_state_and_kms_round_trip_through_transfer(store_factory):
    """Before activation the agent keeps state in memory; activation transfers it (docs/store.md, "Typed records")."""
    memory = MemoryStore()
    state_store.save_node_state(memory, NODE)
    kms = {"kms_uri": "kms://cluster-kms?salt=AAAA", "storage_uri": "storage://no-store", "key_encryption_key_id": ""}
    state_store.save_kms_data(memory, kms)
    state_store.save_peer_state(memory, _registry())
    transfer(memory, store_factory())
    reopened = store_factory()
    assert state_store.load_node_state(reopened) == NODE
    assert state_store.load_kms_data(reopened) == kms
    assert json.loads(reopened.get("KMSData")) == {"KmsUri": kms["kms_uri"], "StorageUri": "storage://no-store",
                                                   "KeyEncryptionKeyID": ""}
    assert state_store.load_peer_state(reopened) == _registry().to_dict()


@pytest.mark.parametrize("change, field", [
    ({"role": "boss"}, "node_state.role"), ({"vpn_ip": "10.118.0"}, "node_state.vpn_ip"),
    ({"vpn_priv_key": "short"}, "node_state.vpn_priv_key"), ({"vpn_priv_key": None}, "node_state.vpn_priv_key"),
    ({"cluster_id": base64.b64encode(b"x" * 31).decode()}, "node_state.cluster_id"),
    ({"extra": object()}, "node_state"),
])
def test_bad_node_state(change, field):
    store = MemoryStore()
    with pytest.raises(InputError) as info:
        state_store.save_node_state(store, dict(NODE, **change))
    assert str(info.value).startswith(field + ":")
    assert NODE["vpn_priv_key"] not in str(info.value)
    assert store.items("") == []


def test_bad_kms_data():
    store = MemoryStore()
    with pytest.raises(InputError, match="kms_data.kms_uri"):
        state_store.save_kms_data(store, {"kms_uri": ""})
    with pytest.raises(InputError, match="kms_data.storage_uri"):
        state_store.save_kms_data(store, {"kms_uri": "kms://cluster-kms", "storage_uri": 3})
    with pytest.raises(InputError, match="only kms_uri"):
        state_store.save_kms_data(store, {"kms_uri": "kms://cluster-kms", "master_secret": "x"})
    store.put("KMSData", b"not json")
    with pytest.raises(StoreError, match="KMS settings are invalid"):
        state_store.load_kms_data(store)


def test_move_cluster_keys_leaves_only_the_peers_own_state_local():
    """The first Coordinator's member starts: the cluster's keys go to etcd (here a second store), the
    node's own (node state, KMS settings, init secret) stay; nothing is in both."""
    from ansible_collections.constellation.cluster.plugins.module_utils.store import MemoryStore as Memory

    local, cluster = Memory(), Memory()
    for key in sorted(state_store.LOCAL_KEYS) + ["peersResourceVersion", "peer10.118.0.1", "nodeDiskUUID10.118.0.11"]:
        local.put(key, key.encode())
    assert state_store.move_cluster_keys(local, cluster) == 3
    assert sorted(k for k, _v in local.items("")) == sorted(state_store.LOCAL_KEYS)
    assert sorted(k for k, _v in cluster.items("")) == ["nodeDiskUUID10.118.0.11", "peer10.118.0.1",
                                                        "peersResourceVersion"]
    assert cluster.get("peer10.118.0.1") == b"peer10.118.0.1"
    assert state_store.move_cluster_keys(local, cluster) == 0  # nothing left to move
