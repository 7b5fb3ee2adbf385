# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The admin channel's remote execution (docs/protocol.md): ``Exec``, ``ExecModule``, ``PutFile`` and ``FetchFile``,
the transport of the ``atls`` connection plugin. Commands and modules run as the agent's user; their stdin,
stdout and stderr stream as DATA frames. The server runs these handlers only on a connection that proved the
admin key on an activated peer (rpc/schema.py declares it); this module only moves bytes."""

from __future__ import annotations

import hashlib
import os
import queue
import tempfile
import threading
from typing import Any, Dict, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_writer
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import (
    CHANNEL_STDERR,
    CHANNEL_STDIN,
    CHANNEL_STDOUT,
    DATA_CHUNK,
    KIND_DATA,
    KIND_EOF,
    ProtocolError,
)
from ansible_collections.constellation.cluster.plugins.module_utils.agent.execution import warm
from ansible_collections.constellation.cluster.plugins.module_utils.agent.execution.process import (
    kill_group,
    pump,
    start_process,
    write_all,
)
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import schema
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import Connection

MAX_ARGV = 4096
MAX_BUFFERED_OUTPUT = 256 * 1024 * 1024
MAX_MODULE_PAYLOAD = 64 * 1024 * 1024


class RemoteExec:
    """``state_dir``: where the warm interpreters keep their files (``warm``; None: a temporary directory);
    ``warm_interpreters``: False runs every module as ``Exec`` would."""

    def __init__(self, state_dir: Optional[str] = None, log=None, warm_interpreters: bool = True):
        self._log = log or (lambda event, **fields: None)
        self.warm: Optional[warm.WarmPool] = None
        if warm_interpreters:
            state_dir = state_dir or tempfile.mkdtemp(prefix="constellation-warm-")
            self.warm = warm.WarmPool(os.path.join(state_dir, "warm"), log=self._log)

    def close(self) -> None:
        """Stops the warm interpreters (they also stop on their own when the agent is gone)."""
        if self.warm is not None:
            self.warm.close()

    def handlers(self) -> Dict[str, Any]:
        return {"Exec": self.exec_, "ExecModule": self.exec_module, "PutFile": self.put_file,
                "FetchFile": self.fetch_file}

    def _exec_params(self, conn: Connection, method: str, request):
        try:
            argv = _exec_argv(request.argv, request.cmd)
            cwd = request.cwd
            if cwd is not None and not os.path.isdir(cwd):
                raise InputError("cwd", "an existing directory", cwd)
            env = request.env or {}
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
                raise InputError("env", "an object of strings")
            timeout = request.timeout
            if timeout is not None and not 0 < timeout <= 86400:
                raise InputError("timeout", "seconds in (0, 86400]", timeout)
            interpreter = getattr(request, "interpreter", None)
            if method == "ExecModule" and (not isinstance(interpreter, str) or not os.path.isabs(interpreter)):
                raise InputError("interpreter", "the absolute path of the module's Python interpreter", interpreter)
        except Exception:
            # The client sends stdin + EOF whatever happens: consume them, then answer.
            _drain_stdin(conn)
            raise
        run_env = dict(os.environ)
        run_env.update(env)
        return argv, cwd, run_env, timeout, interpreter

    def exec_(self, conn: Connection, request: schema.ExecRequest) -> None:
        argv, cwd, env, timeout, _interpreter = self._exec_params(conn, "Exec", request)
        proc = self._popen(conn, argv, cwd, env)
        self._log("exec", peer=conn.peer_ip, program=os.path.basename(argv[0]), pid=proc.pid)
        exit_code = self._run(conn, proc, timeout)
        conn.stream.send_result({"exit_code": exit_code})

    def exec_module(self, conn: Connection, request: schema.ExecModuleRequest) -> None:
        """A pipelined Ansible module: like Exec (``cmd`` runs the interpreter, the payload is stdin),
        but the payload may run in a pre-warmed interpreter (agent/execution/warm.py). Anything the warm path
        does not know runs exactly as Exec would run it."""
        argv, cwd, env, timeout, interpreter = self._exec_params(conn, "ExecModule", request)
        chunks = []
        received = [0]

        def collect(data: bytes) -> None:  # an oversized payload is read to its end, then refused
            received[0] += len(data)
            if received[0] <= MAX_MODULE_PAYLOAD:
                chunks.append(data)

        size = conn.stream.recv_data_until_eof(CHANNEL_STDIN, collect)
        if size > MAX_MODULE_PAYLOAD:
            raise InputError("stdin", "a module payload of at most %d bytes" % MAX_MODULE_PAYLOAD, size)
        payload = b"".join(chunks)
        proc, reason = None, "warm interpreter turned off on this agent"
        zip_data = warm.plan(interpreter, payload) if self.warm is not None else None
        if zip_data is not None:
            try:
                proc = self.warm.spawn(interpreter, zip_data, env, cwd)
            except (warm.WarmUnavailable, OSError) as err:
                reason = str(err)
        elif self.warm is not None:
            reason = "not an AnsiballZ payload for %s" % interpreter
        if proc is None:
            proc = self._popen(conn, argv, cwd, env, drain=False)
            self._log("exec_module", peer=conn.peer_ip, program=os.path.basename(argv[0]), pid=proc.pid, warm=False,
                      reason=reason)
        else:
            self._log("exec_module", peer=conn.peer_ip, program=os.path.basename(interpreter), pid=proc.pid,
                      warm=True)
        try:
            exit_code = self._run(conn, proc, timeout, stdin=payload)
        except warm.WarmUnavailable as err:
            raise StateError("ExecModule: %s" % err) from None
        conn.stream.send_result({"exit_code": exit_code, "warm": isinstance(proc, warm.WarmChild)})

    @staticmethod
    def _popen(conn: Connection, argv, cwd, env, drain: bool = True):
        try:
            return start_process(argv, cwd, env)
        except OSError as err:
            if drain:
                _drain_stdin(conn)
            raise InputError("argv", "a program that can be started", "%s: %s" % (argv[0], err.strerror)) from None

    @staticmethod
    def _run(conn: Connection, proc, timeout, stdin: Optional[bytes] = None) -> int:
        """Streams stdin (from the client, or ``stdin``) in and stdout/stderr out; the exit code."""
        out: "queue.Queue" = queue.Queue()
        readers = [threading.Thread(target=pump, args=(proc.stdout, CHANNEL_STDOUT, out), daemon=True),
                   threading.Thread(target=pump, args=(proc.stderr, CHANNEL_STDERR, out), daemon=True)]
        if stdin is not None:
            readers.append(threading.Thread(target=write_all, args=(proc.stdin, stdin), daemon=True))
        for reader in readers:
            reader.start()
        timer = None
        if timeout:
            timer = threading.Timer(timeout, kill_group, args=(proc,))
            timer.daemon = True
            timer.start()
        try:
            if stdin is None:
                _feed_stdin(conn, proc)
            open_channels = {CHANNEL_STDOUT, CHANNEL_STDERR}
            while open_channels:
                channel, data = out.get()
                if data is None:
                    conn.stream.send_eof(channel)
                    open_channels.discard(channel)
                else:
                    conn.stream.send_data(channel, data)
            return proc.wait()
        except BaseException:
            kill_group(proc)
            try:
                proc.wait()
            except warm.WarmUnavailable:
                pass
            raise
        finally:
            if timer is not None:
                timer.cancel()

    # -- files
    def put_file(self, conn: Connection, request: schema.PutFileRequest) -> None:
        try:
            path = _abs_path(request.path)
            mode = 0o600 if request.mode is None else request.mode
            if not 0 <= mode <= 0o7777:
                raise InputError("mode", "an integer file mode such as 420 (0644)", mode)
            directory = os.path.dirname(path)
            if not os.path.isdir(directory):
                raise InputError("path", "a path in an existing directory", path)
        except Exception:
            _drain_stdin(conn)
            raise
        digest = hashlib.sha256()
        receiving = False
        try:
            with atomic_writer(path, mode) as handle:
                receiving = True

                def write(data: bytes) -> None:
                    digest.update(data)
                    handle.write(data)

                size = conn.stream.recv_data_until_eof(CHANNEL_STDIN, write)
        except OSError:
            if not receiving:  # the temp file could not be made: the client's data is still coming
                _drain_stdin(conn)
            raise
        self._log("put_file", peer=conn.peer_ip, path=path, size=size)
        conn.stream.send_result({"path": path, "size": size, "sha256": digest.hexdigest()})

    def fetch_file(self, conn: Connection, request: schema.FetchFileRequest) -> None:
        path = _abs_path(request.path)
        try:
            handle = open(path, "rb")
        except OSError as err:
            raise InputError("path", "a readable file", "%s: %s" % (path, err.strerror)) from None
        digest = hashlib.sha256()
        size = 0
        with handle:
            if not os.path.isfile(path):
                raise InputError("path", "a regular file", path)
            while True:
                chunk = handle.read(DATA_CHUNK)
                if not chunk:
                    break
                digest.update(chunk)
                size += len(chunk)
                conn.stream.send_data(CHANNEL_STDOUT, chunk)
        conn.stream.send_eof(CHANNEL_STDOUT)
        self._log("fetch_file", peer=conn.peer_ip, path=path, size=size)
        conn.stream.send_result({"size": size, "sha256": digest.hexdigest()})


def _exec_argv(argv, cmd):
    if argv is not None:
        if not isinstance(argv, list) or not argv or len(argv) > MAX_ARGV or not all(isinstance(a, str) for a in argv):
            raise InputError("argv", "a non-empty list of strings")
        return argv
    if not isinstance(cmd, str) or not cmd:
        raise InputError("cmd", "a shell command string (or argv)")
    return ["/bin/sh", "-c", cmd]


def _abs_path(path: Any) -> str:
    if not isinstance(path, str) or not os.path.isabs(path) or "\x00" in path:
        raise InputError("path", "an absolute path", path)
    return os.path.normpath(path)


def _feed_stdin(conn: Connection, proc) -> None:
    """Network stdin -> process stdin until the client's EOF frame. A process that stops
    reading (broken pipe) does not stop us from consuming the client's frames."""
    stdin = proc.stdin
    while True:
        frame = conn.stream.recv()
        if frame.kind == KIND_EOF and frame.channel == CHANNEL_STDIN:
            break
        if frame.kind != KIND_DATA or frame.channel != CHANNEL_STDIN:
            raise ProtocolError("Exec: expected stdin DATA or EOF, got a %s frame" % frame.kind_name)
        if stdin is not None:
            try:
                stdin.write(frame.data)
                stdin.flush()
            except (BrokenPipeError, OSError):
                stdin = None
    if stdin is not None:
        try:
            stdin.close()
        except OSError:
            pass
    elif proc.stdin is not None:
        try:
            proc.stdin.close()
        except OSError:
            pass


def _drain_stdin(conn: Connection) -> None:
    try:
        conn.stream.recv_data_until_eof(CHANNEL_STDIN, lambda _d: None)
    except Exception:  # pylint: disable=broad-except
        pass
