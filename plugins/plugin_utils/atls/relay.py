# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The relay ("mux") of the atls connection plugin: one process per host and playbook run that
keeps the attested, admin-authenticated TLS connection and lends it to the task workers over a
0600 Unix socket (like ssh's ControlPersist)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from typing import Optional, Tuple

from ansible.errors import AnsibleConnectionFailure, AnsibleError
from ansible.module_utils.common.text.converters import to_bytes, to_native

from ansible_collections.constellation.cluster.plugins.plugin_utils.atls.session import (
    open_admin_client, prove_again, validators_for)
from ansible_collections.constellation.cluster.plugins.plugin_utils.atls.settings import Settings

MUX_MAX_SESSIONS = 16
MUX_START_TIMEOUT = 60.0
# plugins/plugin_utils/atls/relay.py -> the folder that holds ansible_collections/
_COLLECTIONS_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), *([os.pardir] * 6)))

# ---------------------------------------------------------------------------------------------
# The relay ("mux"): one process per host and playbook run, holding attested TLS connections.
#
# Session protocol on the Unix socket (same frames as the agent): the relay first sends one END
# (result: the connection is ready; error: why not), then relays requests. It knows the methods'
# shapes, so it knows when a TLS connection is idle again and can lend it to the next task.

_NEXT = "next"
_SESSION_END = "session-end"
_BROKEN = "broken"


def relayed_methods() -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """(methods the relay passes on, those of them that carry stdin), from the RPC schema
    (module_utils/rpc/schema.py): the admin channel's methods and GetState. Computed in the relay
    process only: the task workers, which import this module, never build the schema."""
    from ansible_collections.constellation.cluster.plugins.module_utils.rpc import schema

    # AdminAuth and Attest are the relay's own business on its TLS connections; ExportState (the Coordinator's
    # whole store) is only for the coordinator_backup action's own connection, never a task's.
    relayed = tuple(m.name for m in schema.methods_of(schema.ADMIN)
                    if m.name not in ("AdminAuth", "Attest", "ExportState")) \
        + ("GetState",)
    return relayed, tuple(m.name for m in schema.METHODS.values() if m.name in relayed and m.stdin)


class _Relay:
    def __init__(self, settings: Settings, playbook_pid: int, path: str):
        self.settings = settings
        self.playbook_pid = playbook_pid
        self.path = path
        self.idle = []  # attested AgentClients not lent out
        self.lock = threading.Lock()
        self.sessions = 0
        self.last_use = time.monotonic()
        self.stop = threading.Event()
        self.inode = None
        self._validators = None  # built once: qemu-vtpm-ek's certified AKs live in them

    def validators(self):
        with self.lock:
            if self._validators is None:
                self._validators = validators_for(self.settings, self.playbook_pid)
            return self._validators

    def take(self):
        """An attested, admin-authenticated connection for one task: a kept one, which proves itself
        again first (``fresh_proof``: a new quote over a new nonce, bound to that connection), or a new
        one, attested in its handshake."""
        kept, proven = None, False
        with self.lock:
            while self.idle and kept is None:
                client, proven = self.idle.pop()
                # A readable idle connection holds an EOF or garbage: the agent closed it.
                readable, _w, _x = select.select([client.sock], [], [], 0)
                if readable:
                    client.close()
                else:
                    kept = client
        if kept is None:
            return open_admin_client(self.settings, self.validators())
        if self.settings.fresh_proof and not proven:
            prove_again(self.settings, kept, self.validators())
        return kept

    def give_back(self, client, proven: bool = False) -> None:
        """``proven``: attested since its last use (a new connection), so the next task needs no new proof."""
        with self.lock:
            if len(self.idle) < 2:
                self.idle.append((client, proven))
                return
        client.close()

    def serve_session(self, conn: socket.socket) -> None:
        from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import (
            FrameStream, RemoteError)

        local = FrameStream(conn)
        client = None
        try:
            try:
                client = self.take()
            except AnsibleError as err:
                local.send_error(RemoteError("ConnectionFailure", to_native(err.message)))
                return
            local.send_result({"endpoint": self.settings.endpoint, "variant_oid": client.attested.variant_oid})
            while not self.stop.is_set():
                outcome = self._relay_one(local, client)
                if outcome == _BROKEN:
                    client.close()
                    client = None
                    return
                if outcome == _SESSION_END:
                    return
        finally:
            if client is not None:
                self.give_back(client)
            conn.close()
            with self.lock:
                self.sessions -= 1
                self.last_use = time.monotonic()

    def _relay_one(self, local, client) -> str:
        """Relays one request and its answer; says whether the TLS connection is still usable."""
        from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import (
            CHANNEL_STDIN, KIND_END, KIND_EOF, KIND_MSG, ConnectionClosed, ProtocolError, encode_frame, encode_json,
            request_of)

        try:
            conn_frame = local.recv()
        except ConnectionClosed:
            return _SESSION_END  # the task is done; the TLS connection is between requests
        except ProtocolError:
            return _SESSION_END
        if conn_frame.kind != KIND_MSG:
            return _SESSION_END
        try:
            method, _params = request_of(conn_frame.message)
        except Exception:  # pylint: disable=broad-except
            return _SESSION_END
        if method == "RelayShutdown":
            self.stop.set()
            self.unlink()  # the next task starts a new relay at once
            local.send_result({"stopped": True})
            return _BROKEN
        relayed, stdin_methods = relayed_methods()
        if method not in relayed:
            local.send_error(ProtocolError("the relay passes on only %s" % ", ".join(relayed)))
            return _NEXT

        def forward(frame, sock) -> None:
            if frame.kind in (KIND_MSG, KIND_END):
                payload = encode_json(frame.message)
            elif frame.kind == KIND_EOF:
                payload = bytes([frame.channel])
            else:
                payload = bytes([frame.channel]) + frame.data
            sock.sendall(encode_frame(frame.kind, payload))

        try:
            client.sock.settimeout(None)  # a module may run for long; the agent bounds idle time
            forward(conn_frame, client.sock)
            if method in stdin_methods:
                while True:
                    frame = local.recv()
                    forward(frame, client.sock)
                    if frame.kind == KIND_EOF and frame.channel == CHANNEL_STDIN:
                        break
            while True:
                frame = client.stream.recv()
                forward(frame, local.sock)
                if frame.kind == KIND_END:
                    return _NEXT
        except (ProtocolError, OSError):
            return _BROKEN
        finally:
            client.sock.settimeout(self.settings.timeout)

    def unlink(self) -> None:
        """Removes our socket file, never a successor's that took the same path."""
        try:
            if os.stat(self.path).st_ino == self.inode:
                os.unlink(self.path)
                os.unlink(self.path + ".lock")
        except OSError:
            pass

    def playbook_alive(self) -> bool:
        try:
            os.kill(self.playbook_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def run(self, listener: socket.socket) -> None:
        listener.settimeout(1.0)
        while not self.stop.is_set():
            try:
                conn, _addr = listener.accept()
            except socket.timeout:
                with self.lock:
                    idle_for = time.monotonic() - self.last_use if self.sessions == 0 else 0.0
                if idle_for > self.settings.persist or not self.playbook_alive():
                    break
                continue
            with self.lock:
                if self.sessions >= MUX_MAX_SESSIONS:
                    conn.close()
                    continue
                self.sessions += 1
                self.last_use = time.monotonic()
            threading.Thread(target=self.serve_session, args=(conn,), daemon=True).start()
        self.stop.set()
        self.unlink()
        listener.close()
        with self.lock:
            for client, _proven in self.idle:
                client.close()
            self.idle = []


def relay_main() -> int:
    """Entry of the relay process: settings as JSON on stdin; one status line on stdout. Started in
    the background (``start_relay_in_background``) it holds the socket path's lock (``lock_fd``)
    until it listens or gives up, so a task that wants the relay meanwhile waits for it."""
    request = json.loads(sys.stdin.readline())
    settings = Settings.from_json(request["settings"])
    path, playbook_pid = request["path"], int(request["playbook_pid"])
    lock_fd = request.get("lock_fd")
    out = sys.stdout
    relay = _Relay(settings, playbook_pid, path)
    try:
        first = open_admin_client(settings, relay.validators())  # attest before anyone may use the socket
    except AnsibleError as err:
        out.write(json.dumps({"error": to_native(err.message)}) + "\n")
        out.flush()
        return 1
    # Started ahead of any task, its handshake's proof is not that of the first task: with
    # fresh_proof the first task gets a new one.
    relay.give_back(first, proven=lock_fd is None)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        listener.bind(path)
    finally:
        os.umask(old_umask)
    relay.inode = os.stat(path).st_ino
    listener.listen(MUX_MAX_SESSIONS)
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    if lock_fd is not None:
        os.close(lock_fd)  # listening: a task waiting for the lock connects now
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    relay.run(listener)
    return 0


def ensure_private_dir(path: str) -> None:
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.stat(path)
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise AnsibleConnectionFailure("control_path_dir %s must be owned by this user with mode 0700" % path)


def connect_unix(path: str) -> Optional[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as err:
        sock.close()
        if err.errno in (errno.ENOENT, errno.ECONNREFUSED):
            return None
        raise
    return sock


def _spawn_relay(settings: Settings, path: str, playbook_pid: str, lock_fd: Optional[int] = None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([_COLLECTIONS_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                               if p])
    code = "from ansible_collections.constellation.cluster.plugins.plugin_utils.atls.relay import relay_main; " \
           "raise SystemExit(relay_main())"
    request = {"settings": settings.to_json(), "path": path, "playbook_pid": playbook_pid}
    if lock_fd is not None:
        request["lock_fd"] = lock_fd
    with open(os.devnull, "wb") as devnull:
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE if lock_fd is None else devnull, stderr=devnull, env=env,
                                start_new_session=True, close_fds=True,
                                pass_fds=() if lock_fd is None else (lock_fd,))
    try:
        proc.stdin.write(to_bytes(json.dumps(request) + "\n"))
        proc.stdin.close()
    except BrokenPipeError:
        pass  # it died at once: start_relay reports its exit; in the background the next task starts one
    return proc


def start_relay(settings: Settings, path: str, playbook_pid: str) -> None:
    proc = _spawn_relay(settings, path, playbook_pid)
    try:
        ready, _w, _x = select.select([proc.stdout], [], [], MUX_START_TIMEOUT)
        line = proc.stdout.readline() if ready else b""
    finally:
        proc.stdout.close()
    try:
        status = json.loads(line.decode("utf-8") or "{}")
    except ValueError:
        status = {}
    if status.get("ready"):
        return
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    raise AnsibleConnectionFailure(status.get("error") or "%s: the connection relay did not start (exit %s)"
                                   % (settings.endpoint, proc.returncode))


def start_relay_in_background(settings: Settings, path: str, playbook_pid: str) -> bool:
    """Starts the relay for ``path`` and returns at once (the connection's ``prestart``): it
    attests and authenticates while the run goes on, and holds the path's lock until it listens,
    so the first task that wants it waits for it instead of starting another. If it fails, it
    just exits: that task starts its own and reports why. False if a relay runs or is starting."""
    ensure_private_dir(settings.control_path_dir)
    if os.path.exists(path):
        return False  # running (or gone: the next task finds out and starts one)
    with open(path + ".lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # being started
        if os.path.exists(path):
            return False
        _spawn_relay(settings, path, playbook_pid, lock.fileno())
    return True  # our copy of the lock is closed; the relay holds its own until it listens
