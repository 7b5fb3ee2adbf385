"""fileutil: the one atomic write every part of the Core uses."""

import os
import signal
import subprocess
import sys

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils import fileutil


def test_atomic_write_creates_with_the_final_mode_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "secret"
    assert fileutil.atomic_write(str(path), b"k" * 32, 0o600)
    assert path.read_bytes() == b"k" * 32
    assert path.stat().st_mode & 0o777 == 0o600
    assert os.listdir(tmp_path) == ["secret"]


def test_exclusive_never_replaces_an_existing_file(tmp_path):
    path = tmp_path / "f"
    assert fileutil.atomic_write(str(path), b"first", exclusive=True)
    assert not fileutil.atomic_write(str(path), b"second", exclusive=True)
    assert path.read_bytes() == b"first"
    assert os.listdir(tmp_path) == ["f"]


def test_a_failing_writer_keeps_the_previous_file(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with fileutil.atomic_writer(str(path)) as handle:
            handle.write(b"half of the new")
            raise RuntimeError("disk on fire")
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["f"]


def test_write_if_changed_reports_content_and_mode_changes(tmp_path):
    path = str(tmp_path / "f")
    assert fileutil.write_if_changed(path, b"a", 0o600)
    assert not fileutil.write_if_changed(path, b"a", 0o600)
    assert fileutil.write_if_changed(path, b"a", 0o640)
    assert os.stat(path).st_mode & 0o777 == 0o640
    assert fileutil.write_if_changed(path, b"b", 0o640)
    assert not fileutil.write_if_changed(path, b"b", 0o640)


WRITER = """
import sys
sys.path.insert(0, sys.argv[2])
from ansible_collections.constellation.cluster.plugins.module_utils import fileutil
i = 0
while True:
    i += 1
    fileutil.atomic_write(sys.argv[1], (str(i) * 20000).encode(), 0o600)
    if i == 1:
        print("ready", flush=True)
"""


def test_kill_9_mid_write_never_leaves_a_torn_file(tmp_path):
    path = tmp_path / "f"
    collections = os.path.join(os.path.dirname(__file__), "..", "..", "collections")
    for _kill in range(10):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), collections], stdout=subprocess.PIPE)
        assert proc.stdout.readline() == b"ready\n"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        data = path.read_bytes()
        assert data and len(data) % 20000 == 0, "a torn file"
        digits = data.decode()
        assert digits == digits[: len(digits) // 20000] * 20000
