# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Process plumbing of the admin channel's Exec/ExecModule, without any RPC: start a process in a
session of its own, pump its output into a queue, feed it, kill its group. The admin channel
(agent/remote_exec.py) streams between these and the connection; warm.py runs module payloads."""

from __future__ import annotations

import os
import queue
import signal
import subprocess

DATA_CHUNK = 64 * 1024


def start_process(argv, cwd, env) -> subprocess.Popen:
    """The process with pipes on all three streams, in a new session (killable as a group)."""
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=cwd, env=env, start_new_session=True)


def write_all(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
    except (BrokenPipeError, OSError):
        pass
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def pump(pipe, channel: int, out: "queue.Queue") -> None:
    try:
        while True:
            data = pipe.read1(DATA_CHUNK) if hasattr(pipe, "read1") else pipe.read(DATA_CHUNK)
            if not data:
                break
            out.put((channel, data))
    finally:
        out.put((channel, None))
        pipe.close()


def kill_group(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        try:  # a warm child killed before its setsid()
            os.kill(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    except PermissionError:
        pass
