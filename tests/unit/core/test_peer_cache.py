# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Coordinator's peer registry in memory (core/registry/cache.py): polls and the known-peer check never
touch the store, a restart reloads once, writes reach memory only once committed, concurrent writes are
all visible."""

from __future__ import annotations

import os
import threading

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.module_utils.core.records import state_store
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.cache import PeerRegistryCache
from ansible_collections.constellation.cluster.plugins.module_utils.errors import StateError
from ansible_collections.constellation.cluster.plugins.module_utils.store import MemoryStore, StoreError
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import generate_priv_key, pub_key_from_priv_key


class CountingStore:
    """A store that counts every access (reads, writes, transactions) and can be made to fail commits."""

    def __init__(self, inner=None):
        self.inner = inner if inner is not None else MemoryStore()
        self.calls = 0
        self.fail_commits = False

    def _count(self):
        self.calls += 1

    def get(self, key):
        self._count()
        return self.inner.get(key)

    def get_default(self, key, default=None):
        self._count()
        return self.inner.get_default(key, default)

    def peek(self, key, default=None):
        return self.get_default(key, default)

    def items(self, prefix=""):
        self._count()
        return self.inner.items(prefix)

    def put(self, key, value):
        self._count()
        self.inner.put(key, value)

    def delete(self, key):
        self._count()
        self.inner.delete(key)

    def transaction(self):
        self._count()
        return self.inner.transaction()

    def update(self, fn, attempts=50):
        self._count()
        if self.fail_commits:
            def failing(tx):
                fn(tx)
                raise StoreError("etcd is unreachable (test)")
            return self.inner.update(failing, attempts)
        return self.inner.update(fn, attempts)

    def close(self):
        self.inner.close()


def _key():
    return pub_key_from_priv_key(generate_priv_key())


def _admin_pem():
    return ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


@pytest.fixture
def coordinator(swtpm, make_core):
    store = CountingStore()
    c, _vpn = make_core(swtpm, store=store)
    c.recovery.load()
    c.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), _admin_pem())
    return c, store


def test_no_change_poll_and_known_peer_check_do_not_touch_the_store(coordinator):
    c, store = coordinator
    node_ip = c.coordinator.reserve_node_ip()
    version = c.coordinator.add_node_peer(node_ip, _key(), "10.42.0.20")
    before = store.calls
    for _poll in range(100):
        assert c.coordinator.get_update(version) == {"resource_version": version}
        assert c.coordinator.is_known_peer_ip(node_ip)
        assert not c.coordinator.is_known_peer_ip("10.118.9.9")
    assert store.calls == before
    # A node behind gets its delta, still from memory.
    assert [p["vpn_ip"] for p in c.coordinator.get_update(version - 1)["added"]] == [node_ip]
    assert store.calls == before


def test_writes_go_through_the_store_and_a_restart_reloads_once(coordinator, swtpm, make_core):
    c, store = coordinator
    ips = [c.coordinator.reserve_node_ip() for _i in range(3)]
    for n, ip in enumerate(ips):
        version = c.coordinator.add_node_peer(ip, _key(), "10.42.0.%d" % (20 + n))
    # What memory holds is what the store holds.
    assert state_store.load_peer_registry(store.inner).to_dict() == c.context.peer_registry.current().to_dict()
    restarted_store = CountingStore(store.inner)
    again, vpn = make_core(swtpm, store=restarted_store, disk_uuid=c.context.disk_uuid)
    again.recovery.load()
    after_load = restarted_store.calls
    assert sorted(p.vpn_ip for p in vpn.peers) == sorted(ips)
    for _poll in range(10):
        assert again.coordinator.get_update(version) == {"resource_version": version}
        assert all(again.coordinator.is_known_peer_ip(ip) for ip in ips)
    assert restarted_store.calls == after_load


def test_a_failed_commit_changes_nothing_in_memory(coordinator):
    c, store = coordinator
    registry = c.context.peer_registry.current()
    version = registry.peers.version
    store.fail_commits = True
    with pytest.raises(StoreError):
        c.coordinator.add_node_peer("10.118.0.11", _key(), "10.42.0.20")
    assert c.context.peer_registry.current() is registry and registry.peers.version == version
    assert not c.coordinator.is_known_peer_ip("10.118.0.11")
    store.fail_commits = False
    with pytest.raises(StateError):  # a write refused by its own check publishes nothing either
        c.coordinator.add_node_peer("10.118.0.11", c.context.vpn_pub_key, "10.42.0.20")  # the Coordinator's own key
    assert c.context.peer_registry.current() is registry


def test_concurrent_writes_are_all_visible_and_readers_see_whole_versions(coordinator):
    c, store = coordinator
    errors = []
    stop = threading.Event()

    def reader():
        # A published registry is never changed: its version and its peers always agree with the store's.
        while not stop.is_set():
            registry = c.context.peer_registry.current()
            version = registry.peers.version
            if len(registry.peers) != version:  # one peer per version here (the Coordinator is v1)
                errors.append((version, len(registry.peers)))

    def writer(n):
        try:
            for _i in range(8):
                c.coordinator.add_node_peer(c.coordinator.reserve_node_ip(), _key(), "10.42.1.%d" % n)
        except Exception as err:  # pylint: disable=broad-except
            errors.append(err)

    readers = [threading.Thread(target=reader) for _r in range(2)]
    writers = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for thread in readers + writers:
        thread.start()
    for thread in writers:
        thread.join()
    stop.set()
    for thread in readers:
        thread.join()
    assert not errors
    current = c.context.peer_registry.current()
    assert len(current.peers) == 1 + 6 * 8
    assert current.to_dict() == state_store.load_peer_registry(store.inner).to_dict()
    assert all(c.coordinator.is_known_peer_ip(ip) for ip in current.peers.peers)


def test_the_cache_alone_reads_once_and_reload_sees_the_store():
    store = CountingStore()
    cache = PeerRegistryCache(store)
    assert cache.current() is None
    calls = store.calls
    assert cache.current() is None and store.calls == calls  # "nothing saved" is remembered too
    added = cache.update(lambda r: r.add(_key(), "10.42.0.1", "coordinator"))
    assert cache.is_known_peer_ip(added.vpn_ip)
    state_store.update_peer_registry(store.inner, lambda r: r.add(_key(), "10.42.0.2", "node"))  # another writer
    assert len(cache.current().peers) == 1
    assert len(cache.reload().peers) == 2


class FailingReads(CountingStore):
    """A store that can stop answering reads (an etcd that lost its majority)."""

    def __init__(self, inner=None):
        super().__init__(inner)
        self.down = False

    def get_default(self, key, default=None):
        if self.down:
            raise StoreError("etcd has no quorum (test)")
        return super().get_default(key, default)


def test_a_coordinator_sharing_the_store_follows_what_another_one_wrote():
    """Several Coordinators on one etcd cluster (#18): the same version means the same peer set on each."""
    shared = MemoryStore()
    writer = PeerRegistryCache(shared, shared=True)
    follower_store = FailingReads(shared)
    follower = PeerRegistryCache(follower_store, shared=True, follow_interval=0)  # every read checks
    alone = PeerRegistryCache(shared, shared=False)  # one Coordinator per store: reads never touch it
    writer.update(lambda registry: registry.add(_key(), "10.42.0.20", "node"), "10.118.0.0/16")
    for cache in (follower, alone):
        assert cache.current().peers.version == writer.current().peers.version
    second = writer.update(lambda registry: registry.add(_key(), "10.42.0.21", "node"))
    assert follower.current().to_dict() == writer.current().to_dict()
    assert follower.is_known_peer_ip(second.vpn_ip)
    assert not alone.is_known_peer_ip(second.vpn_ip)  # the single-Coordinator cache does not look
    # A follower that cannot read the store serves the registry it holds: the mesh stays up.
    held = follower.current().to_dict()
    follower_store.down = True
    writer.update(lambda registry: registry.add(_key(), "10.42.0.22", "node"))
    assert follower.current().to_dict() == held != writer.current().to_dict()
    follower_store.down = False
    assert follower.current().to_dict() == writer.current().to_dict()


def test_only_an_etcd_store_of_several_endpoints_counts_as_shared():
    from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.cache import shared_by_coordinators

    class Endpoints:
        def __init__(self, endpoints):
            self.endpoints = endpoints

    assert not shared_by_coordinators(MemoryStore())
    assert not shared_by_coordinators(Endpoints(["http://127.0.0.1:2379"]))
    assert shared_by_coordinators(Endpoints(["https://10.118.0.1:2379", "https://10.118.0.2:2379"]))


def test_a_follower_checks_the_shared_version_at_most_once_per_interval():
    """A burst of polls shares one read of the stored version; after the interval the next read looks
    again and finds what another Coordinator committed."""
    shared = MemoryStore()
    now = [100.0]
    writer = PeerRegistryCache(shared, shared=True)
    follower_store = CountingStore(shared)
    follower = PeerRegistryCache(follower_store, shared=True, follow_interval=0.1, clock=lambda: now[0])
    writer.update(lambda registry: registry.add(_key(), "10.42.0.20", "node"), "10.118.0.0/16")
    follower.current()  # loads
    reads = follower_store.calls
    follower.current()  # the first check
    checked = follower_store.calls
    assert checked == reads + 1
    second = writer.update(lambda registry: registry.add(_key(), "10.42.0.21", "node"))
    for dummy in range(50):
        assert not follower.is_known_peer_ip(second.vpn_ip)  # within the interval: no read, not seen yet
    assert follower_store.calls == checked
    now[0] += 0.2
    assert follower.is_known_peer_ip(second.vpn_ip)  # the interval passed: checked, reloaded
    assert follower.current().to_dict() == writer.current().to_dict()
