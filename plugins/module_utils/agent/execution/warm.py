# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pre-warmed interpreters for Ansible module payloads (the admin channel's ``ExecModule``).

A pipelined Ansible module is a Python script (the AnsiballZ wrapper, with its module and
module_utils as a base64 zip inside) that ``/path/python`` reads on stdin. Most of a module's
run time on the node is that fresh interpreter: start-up, the standard library and
``ansible.module_utils.basic`` imported from the zip. Here a *fork server* per (interpreter,
zip content) pays that once: it is the configured interpreter with the standard library the
wrapper needs imported and, from its own copy of a zip of that content, the wrapper's module_utils.
Each payload then runs in a child forked for it alone (no two payloads share a process), with
stdin/stdout/stderr as for ``Exec``, and its exit code is reported like a process's.
Ansible builds the zip anew for every playbook run, with that run's time on every entry: the
server is keyed by the zip's *content* (each entry's name and bytes), so the next run's payloads
of the same module and module_utils find it warm.

Two halves live in this file:
  * the agent side (``WarmPool``, ``plan``), importing only the standard library;
  * the fork server (``_serve``), which runs under the *module's* interpreter, so it uses the
    standard library only and is started as ``INTERPRETER -c BOOT this_file ZIP``.
Everything unexpected (another wrapper, a zip that does not decode, an interpreter that does not
start or speak) makes ``plan``/``spawn`` say so, and the caller runs the plain command instead.
"""

from __future__ import annotations

import array
import base64
import binascii
import hashlib
import io
import json
import os
import re
import socket
import subprocess
import threading
import time
import zipfile
import zlib
from collections import OrderedDict
from typing import Any, Dict, List, Optional

MAX_SERVERS = 8
START_TIMEOUT = 30.0
MAX_MSG = 1 << 20
STARTUP_ENV_PREFIXES = ("PYTHON", "LC_", "LANG", "LANGUAGE")
_BOOT = "import sys; __file__ = sys.argv[1]; exec(compile(open(__file__).read(), __file__, 'exec')); _serve()"
_WRAPPER_MARK = b"\n_ANSIBALLZ_WRAPPER = True\n"
_ZIP_RE = re.compile(rb"\nzip_data='([A-Za-z0-9+/=]+)',?\n")

# What the AnsiballZ wrapper and ansible.module_utils.basic import from the standard library;
# every name is tried, a missing one is skipped (the child imports it as a plain run would).
PRELOAD = (
    "abc argparse ast atexit base64 binascii bisect collections collections.abc contextlib copy "
    "dataclasses datetime decimal enum errno fcntl fnmatch functools getpass gettext glob grp hashlib "
    "importlib importlib.machinery importlib.util inspect io ipaddress itertools json locale "
    "logging pathlib pickle pkgutil platform pwd queue random re runpy select selectors shlex shutil "
    "signal socket stat string struct subprocess syslog tempfile textwrap threading time traceback "
    "types typing urllib.parse warnings weakref zipfile zipimport zlib"
)


class WarmUnavailable(Exception):
    """No warm interpreter for this payload; run it the plain way."""


def content_digest(zip_data: bytes) -> str:
    """SHA-256 over the zip's entries (name and uncompressed bytes, each length-prefixed, in the
    archive's order): equal for two builds of the same module and module_utils, whatever their
    timestamps. Raises WarmUnavailable for a zip that does not read (CRC included)."""
    digest = hashlib.sha256(b"constellation-warm-zip-v1")
    try:
        with zipfile.ZipFile(io.BytesIO(zip_data)) as archive:
            for info in archive.infolist():
                name = info.filename.encode("utf-8", "surrogateescape")
                data = archive.read(info)
                digest.update(len(name).to_bytes(8, "big") + name + len(data).to_bytes(8, "big"))
                digest.update(data)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, OSError, ValueError, EOFError,
            RuntimeError) as err:
        raise WarmUnavailable("the module zip does not read: %s" % err) from None
    return digest.hexdigest()


def plan(interpreter: Any, payload: bytes) -> Optional[bytes]:
    """The payload's module zip if it can run warm, else None (run it plain).

    Warm only: an AnsiballZ wrapper whose shebang names ``interpreter``, with one base64 zip."""
    if not isinstance(interpreter, str) or not os.path.isabs(interpreter) or "\x00" in interpreter:
        return None
    first, _sep, _rest = payload.partition(b"\n")
    if first != b"#!" + interpreter.encode("utf-8", "surrogateescape") or _WRAPPER_MARK not in payload:
        return None
    found = _ZIP_RE.findall(payload)
    if len(found) != 1:
        return None
    try:
        return base64.b64decode(found[0], validate=True)
    except (binascii.Error, ValueError):
        return None


class WarmChild:
    """A payload's process in a fork server, with Popen's face for the admin channel's pumps."""

    def __init__(self, server: "_Server", request_id: int, pid: int, stdin, stdout, stderr):
        self._server = server
        self._id = request_id
        self.pid = pid
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.returncode: Optional[int] = None

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = self._server.wait_exit(self._id)
        return self.returncode


class _Server:
    """One fork server process and its control socket (SOCK_SEQPACKET, JSON + passed fds)."""

    def __init__(self, interpreter: str, zip_path: Optional[str], env: Dict[str, str], log):
        self.interpreter = interpreter
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.next_id = 1
        self.pids: Dict[int, int] = {}
        self.exits: Dict[int, int] = {}
        self.active = 0  # payloads started and not yet waited for
        self.dead = False
        self._log = log
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                # Through the shell, as Exec runs ``/bin/sh -c 'python ...'``: what the shell and the
                # interpreter's start-up add to the environment (PWD, locale coercion) is seen in the
                # hello and given to every child.
                ["/bin/sh", "-c", 'exec "$@"', "sh", interpreter, "-c", _BOOT, os.path.abspath(__file__),
                 zip_path or "", str(theirs.fileno())],
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),), close_fds=True, start_new_session=True)
        except OSError as err:
            ours.close()
            raise WarmUnavailable("cannot start %s: %s" % (interpreter, err.strerror)) from None
        finally:
            theirs.close()
        self.sock = ours
        ours.settimeout(START_TIMEOUT)
        try:
            hello = json.loads(ours.recv(MAX_MSG) or b"{}")
        except (OSError, ValueError):
            hello = {}
        environ = hello.get("environ")
        if not hello.get("ready") or not isinstance(environ, dict):
            self.stop()
            raise WarmUnavailable("%s did not start a fork server" % interpreter)
        self.env_added = {k: v for k, v in environ.items() if env.get(k) != v}
        self.env_removed = [k for k in env if k not in environ]
        ours.settimeout(None)
        self.reader = threading.Thread(target=self._read, name="warm-reader", daemon=True)
        self.reader.start()

    def alive(self) -> bool:
        return not self.dead and self.proc.poll() is None

    def _read(self) -> None:
        try:
            while True:
                data = self.sock.recv(MAX_MSG)
                if not data:
                    break
                msg = json.loads(data)
                with self.cond:
                    if "pid" in msg:
                        self.pids[msg["id"]] = msg["pid"]
                    if "exit_code" in msg:
                        self.exits[msg["id"]] = msg["exit_code"]
                    self.cond.notify_all()
        except (OSError, ValueError):
            pass
        with self.cond:
            self.dead = True
            self.cond.notify_all()

    def spawn(self, env: Dict[str, str], cwd: Optional[str]) -> WarmChild:
        pipes = [os.pipe(), os.pipe(), os.pipe()]  # stdin, stdout, stderr
        theirs = [pipes[0][0], pipes[1][1], pipes[2][1]]
        ours = [pipes[0][1], pipes[1][0], pipes[2][0]]
        try:
            with self.cond:
                if self.dead:
                    raise WarmUnavailable("fork server gone")
                request_id = self.next_id
                self.next_id += 1
                self.active += 1
            env = dict(env)
            env.update(self.env_added)
            for name in self.env_removed:
                env.pop(name, None)
            message = json.dumps({"id": request_id, "env": env, "cwd": cwd}).encode()
            try:
                self.sock.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", theirs))])
            except OSError as err:
                raise WarmUnavailable("fork server gone: %s" % err) from None
            with self.cond:
                deadline = time.monotonic() + START_TIMEOUT
                while request_id not in self.pids and not self.dead and time.monotonic() < deadline:
                    self.cond.wait(1.0)
                pid = self.pids.pop(request_id, None)
            if pid is None:
                raise WarmUnavailable("fork server did not start the payload")
        except BaseException:
            with self.cond:
                self.active -= 1
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        return WarmChild(self, request_id, pid, os.fdopen(ours[0], "wb"), os.fdopen(ours[1], "rb"),
                         os.fdopen(ours[2], "rb"))

    def wait_exit(self, request_id: int) -> int:
        with self.cond:
            try:
                while request_id not in self.exits and not self.dead:
                    self.cond.wait()
                if request_id in self.exits:
                    return self.exits.pop(request_id)
            finally:
                self.active -= 1
        raise WarmUnavailable("the fork server died while the payload ran; its exit code is lost")

    def stop(self) -> None:
        self.dead = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class WarmPool:
    """Fork servers by (interpreter, zip content digest), at most MAX_SERVERS (least recently used goes).

    A zip is kept as ``cache_dir/<digest>.zip`` (0600, written atomically), so a server only ever
    imports the exact module_utils it serves; a different ansible version gets its own server."""

    def __init__(self, cache_dir: str, log=None, max_servers: int = MAX_SERVERS):
        self.cache_dir = cache_dir
        self.max_servers = max_servers
        self._log = log or (lambda event, **fields: None)
        self._servers: "OrderedDict[tuple, _Server]" = OrderedDict()
        self._lock = threading.Lock()
        self._starting: Dict[tuple, threading.Lock] = {}
        # The content digest of zips seen (by their bytes' SHA-256): reading a zip costs ~2 ms, and a
        # run sends the same bytes for every task of a module.
        self._digests: "OrderedDict[str, str]" = OrderedDict()

    def _zip_path(self, zip_data: bytes, digest: str) -> str:
        os.makedirs(self.cache_dir, mode=0o700, exist_ok=True)
        path = os.path.join(self.cache_dir, "%s.zip" % digest)
        if not os.path.exists(path):
            tmp = "%s.%d.%d.tmp" % (path, os.getpid(), threading.get_ident())
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(zip_data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        return path

    def _content_digest(self, zip_data: bytes) -> str:
        raw = hashlib.sha256(zip_data).hexdigest()
        with self._lock:
            digest = self._digests.get(raw)
            if digest is not None:
                self._digests.move_to_end(raw)
                return digest
        digest = content_digest(zip_data)
        with self._lock:
            self._digests[raw] = digest
            while len(self._digests) > 4 * self.max_servers:
                self._digests.popitem(last=False)
        return digest

    def _server(self, interpreter: str, zip_data: bytes, env: Dict[str, str]) -> _Server:
        digest = self._content_digest(zip_data)
        # What the interpreter reads from the environment when it starts is part of the key.
        startup = tuple(sorted((k, v) for k, v in env.items() if k.startswith(STARTUP_ENV_PREFIXES)))
        key = (interpreter, digest, startup)
        with self._lock:
            starting = self._starting.setdefault(key, threading.Lock())
        with starting:  # one start per key; others wait for it
            with self._lock:
                server = self._servers.get(key)
                if server is not None and server.alive():
                    self._servers.move_to_end(key)
                    return server
                if server is not None:
                    self._servers.pop(key)
                    self._log("warm_server_restart", interpreter=interpreter, zip_digest=digest)
            # The server's own environment: the agent's and what start-up reads, no task's variables.
            server_env = {k: v for k, v in env.items() if k in os.environ or k.startswith(STARTUP_ENV_PREFIXES)}
            server = _Server(interpreter, self._zip_path(zip_data, digest), server_env, self._log)
            self._log("warm_server_started", interpreter=interpreter, zip_digest=digest, pid=server.proc.pid)
            with self._lock:
                self._servers[key] = server
                evicted: List[_Server] = []
                # Least recently used first; a server with a payload running stays (it owes an exit code).
                for old_key in [k for k, srv in self._servers.items() if srv.active == 0 and k != key]:
                    if len(self._servers) <= self.max_servers:
                        break
                    evicted.append(self._servers.pop(old_key))
            for old in evicted:
                old.stop()
            return server

    def spawn(self, interpreter: str, zip_data: bytes, env: Dict[str, str], cwd: Optional[str]) -> WarmChild:
        """Runs one payload in a fresh child of the warm server; raises WarmUnavailable."""
        if cwd is not None:
            raise WarmUnavailable("a working directory other than the agent's runs plain")
        server = self._server(interpreter, zip_data, env)
        try:
            return server.spawn(env, cwd)
        except WarmUnavailable:
            # It died since we looked: once more with a new one.
            return self._server(interpreter, zip_data, env).spawn(env, cwd)

    def servers(self) -> List[int]:
        """The pids of the running fork servers (for tests and diagnostics)."""
        with self._lock:
            return [s.proc.pid for s in self._servers.values() if s.alive()]

    def close(self) -> None:
        with self._lock:
            servers = list(self._servers.values())
            self._servers.clear()
        for server in servers:
            server.stop()


# ---------------------------------------------------------------------------------------------
# The fork server: runs under the module's interpreter, standard library only.


def _serve() -> None:  # pragma: no cover - runs in the fork server process (tested end to end)
    import importlib
    import signal
    import sys

    environ = dict(os.environ)  # as the shell and the interpreter's start-up left it
    zip_path, control_fd = sys.argv[2], int(sys.argv[3])
    control = socket.socket(fileno=control_fd)
    for name in PRELOAD.split():
        try:
            importlib.import_module(name)
        except Exception:  # pylint: disable=broad-except
            pass
    if zip_path:
        sys.path.insert(0, zip_path)
        try:
            importlib.import_module("ansible.module_utils._internal._ansiballz._loader")
        except Exception:  # pylint: disable=broad-except
            pass
        try:
            importlib.import_module("ansible.module_utils.basic")
        except Exception:  # pylint: disable=broad-except
            pass
        sys.path.remove(zip_path)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda _s, _f: None)
    control.send(json.dumps({"ready": True, "version": list(sys.version_info[:3]), "environ": environ}).encode())
    running: Dict[int, int] = {}
    import select as _select

    while True:
        try:
            readable, _w, _x = _select.select([control, wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in readable:
            os.read(wake_r, 4096)
        while running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            request_id = running.pop(pid, None)
            if request_id is not None:
                code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
                control.send(json.dumps({"id": request_id, "exit_code": code}).encode())
        if control not in readable:
            continue
        fds: List[int] = []
        try:
            data, ancdata, _flags, _addr = control.recvmsg(MAX_MSG, socket.CMSG_SPACE(3 * 4))
        except InterruptedError:
            continue
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", payload[:len(payload) - len(payload) % 4]))
        if not data:
            os._exit(0)  # the agent is gone; running children finish on their own
        request = json.loads(data)
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            continue
        pid = os.fork()
        if pid == 0:
            os.close(wake_r)
            os.close(wake_w)
            control.close()
            _child(fds, request.get("env") or {}, request.get("cwd"))
        for fd in fds:
            os.close(fd)
        running[pid] = request["id"]
        control.send(json.dumps({"id": request["id"], "pid": pid}).encode())


def _child(fds: List[int], env: Dict[str, str], cwd: Optional[str]) -> None:  # pragma: no cover - see _serve
    """A fresh process for one payload: the same start as ``INTERPRETER < payload``."""
    import atexit
    import builtins
    import signal
    import sys
    import types

    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(env)
        if cwd:
            os.chdir(cwd)
        source = sys.stdin.buffer.read()  # the interpreter reads a script on stdin to its end
        sys.argv = [""]
        main = types.ModuleType("__main__")
        main.__dict__.update({"__file__": "<stdin>", "__builtins__": builtins, "__cached__": None, "__spec__": None})
        sys.modules["__main__"] = main
        try:
            exec(compile(source, "<stdin>", "exec"), main.__dict__)  # pylint: disable=exec-used
            code = 0
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code & 0xFF
            else:
                sys.stderr.write("%s\n" % (exc.code,))  # as the interpreter reports it
                code = 1
        except BaseException:  # pylint: disable=broad-except
            sys.excepthook(*sys.exc_info())  # as the interpreter reports it
            code = 1
        threading_mod = sys.modules.get("threading")
        if threading_mod is not None and hasattr(threading_mod, "_shutdown"):
            threading_mod._shutdown()  # pylint: disable=protected-access
        atexit._run_exitfuncs()  # pylint: disable=protected-access
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # pylint: disable=broad-except
                pass
        os._exit(code)
