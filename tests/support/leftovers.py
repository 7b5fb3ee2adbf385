# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a test run leaves behind: live swtpm and etcd processes and /dev/shm entries (scripts/units.sh).

ansible-test forks for every unit test and ends the fork without tearing down session fixtures; the swtpms and
etcds those fixtures started once outlived every run, until a later run was killed for want of memory
(tests/unit/worker_fixtures.py). `make test` snapshots these before the unit tests and fails if any is new after.

    python -m tests.support.leftovers snapshot FILE   # before
    python -m tests.support.leftovers check FILE      # after: exit 1 naming what was left
"""

from __future__ import annotations

import json
import os
import sys
from typing import Iterable, Set

NAMES = ("swtpm", "etcd")


def live_pids(names: Iterable[str] = NAMES) -> Set[int]:
    """Pids of live (not zombie: a zombie holds no port, file or memory) processes named one of ``names``."""
    names = set(names)
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry, encoding="ascii", errors="replace") as handle:
                head, tail = handle.read().rsplit(")", 1)
        except (OSError, ValueError):
            continue
        if head.split("(", 1)[1] in names and tail.split()[0] != "Z":
            pids.add(int(entry))
    return pids


def shm_entries() -> Set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _describe(pid: int) -> str:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return "%d (%s)" % (pid, handle.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:120])
    except OSError:
        return str(pid)


def main(argv) -> int:
    if len(argv) != 2 or argv[0] not in ("snapshot", "check"):
        print("usage: python -m tests.support.leftovers snapshot|check FILE", file=sys.stderr)
        return 2
    command, path = argv
    if command == "snapshot":
        with open(path, "w", encoding="utf-8") as handle:
            json.dump({"pids": sorted(live_pids()), "shm": sorted(shm_entries())}, handle)
        return 0
    with open(path, encoding="utf-8") as handle:
        before = json.load(handle)
    left_pids = sorted(pid for pid in live_pids() - set(before["pids"]) if os.path.exists("/proc/%d" % pid))
    left_shm = sorted(shm_entries() - set(before["shm"]))
    if not left_pids and not left_shm:
        print("unit tests left no swtpm, etcd or /dev/shm entry behind")
        return 0
    for pid in left_pids:
        print("left running after the unit tests: %s" % _describe(pid), file=sys.stderr)
    for entry in left_shm:
        print("left in /dev/shm after the unit tests: %s" % entry, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
