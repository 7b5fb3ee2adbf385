"""EtcdStore against a real etcd: conflicts, isolation, restarts, bad endpoints."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.store import (
    EtcdStore,
    StoreError,
    TransactionConflict,
    open_store,
)
from lab.etcd import Etcd, free_ports, tmpfs_dir


@pytest.fixture
def pair(etcd_server, etcd_prefix):
    first = EtcdStore([etcd_server.endpoint], prefix=etcd_prefix)
    second = EtcdStore([etcd_server.endpoint], prefix=etcd_prefix)
    yield first, second
    first.close()
    second.close()


def test_conflict_on_a_read_key(pair):
    first, second = pair
    first.put("counter", b"1")
    with pytest.raises(TransactionConflict):
        with first.transaction() as tx:
            value = int(tx.get("counter"))
            second.put("counter", b"10")
            tx.put("counter", str(value + 1).encode())
            tx.put("other", b"x")
    assert first.get("counter") == b"10"
    assert first.get_default("other") is None


def test_conflict_on_a_key_created_in_a_read_range(pair):
    first, second = pair
    with pytest.raises(TransactionConflict):
        with first.transaction() as tx:
            count = len(tx.items("peer/"))
            second.put("peer/b", b"")
            tx.put("count", str(count).encode())
    assert first.get_default("count") is None


def test_conflict_on_a_key_deleted_in_a_read_range(pair):
    first, second = pair
    first.put("peer/a", b"")
    first.put("peer/b", b"")
    with pytest.raises(TransactionConflict):
        with first.transaction() as tx:
            count = len(tx.items("peer/"))
            second.delete("peer/a")
            tx.put("count", str(count).encode())
    assert first.get_default("count") is None


def test_a_key_absent_when_read_then_created_conflicts(pair):
    first, second = pair
    with pytest.raises(TransactionConflict):
        with first.transaction() as tx:
            assert tx.get_default("lock") is None
            second.put("lock", b"theirs")
            tx.put("lock", b"mine")
    assert first.get("lock") == b"theirs"


def test_unrelated_writes_do_not_conflict(pair):
    first, second = pair
    first.put("a", b"1")
    with first.transaction() as tx:
        value = tx.get("a")
        second.put("b", b"2")
        second.put("zzz/other", b"3")
        tx.put("a", value + b"1")
    assert first.get("a") == b"11"


def test_reads_in_a_transaction_see_one_snapshot(pair):
    first, second = pair
    first.put("x", b"1")
    first.put("y", b"1")
    with first.transaction() as tx:
        assert tx.get("x") == b"1"
        second.put("y", b"2")
        assert tx.get("y") == b"1"  # the snapshot, not the newer value
    assert first.get("y") == b"2"


def test_update_retries_a_conflict(pair):
    first, second = pair
    first.put("n", b"0")
    calls = []

    def bump(tx):
        value = int(tx.get("n"))
        if not calls:
            second.put("n", b"5")  # an interfering writer, the first time only
        calls.append(value)
        tx.put("n", str(value + 1).encode())

    first.update(bump)
    assert calls == [0, 5]
    assert first.get("n") == b"6"


def test_prefixes_are_isolated(etcd_server, etcd_prefix):
    one = EtcdStore([etcd_server.endpoint], prefix=etcd_prefix + "one/")
    two = EtcdStore([etcd_server.endpoint], prefix=etcd_prefix + "two/")
    one.put("masterSecret", b"secret-one")
    one.put("peerPrefix10.118.0.1", b"{}")
    assert two.get_default("masterSecret") is None
    assert two.items("") == []
    two.put("masterSecret", b"secret-two")
    two.delete("peerPrefix10.118.0.1")
    assert one.get("masterSecret") == b"secret-one"
    assert one.items("") == [("masterSecret", b"secret-one"), ("peerPrefix10.118.0.1", b"{}")]


def test_data_survives_an_etcd_restart():
    base = tempfile.mkdtemp(prefix="store-etcd-restart-", dir=tmpfs_dir())
    client_port, peer_port = free_ports(2)
    server = Etcd(os.path.join(base, "data"), client_port, peer_port)
    try:
        server.start()
        store = open_store({"type": "etcd", "endpoints": [server.endpoint], "prefix": "constellation/"})
        with store.transaction() as tx:
            tx.put("peersResourceVersion", b"7")
            tx.put("masterSecret", b"\x00" * 32)
        store.close()
        server.stop()
        with pytest.raises(StoreError, match="unreachable"):
            EtcdStore([server.endpoint])
        server.start()
        again = EtcdStore([server.endpoint], prefix="constellation/")
        assert again.items("") == [("masterSecret", b"\x00" * 32), ("peersResourceVersion", b"7")]
        # A crash (SIGKILL) loses nothing that was committed either.
        again.put("after", b"crash")
        server.kill()
        server.start()
        assert again.get("after") == b"crash"  # the same handle reconnects
        again.close()
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_unreachable_endpoint_is_a_clear_error():
    (port,) = free_ports(1)
    with pytest.raises(StoreError) as info:
        EtcdStore(["127.0.0.1:%d" % port], timeout=2)
    assert "etcd is unreachable" in str(info.value) and str(port) in str(info.value)


def test_failover_to_the_next_endpoint(etcd_server, etcd_prefix):
    (dead,) = free_ports(1)
    store = EtcdStore(["127.0.0.1:%d" % dead, "http://" + etcd_server.endpoint], prefix=etcd_prefix)
    store.put("k", b"v")
    assert store.get("k") == b"v"


def test_closed_store_refuses(etcd_server, etcd_prefix):
    store = EtcdStore([etcd_server.endpoint], prefix=etcd_prefix)
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.get_default("k")


@pytest.mark.parametrize("endpoints, field", [
    ([], "endpoints"), (None, "endpoints"), (["nohost"], "endpoints[0]"), (["h:0"], "endpoints[0]"),
    (["ftp://h:1"], "endpoints[0]"), ([5], "endpoints[0]"), (["h:99999"], "endpoints[0]"),
])
def test_bad_endpoints(endpoints, field):
    with pytest.raises(InputError) as info:
        EtcdStore(endpoints)
    assert str(info.value).startswith(field + ":")


@pytest.mark.parametrize("kwargs, field", [
    ({"prefix": ""}, "prefix"), ({"prefix": 3}, "prefix"), ({"timeout": 0}, "timeout"),
    ({"timeout": "5"}, "timeout"), ({"tls": {"cert": "/c"}}, "tls"), ({"tls": {"bogus": 1}}, "tls"),
])
def test_bad_options(kwargs, field):
    with pytest.raises(InputError) as info:
        EtcdStore(["127.0.0.1:2379"], **kwargs)
    assert str(info.value).startswith(field + ":")


def test_too_many_operations_is_explained(etcd_server, etcd_prefix):
    store = EtcdStore([etcd_server.endpoint], prefix=etcd_prefix)
    with pytest.raises(StoreError, match="max-txn-ops"):
        with store.transaction() as tx:
            for i in range(200):
                tx.put("k%03d" % i, b"")
    assert store.items("") == []
