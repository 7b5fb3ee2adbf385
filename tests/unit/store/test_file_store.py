"""FileStore: crash safety (kill -9), two processes, corrupt files, permissions."""

from __future__ import annotations

import json
import os
import random
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.store import FileStore, StoreError, open_store

ROOT = Path(__file__).resolve().parents[3]

# A writer whose every transaction keeps "version" == len(items "list/"), with a payload big
# enough that the write takes a while (a kill then often lands in the middle of it).
WRITER = r"""
import sys
from ansible_collections.constellation.cluster.plugins.module_utils.store import FileStore
store = FileStore(sys.argv[1])
loops = int(sys.argv[2])
for dummy in range(loops):
    with store.transaction() as tx:
        version = int(tx.get_default("version", b"0"))
        tx.put("list/%06d" % version, b"x" * 2048)
        tx.put("version", str(version + 1).encode())
    if sys.argv[3] == "report":
        print(version + 1, flush=True)
"""


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "collections"), str(ROOT)])
    return env


def _consistent_version(path) -> int:
    store = FileStore(str(path))
    with store.transaction() as tx:
        version = int(tx.get_default("version", b"0"))
        assert len(tx.items("list/")) == version
    return version


def test_kill_9_never_leaves_a_broken_file(tmp_path):
    path = tmp_path / "state.json"
    rng = random.Random(7)
    last = 0
    for dummy in range(20):
        child = subprocess.Popen([sys.executable, "-c", WRITER, str(path), "100000", "report"],
                                 env=_env(), stdout=subprocess.PIPE, text=True)
        try:
            child.stdout.readline()  # it has committed at least once: it is in its write loop
            time.sleep(rng.uniform(0, 0.03))
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(10)
            child.stdout.close()
        version = _consistent_version(path)
        assert version > last  # committed work is never lost
        last = version
    # Temp files of killed writers are cleaned up by the next opener.
    FileStore(str(path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json", "state.json.lock"]


def test_two_processes_lose_no_update(tmp_path):
    path = str(tmp_path / "state.json")
    children = [subprocess.Popen([sys.executable, "-c", WRITER, path, "60", "quiet"], env=_env())
                for dummy in range(2)]
    for child in children:
        assert child.wait(120) == 0
    assert _consistent_version(path) == 120


def test_file_is_private_and_readable_json(tmp_path):
    path = tmp_path / "sub" / "state.json"
    store = FileStore(str(path))
    store.put("masterSecret", b"\x01\x02")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    doc = json.loads(path.read_text())
    assert doc["items"] == {"masterSecret": "AQI="}


def test_a_no_op_transaction_does_not_rewrite(tmp_path):
    path = tmp_path / "state.json"
    store = FileStore(str(path))
    store.put("a", b"1")
    inode = os.stat(path).st_ino
    with store.transaction() as tx:
        tx.put("a", b"1")
        tx.delete("never-there")
    assert os.stat(path).st_ino == inode


def test_external_changes_are_seen(tmp_path):
    path = tmp_path / "state.json"
    first = FileStore(str(path))
    first.put("a", b"1")
    assert first.get("a") == b"1"  # cached now
    FileStore(str(path)).put("a", b"2")
    assert first.get("a") == b"2"


@pytest.mark.parametrize("content, why", [
    (b"{\"format\": \"constellation.cluster/store/v1\", \"items\": {\"a\": \"AQ", "not JSON"),
    (b"\xff\xfe", "not JSON"),
    (b"[]", "expected an object"),
    (b"{\"format\": \"other\", \"items\": {}}", "expected an object"),
    (b"{\"format\": \"constellation.cluster/store/v1\", \"items\": {\"a\": \"!!\"}}", "not base64"),
    (b"{\"format\": \"constellation.cluster/store/v1\", \"items\": {\"a\": 1}}", "bad entry"),
])
def test_corrupt_file_is_refused(tmp_path, content, why):
    path = tmp_path / "state.json"
    path.write_bytes(content)
    with pytest.raises(StoreError) as info:
        FileStore(str(path))
    assert "is corrupt" in str(info.value) and why in str(info.value) and str(path) in str(info.value)
    assert path.read_bytes() == content  # never "repaired"


def test_corruption_after_opening_is_refused_too(tmp_path):
    path = tmp_path / "state.json"
    store = FileStore(str(path))
    store.put("a", b"1")
    path.write_text("garbage")
    with pytest.raises(StoreError, match="corrupt"):
        store.put("b", b"2")
    assert path.read_text() == "garbage"


def test_unwritable_directory_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StoreError) as info:
        FileStore(str(blocker / "state.json"))
    assert str(blocker) in str(info.value)


@pytest.mark.parametrize("spec, field", [
    ({"type": "file"}, "store.path"), ({"type": "file", "path": ""}, "store.path"),
    ({"type": "disk"}, "store.type"), ({}, "store.type"), ("file", "store"),
    ({"type": "file", "path": "/x", "endpoints": []}, "store"),
])
def test_open_store_bad_specs(spec, field):
    with pytest.raises(InputError) as info:
        open_store(spec)
    assert str(info.value).startswith(field + ":")


def test_open_store_file_and_memory(tmp_path):
    store = open_store({"type": "file", "path": str(tmp_path / "s.json")})
    store.put("k", b"v")
    assert open_store({"type": "file", "path": str(tmp_path / "s.json")}).get("k") == b"v"
    assert open_store({"type": "memory"}).items("") == []


def test_relocate_moves_the_data_and_removes_the_old_file(tmp_path):
    store = FileStore(str(tmp_path / "store.json"))
    store.put("a", b"1")
    assert store.relocate(str(tmp_path / "disk" / "store.json")) is True
    assert store.path == str(tmp_path / "disk" / "store.json") and store.get("a") == b"1"
    assert not (tmp_path / "store.json").exists() and not (tmp_path / "store.json.lock").exists()
    store.put("b", b"2")
    assert FileStore(str(tmp_path / "disk" / "store.json")).get("b") == b"2"
    assert oct((tmp_path / "disk" / "store.json").stat().st_mode & 0o777) == "0o600"


def test_relocate_onto_an_existing_file_uses_it(tmp_path):
    """A move that ended before the old file was removed: the file at the new place wins."""
    FileStore(str(tmp_path / "disk" / "store.json")).put("a", b"on disk")
    store = FileStore(str(tmp_path / "store.json"))
    store.put("a", b"old")
    assert store.relocate(str(tmp_path / "disk" / "store.json")) is False
    assert store.get("a") == b"on disk" and not (tmp_path / "store.json").exists()


def test_relocate_to_a_corrupt_file_is_refused_and_keeps_the_old_one(tmp_path):
    (tmp_path / "disk").mkdir()
    (tmp_path / "disk" / "store.json").write_text("not json")
    store = FileStore(str(tmp_path / "store.json"))
    store.put("a", b"1")
    with pytest.raises(StoreError, match="corrupt"):
        store.relocate(str(tmp_path / "disk" / "store.json"))
    assert store.path == str(tmp_path / "store.json") and store.get("a") == b"1"
