# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The admin channel (docs/protocol.md): ``AdminAuth``, ``Exec``, ``PutFile``, ``FetchFile``.

Refused before activation. A connection becomes an admin connection only by signing a fresh
server challenge bound to this connection's server key with the admin key pinned at activation;
no bearer token exists that could be replayed on another connection.
"""

from __future__ import annotations

import hashlib
import os
import queue
import secrets
import tempfile
import threading
from typing import Any, Dict, Optional

try:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519
except ImportError:  # ansible-test's import sanity runs without third-party packages
    HAS_CRYPTOGRAPHY = False
else:
    HAS_CRYPTOGRAPHY = True

from ansible_collections.constellation.cluster.plugins.module_utils.core.state import ACTIVATED, State
from ansible_collections.constellation.cluster.plugins.module_utils.core import signing
from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_writer
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import admin_auth_message
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import (
    CHANNEL_STDERR,
    CHANNEL_STDIN,
    CHANNEL_STDOUT,
    DATA_CHUNK,
    KIND_DATA,
    KIND_EOF,
    ProtocolError,
    b64d,
    b64e,
)
from ansible_collections.constellation.cluster.plugins.module_utils.agent.execution import warm
from ansible_collections.constellation.cluster.plugins.module_utils.agent.execution.process import (
    kill_group,
    pump,
    start_process,
    write_all,
)
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import schema
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import AccessDenied, Connection

MAX_ARGV = 4096
MAX_BUFFERED_OUTPUT = 256 * 1024 * 1024
MAX_MODULE_PAYLOAD = 64 * 1024 * 1024


def verify_admin_signature(pub_key, signature: bytes, message: bytes) -> bool:
    try:
        if isinstance(pub_key, ed25519.Ed25519PublicKey):
            pub_key.verify(signature, message)
        else:
            pub_key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return False
    return True


class AdminHandlers:
    """``issue(user_data, nonce) -> document`` and ``variant_oid``: the agent's attestation issuer (as its
    aTLS server context uses it), for ``Attest``. The Core's parts it reads (``AdminHandlers.for_core`` picks
    them from a ``Core``): ``context`` (state, the pinned admin key, the state directory) and ``status``
    (the pinned Coordinators' key, core/status.py)."""

    def __init__(self, log=None, warm_interpreters: bool = True, issue=None, variant_oid: str = "", *, context=None,
                 status=None, backup=None, removal=None, reset=None, measurements=None, admissions=None):
        self.context = context
        self.status = status
        self.backup = backup  # core/backup.py: ExportState
        self.removal = removal  # core/peer_removal.py (RemovePeer)
        # ResetAgent: the agent's ``request_reset()`` (agent/daemon.py): after the answer it stops, wipes, starts fresh.
        self.reset = reset
        self.measurements = measurements  # core/accepted_measurements.py (SetMeasurements)
        self.admissions = admissions  # core/admission.py (AdmitNodes)
        self._issue = issue
        self._variant_oid = variant_oid
        self._log = log or (lambda event, **fields: None)
        self.warm: Optional[warm.WarmPool] = None
        if warm_interpreters:
            state_dir = getattr(context, "state_dir", None) or tempfile.mkdtemp(prefix="constellation-warm-")
            self.warm = warm.WarmPool(os.path.join(state_dir, "warm"), log=self._log)

    def close(self) -> None:
        """Stops the warm interpreters (they also stop on their own when the agent is gone)."""
        if self.warm is not None:
            self.warm.close()

    @classmethod
    def for_core(cls, core, *args: Any, **kwargs: Any) -> "AdminHandlers":
        """The handlers over ``core``'s context and status (None: no Core, e.g. to list the handlers)."""
        kwargs.setdefault("removal", getattr(core, "removal", None))
        return cls(*args, **kwargs, context=getattr(core, "context", None), status=getattr(core, "status", None),
                   backup=getattr(core, "backup", None), measurements=getattr(core, "measurements", None),
                   admissions=getattr(core, "admissions", None))

    def handlers(self) -> Dict[str, Any]:
        return {"AdminAuth": self.admin_auth, "Attest": self.attest, "Exec": self.exec_, "ExecModule": self.exec_module,
                "PutFile": self.put_file, "FetchFile": self.fetch_file, "ExportState": self.export_state,
                "RemovePeer": self.remove_peer, "ResetAgent": self.reset_agent, "SetMeasurements": self.set_measurements,
                "AdmitNodes": self.admit_nodes}

    def _require_activated(self, method: str) -> None:
        if self.context.state not in ACTIVATED:
            raise StateError("%s: the admin channel opens only after activation; this node is %s"
                             % (method, self.context.state.wire_name))

    def _holds_state(self) -> bool:
        """A rebooted peer that holds a cluster's state and waits for Recover or its rejoin (PCR 15 reset)."""
        return bool(getattr(self.context, "recovery_pending", False)) and self.context.admin_pub_key() is not None

    # Every handler gets its request decoded by the server (schema.py records). Each method but AdminAuth runs only
    # on a connection that proved the admin key, in the states its declaration names (schema.py ``access``): the
    # server checks that before the handler runs.
    def admin_auth(self, conn: Connection, request: schema.AdminAuthRequest) -> None:
        role = request.role or "admin"
        if role not in ("admin", "coordinator"):
            raise InputError("role", "admin or coordinator", role[:32])
        if role == "coordinator":
            self._coordinator_auth(conn)
            return
        if self.context.state != State.NODE_WAITING_FOR_CLUSTER_JOIN and not self._holds_state():
            # Its admin key is pinned: GetState's details and ResetAgent (Exec, PutFile, FetchFile still need an
            # activated node).
            self._require_activated("AdminAuth")
        if conn.server_spki_hash is None:
            raise AccessDenied("AdminAuth: only over aTLS")
        pub_key = self.context.admin_pub_key()
        challenge = secrets.token_bytes(32)
        conn.stream.send_msg({"challenge": b64e(challenge)})
        step = conn.recv_owed("the signed challenge")  # a short deadline, replaceable meanwhile
        signature = b64d(step.get("signature"), "signature", max_size=1024)
        if pub_key is None or not verify_admin_signature(pub_key, signature,
                                                         admin_auth_message(challenge, conn.server_spki_hash)):
            self._log("admin_auth_refused", peer=conn.peer_ip)
            raise AccessDenied("AdminAuth: the signature does not verify with the admin key pinned at activation")
        conn.admin = True
        self._log("admin_authenticated", peer=conn.peer_ip)
        conn.stream.send_result({"authenticated": True})

    def _coordinator_auth(self, conn: Connection) -> None:
        """AdminAuth role coordinator: the caller signs a fresh challenge bound to this connection's server
        key with the Coordinators' key this peer pinned (core/signing.py). The connection then gets
        GetState's details; it is NOT an admin connection (Exec, PutFile, FetchFile stay refused)."""
        if conn.server_spki_hash is None:
            raise AccessDenied("AdminAuth: only over aTLS")
        pub_key = self.status.pinned_coordinator_pub_key()
        if pub_key is None:
            raise StateError("AdminAuth (role coordinator): this node has pinned no Coordinator key (it is %s)"
                             % self.context.state.wire_name)
        challenge = secrets.token_bytes(32)
        conn.stream.send_msg({"challenge": b64e(challenge)})
        step = conn.recv_owed("the signed challenge")  # a short deadline, replaceable meanwhile
        signature = b64d(step.get("signature"), "signature", max_size=1024)
        if not signing.verify_auth(pub_key, signature, challenge, conn.server_spki_hash):
            self._log("coordinator_auth_refused", peer=conn.peer_ip)
            raise AccessDenied("AdminAuth (role coordinator): the signature does not verify with the pinned "
                               "Coordinator key")
        conn.coordinator = True
        self._log("coordinator_authenticated", peer=conn.peer_ip)
        conn.stream.send_result({"authenticated": True})

    def attest(self, conn: Connection, request: schema.AttestRequest) -> None:
        """A fresh quote over the caller's nonce whose user data is this connection's certificate key
        (as the certificate's own attestation): the TPM vouches again, now, for the software holding
        this TLS connection. Admin only (a quote costs TPM time)."""
        if conn.server_spki_hash is None or self._issue is None:
            raise AccessDenied("Attest: only over aTLS on an agent with an attestation issuer")
        document = self._issue(conn.server_spki_hash, request.nonce)
        conn.stream.send_result({"attestation": b64e(document), "variant_oid": self._variant_oid})

    def export_state(self, conn: Connection, request: schema.Empty) -> None:  # pylint: disable=unused-argument
        """The Coordinator's whole store (backup.yml): admin-authenticated, activated Coordinators only."""
        state = self.backup.export_state()
        self._log("state_exported_to_admin", peer=conn.peer_ip)
        conn.stream.send_result(state)

    # -- Day-2: RemovePeer (on the Coordinator), ResetAgent (on the peer to reset)
    def remove_peer(self, conn: Connection, request: schema.RemovePeerRequest) -> None:
        """The admin removes a Node (core/peer_removal.py); a Node refuses (the Core: not a Coordinator)."""
        if self.removal is None:
            raise AccessDenied("RemovePeer: this agent removes no peers")
        result = self.removal.remove_node(public_ip=request.node_public_ip, vpn_ip=request.node_vpn_ip,
                                          check=bool(request.check))
        self._log("remove_peer", peer=conn.peer_ip, check=bool(request.check), changed=result["changed"])
        conn.stream.send_result(result)

    def admit_nodes(self, conn: Connection, request: schema.AdmitNodesRequest) -> None:
        """The admin admits nodes to join (core/admission.py): admin only, on an activated Coordinator (declared in
        the schema, enforced by the server; the Core checks the role too)."""
        if self.admissions is None:
            raise AccessDenied("AdmitNodes: this agent admits no nodes")
        answer = self.admissions.admit_nodes(request.nodes, bool(request.check))
        self._log("admit_nodes", peer=conn.peer_ip, check=bool(request.check), changed=answer["changed"])
        conn.stream.send_result(schema.AdmitNodesAnswer.decode(answer).encode())

    def reset_agent(self, conn: Connection, request: schema.ResetAgentRequest) -> None:
        """The admin resets this agent (agent/daemon.py ``request_reset``): ``confirm`` must be this peer's
        public IP. A Coordinator refuses: its reset would end the cluster (remove_coordinator.yml first)."""
        public_ip = self.context.public_ip
        if request.confirm != public_ip:
            raise InputError("confirm", "this peer's public IP %s" % public_ip,
                             request.confirm if len(request.confirm) <= 64 else None)
        if self.context.role == "coordinator" and not request.force:
            raise StateError("ResetAgent: %s is a Coordinator: resetting it would take the cluster's state with it "
                             "(take it out first: remove_coordinator.yml; force: reset it anyway)" % public_ip)
        if self.reset is None:
            raise AccessDenied("ResetAgent: this agent cannot reset itself")
        wiped = self.reset()
        self._log("reset_requested", level="warning", peer=conn.peer_ip)
        conn.stream.send_result({"state": "resetting", "wiped": wiped})

    def set_measurements(self, conn: Connection, request: schema.SetMeasurementsRequest) -> None:
        """The accepted measurement sets (an image upgrade): admin only, on a Coordinator (the Core checks the role,
        the signature, the version and that no peer still runs a set the document drops)."""
        answer = self.measurements.set_measurements(request.document, request.signature, bool(request.check))
        self._log("set_measurements", peer=conn.peer_ip, version=answer["version"], changed=answer["changed"],
                  check=bool(request.check))
        conn.stream.send_result(schema.SetMeasurementsAnswer.decode(answer).encode())

    # -- Exec, ExecModule
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
