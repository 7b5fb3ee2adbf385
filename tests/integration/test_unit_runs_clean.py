# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""`ansible-test units` leaves no process and no tmpfs data behind.

ansible-test forks for every unit test and ends the fork without tearing down session fixtures; the
swtpms and etcds those fixtures started outlived every run, until a later run was killed for want of
memory (tests/unit/worker_fixtures.py). This runs the unit tests that use the session swtpms, the
session etcd and the fuzz corpus through the same script `make test` uses, and compares the processes
and the /dev/shm entries before and after.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from tests.support import ROOT

UNIT_TESTS = ["tests/unit/store/test_contract.py", "tests/unit/attestation/test_ek.py",
              "tests/unit/attestation/test_vtpm.py", "tests/unit/fuzz/test_fuzz_parsers.py"]


def _live_pids(names) -> set:
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry, encoding="ascii", errors="replace") as handle:
                head, tail = handle.read().rsplit(")", 1)
        except (OSError, ValueError):
            continue
        comm = head.split("(", 1)[1]
        if comm in names and tail.split()[0] != "Z":  # a zombie holds no port, file or memory
            pids.add(int(entry))
    return pids


def _shm() -> set:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.mark.skipif(not os.path.exists("/usr/bin/etcd"), reason="/usr/bin/etcd is missing")
def test_unit_tests_leave_no_swtpm_etcd_or_tmpfs_data():
    names = {"swtpm", "etcd"}
    before_pids, before_shm = _live_pids(names), _shm()
    proc = subprocess.run(["sh", "scripts/ansible-test.sh", "units"] + UNIT_TESTS, cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    summary = [line for line in proc.stdout.splitlines() if re.match(r"^=+ .* in [0-9.]+s", line)]
    assert summary and " passed" in summary[-1] and "skipped" not in summary[-1], proc.stdout[-1500:]
    left_pids = _live_pids(names) - before_pids
    assert not left_pids, "left running: %s" % sorted(left_pids)
    assert _shm() - before_shm == set()
