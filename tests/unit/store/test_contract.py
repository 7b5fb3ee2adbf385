"""One contract, three stores: memory, file and a real etcd."""

from __future__ import annotations

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError
from ansible_collections.constellation.cluster.plugins.module_utils.store import (
    KeyNotFound,
    MemoryStore,
    transfer,
)
from ansible_collections.constellation.cluster.tests.support.threads import run_in_threads


def test_put_get_overwrite(store):
    store.put("a", b"1")
    assert store.get("a") == b"1"
    store.put("a", b"\x00\xffbinary")
    assert store.get("a") == b"\x00\xffbinary"
    store.put("empty", b"")
    assert store.get("empty") == b""
    assert store.get_default("empty", b"x") == b""


def test_missing_key(store):
    with pytest.raises(KeyNotFound) as info:
        store.get("nope")
    assert isinstance(info.value, KeyError) and isinstance(info.value, ConstellationError)
    assert "nope" in str(info.value)
    assert store.get_default("nope") is None
    assert store.get_default("nope", b"d") == b"d"


def test_delete(store):
    store.put("a", b"1")
    store.delete("a")
    assert store.get_default("a") is None
    store.delete("a")  # missing: no error
    store.delete("never-set")


def test_items_sorted_and_prefix_isolated(store):
    for key in ("peerPrefix10.118.0.2", "peerPrefix10.118.0.1", "peersResourceVersion", "peer", "zzz", "unicodé"):
        store.put(key, key.encode())
    assert store.items("peerPrefix") == [("peerPrefix10.118.0.1", b"peerPrefix10.118.0.1"),
                                         ("peerPrefix10.118.0.2", b"peerPrefix10.118.0.2")]
    expected = ["peer", "peerPrefix10.118.0.1", "peerPrefix10.118.0.2", "peersResourceVersion"]
    assert [k for k, dummy in store.items("peer")] == expected
    everything = store.items("")
    assert [k for k, dummy in everything] == sorted(k for k, dummy in everything)
    assert len(everything) == 6
    assert store.items("nothing-here") == []


def test_second_handle_sees_data(store_factory):
    first = store_factory()
    first.put("k", b"v")
    second = store_factory()
    assert second.get("k") == b"v"
    second.delete("k")
    assert first.get_default("k") is None


def test_transaction_commits_and_sees_own_writes(store):
    store.put("keep", b"old")
    store.put("gone", b"x")
    with store.transaction() as tx:
        tx.put("new", b"n")
        tx.put("keep", b"kept")
        tx.delete("gone")
        assert tx.get("new") == b"n"
        assert tx.get_default("gone") is None
        assert tx.items("") == [("keep", b"kept"), ("new", b"n")]
        with pytest.raises(KeyNotFound):
            tx.get("gone")
    assert store.items("") == [("keep", b"kept"), ("new", b"n")]


def test_transaction_rolls_back_on_exception(store):
    store.put("a", b"1")

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with store.transaction() as tx:
            tx.put("a", b"2")
            tx.put("b", b"2")
            tx.delete("a")
            raise Boom()
    assert store.items("") == [("a", b"1")]


def _increment(tx):
    value = int(tx.get_default("counter", b"0"))
    tx.put("counter", str(value + 1).encode())
    items = tx.items("log/")
    tx.put("log/%06d" % len(items), b"")


def test_concurrent_increments_shared_handle(store):
    """8 threads x 25 read-modify-write transactions on one handle: no update lost."""

    def work(_index):
        for dummy in range(25):
            with store.transaction() as tx:
                _increment(tx)

    run_in_threads(work, 8, 60)
    assert store.get("counter") == b"200"
    assert len(store.items("log/")) == 200


def test_concurrent_increments_separate_handles(store_factory):
    """8 threads, each with its own handle (for etcd: its own client, so commits really race;
    ``update`` retries the conflicts): no update lost."""

    def work(_index):
        own = store_factory()
        for dummy in range(15):
            own.update(_increment)

    run_in_threads(work, 8, 120)
    check = store_factory()
    assert check.get("counter") == b"120"
    assert [k for k, dummy in check.items("log/")] == ["log/%06d" % i for i in range(120)]


def test_update_returns_result_and_validates_attempts(store):
    assert store.update(lambda tx: tx.put("x", b"1") or 42) == 42
    assert store.get("x") == b"1"
    with pytest.raises(InputError):
        store.update(lambda tx: None, attempts=0)


@pytest.mark.parametrize("key", [None, 1, b"bytes", ""])
def test_bad_keys(store, key):
    for call in (lambda: store.get(key), lambda: store.put(key, b"v"), lambda: store.delete(key),
                 lambda: store.get_default(key)):
        with pytest.raises(InputError) as info:
            call()
        assert "key" in str(info.value)


@pytest.mark.parametrize("value", ["text", None, 5, ["b"]])
def test_bad_values(store, value):
    with pytest.raises(InputError) as info:
        store.put("k", value)
    assert "value: expected bytes" in str(info.value)
    with pytest.raises(InputError):
        with store.transaction() as tx:
            tx.put("k", value)
    assert store.get_default("k") is None


def test_bad_prefix(store):
    with pytest.raises(InputError):
        store.items(None)


def test_bytearray_is_accepted(store):
    store.put("k", bytearray(b"ab"))
    assert store.get("k") == b"ab"


def test_transfer_from_memory(store):
    src = MemoryStore({"masterSecret": b"\x01" * 32, "peersResourceVersion": b"3", "peerPrefix10.118.0.1": b"{}"})
    store.put("peersResourceVersion", b"1")
    store.put("only-in-destination", b"stays")
    assert transfer(src, store) == 3
    assert dict(store.items("")) == {"masterSecret": b"\x01" * 32, "peersResourceVersion": b"3",
                                     "peerPrefix10.118.0.1": b"{}", "only-in-destination": b"stays"}
