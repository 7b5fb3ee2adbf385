# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Processes, namespaces and mounts of the machine, as the lab sees them: run a program, list network
namespaces and the processes in one, list mount points, and stop processes by pid (never by name)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Dict, List, Tuple

from lab.names import LabError


def run(argv: List[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    """Runs argv (output captured as text); LabError naming the command and its stderr if it fails."""
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    proc = subprocess.run(argv, check=False, **kw)
    if check and proc.returncode != 0:
        raise LabError("%s failed (%d): %s" % (" ".join(argv), proc.returncode, (proc.stderr or "").strip()))
    return proc


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def processes_cpu() -> Dict[int, Tuple[str, str, float]]:
    """{pid: (comm, command line, CPU seconds of the process and of the children it reaped)} of every process
    in /proc (one that ends while it is read is left out)."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as handle:
                stat = handle.read()
            with open("/proc/%s/cmdline" % pid, "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
        comm, _sep, rest = stat.partition("(")[2].rpartition(")")
        times = [int(value) for value in rest.split()[11:15]]  # utime stime cutime cstime
        out[int(pid)] = (comm, cmdline, sum(times) / CLOCK_TICKS)
    return out


def is_zombie(pid: int) -> bool:
    """True for a zombie and for a process that is gone: a daemon reparented to PID 1 may be reaped late,
    and a zombie has already released its ports, files and memory, so either counts as ended."""
    try:
        with open("/proc/%d/stat" % pid, encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def alive(pid: int) -> bool:
    """True while the process runs (not a zombie)."""
    return not is_zombie(pid)


def wait_gone(pid: int, timeout: float, interval: float = 0.02) -> bool:
    """Waits until ``pid`` has ended (or is a zombie); returns whether it did within ``timeout``."""
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True


def kill_all(pids: List[int], timeout: float = 3.0) -> None:
    """SIGTERM to each pid, SIGKILL to those still running after ``timeout``."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    running = list(pids)
    while running and time.monotonic() < deadline:
        running = [p for p in running if alive(p)]
        if running:
            time.sleep(0.02)
    for pid in running:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def netns_list() -> List[str]:
    out = run(["ip", "netns", "list"], check=False).stdout or ""
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def pids_in_netns(ns: str) -> List[int]:
    out = run(["ip", "netns", "pids", ns], check=False).stdout or ""
    return [int(p) for p in out.split() if p.isdigit()]


def mountpoints() -> List[str]:
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as handle:
        for line in handle:
            points.append(line.split()[4].replace("\\040", " "))
    return points
