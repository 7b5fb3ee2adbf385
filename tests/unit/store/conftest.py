"""Store fixtures: a real etcd on loopback (session scope) and the same contract for every store."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.store import EtcdStore, FileStore, MemoryStore
from ansible_collections.constellation.cluster.tests.unit.worker_fixtures import worker_fixture
from lab.etcd import Etcd, free_ports, tmpfs_dir


def _etcd_skip_reason() -> str:
    return "" if os.path.exists("/usr/bin/etcd") else "/usr/bin/etcd is missing (apt-get install etcd-server)"


def _uses_etcd_store(item) -> bool:
    callspec = getattr(item, "callspec", None)
    return callspec is not None and callspec.params.get("store_kind") == "etcd"


@worker_fixture(wanted=_uses_etcd_store)
def etcd_server(get):  # pylint: disable=unused-argument
    """A real /usr/bin/etcd on free loopback ports with a tmpfs data dir; stopped by its pid, and its
    data dir removed, when the worker's session ends."""
    reason = _etcd_skip_reason()
    if reason:
        pytest.skip(reason)
    base = tempfile.mkdtemp(prefix="store-etcd-", dir=tmpfs_dir())
    client_port, peer_port = free_ports(2)
    server = Etcd(os.path.join(base, "data"), client_port, peer_port)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def etcd_prefix():
    """A fresh prefix per test: tests sharing the session's etcd never see each other's keys."""
    return "test-%s/" % uuid.uuid4().hex


@pytest.fixture(params=["memory", "file", "etcd"])
def store_kind(request):
    return request.param


@pytest.fixture
def store_factory(store_kind, tmp_path, request):
    """store_factory() -> a store of the parametrised kind; every call opens the SAME data
    (a second handle, as another thread or a restarted agent would)."""
    opened = []
    shared_memory = MemoryStore()
    if store_kind == "etcd":
        server = request.getfixturevalue("etcd_server")
        prefix = request.getfixturevalue("etcd_prefix")

    def make():
        if store_kind == "memory":
            return shared_memory
        if store_kind == "file":
            store = FileStore(str(tmp_path / "store.json"))
        else:
            store = EtcdStore([server.endpoint], prefix=prefix)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


@pytest.fixture
def store(store_factory):
    return store_factory()
