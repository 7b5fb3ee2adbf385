# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Connection plugin atls: Ansible runs modules on attested Constellation nodes (DESIGN.md 1, 3).

A thin adapter: aTLS (module_utils/atls.py) attests the node before any byte is sent, the admin
channel (module_utils/rpc/client.py, docs/protocol.md) runs commands and moves files.

Ansible forks a worker per task and builds a new connection object in it, so a connection
object cannot carry a TLS connection from one task to the next. Like ssh's ControlPersist,
a small relay process per host and playbook run (the "mux") keeps the attested,
admin-authenticated TLS connection and lends it to the task workers over a 0600 Unix socket.
Every TLS connection is attested when it is opened; nothing is cached across TLS connections,
and the relay never outlives the ansible-playbook run that started it.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: atls
short_description: Run tasks on Constellation nodes over attested TLS (the node agent's admin channel)
description:
  - Connects to the node agent's public endpoint (default port 9000) with attested TLS. The node's
    attestation (a TPM quote bound to a fresh nonce and to the server's TLS key) is checked against the
    measurements policy B(before any byte is sent). A node that fails is reported C(UNREACHABLE) with
    the reason, for a measurements mismatch a table of PCR, expected and found values.
  - After attestation the connection proves possession of the admin key pinned at activation
    (C(AdminAuth), signed inside this TLS connection). Only then are commands run and files moved.
    Before activation the admin channel is refused (attestation still works, see
    M(constellation.cluster.verify_attestation)).
  - Pipelining is supported and recommended. Each playbook run keeps one attested TLS connection per
    host (a relay process like ssh's ControlPersist, see O(persist)); a new playbook run attests every
    host again.
  - Privilege. The agent runs as root, so commands run as root; C(become) is not needed. If C(become) is
    used anyway, the become plugin's command line (for example C(sudo -u root)) runs on the node as
    usual. To root it only costs time; to another user it works as over SSH, provided sudo or su exists
    on the node. Password prompts are not supported.
author:
  - constellation.cluster contributors (@constellation-cluster)
version_added: 0.1.0
options:
  host:
    description: Address of the node's agent. Ignored when O(endpoint) is set.
    type: str
    default: inventory_hostname
    vars:
      - name: inventory_hostname
      - name: ansible_host
      - name: delegated_vars['ansible_host']
  port:
    description: Port of the node agent's public endpoint. Ignored when O(endpoint) is set.
    type: int
    default: 9000
    vars:
      - name: constellation_public_port
  endpoint:
    description:
      - The node agent's public endpoint as C(host:port); overrides O(host) and O(port).
      - The lab writes it as C(constellation_public_endpoint).
    type: str
    vars:
      - name: constellation_public_endpoint
  measurements:
    description:
      - Measurements policy, inline, in Constellation's JSON shape
        (a mapping of PCR index to C(expected) hex and C(warnOnly)). Mutually exclusive with O(measurements_path).
      - Required for every variant but C(dummy). An empty policy is refused.
    type: dict
    vars:
      - name: constellation_measurements
  measurements_path:
    description: A JSON or YAML file holding the measurements policy. Mutually exclusive with O(measurements).
    type: path
    vars:
      - name: constellation_measurements_path
  attestation_variant:
    description:
      - Attestation variant the node must present (the chooser in C(module_utils/attestation/choose.py)).
      - V(qemu-vtpm) trusts the node's attestation key as Constellation does; V(qemu-vtpm-ek) trusts it only
        after enrollment through the TPM's EK certificate chain (to O(ek_ca_path)) and credential activation.
      - V(dummy) accepts any node and exists for tests only.
    type: str
    default: qemu-vtpm
    choices: [qemu-vtpm, qemu-vtpm-ek, dummy]
    vars:
      - name: constellation_attestation_variant
  ek_ca_path:
    description:
      - PEM file with the CA certificate(s) (root and intermediates) that the nodes' TPM EK certificates chain to;
        required for V(qemu-vtpm-ek). A node whose AK is not certified yet is enrolled first (C(EnrollAK)),
        and a TPM whose EK certificate does not chain to these CAs is unreachable with that reason.
    type: path
    vars:
      - name: constellation_ek_ca_path
  admin_priv_key_file:
    description:
      - The admin's private key (unencrypted PEM or OpenSSH; Ed25519 or ECDSA P-256), whose public key
        was pinned at activation. It signs a fresh challenge bound to each TLS connection; it is never sent.
    type: path
    required: true
    env:
      - name: CONSTELLATION_ADMIN_PRIV_KEY_FILE
    vars:
      - name: constellation_admin_priv_key_file
  connect_timeout:
    description: Seconds for the TCP connect and for the TLS handshake, each.
    type: float
    default: 10
    vars:
      - name: constellation_atls_connect_timeout
  attestation_timeout:
    description: Seconds the validation of the node's attestation may take.
    type: float
    default: 30
    vars:
      - name: constellation_atls_attestation_timeout
  command_timeout:
    description: Seconds a command may run on the node before the agent kills it; 0 means no limit.
    type: float
    default: 0
    vars:
      - name: constellation_atls_command_timeout
  persist:
    description:
      - Seconds the attested connection to a host stays open without use, to serve the next tasks of the
        same playbook run. V(0) opens (and attests) a new TLS connection for every task.
      - The relay process that holds it ends with the playbook run in any case.
    type: float
    default: 60
    env:
      - name: CONSTELLATION_ATLS_PERSIST
    vars:
      - name: constellation_atls_persist
  warm_interpreter:
    description:
      - Lets the agent run pipelined module payloads in a pre-warmed interpreter (the admin channel's
        C(ExecModule)). A fork server per interpreter and module zip on the node pays Python's start-up
        and imports once, and every module still runs in a process of its own.
      - V(false) runs every module with a fresh interpreter, as over SSH. Commands other than a pipelined
        module always run as they are.
    type: bool
    default: true
    env:
      - name: CONSTELLATION_ATLS_WARM_INTERPRETER
    vars:
      - name: constellation_atls_warm_interpreter
  control_path_dir:
    description: Folder (created with mode 0700) for the relay's Unix sockets.
    type: path
    default: ~/.ansible/cp
    env:
      - name: CONSTELLATION_ATLS_CONTROL_PATH_DIR
    vars:
      - name: constellation_atls_control_path_dir
  netns:
    description:
      - B(Lab only.) Name of a network namespace (C(/run/netns/NAME)) to open the TCP connection in, for a
        controller that runs outside the lab's namespaces. Leave unset on a real cluster.
    type: str
    vars:
      - name: constellation_atls_netns
extends_documentation_fragment:
  - ansible.builtin.connection_pipelining
notes:
  - Remote paths for file transfers must be absolute.
  - The remote user is ignored; the agent runs commands as root.
seealso:
  - name: Connection plugin documentation
    description: docs/connection.md in the collection
    link: https://github.com/constellation/cluster/blob/main/docs/connection.md
"""

EXAMPLES = r"""
# inventories/cluster/hosts.yml
# all:
#   vars:
#     ansible_connection: constellation.cluster.atls
#     ansible_pipelining: true
#     constellation_measurements_path: "{{ inventory_dir }}/measurements.json"
#     constellation_admin_priv_key_file: ~/.constellation/admin.key
#   hosts:
#     coordinator-0:
#       constellation_public_endpoint: 192.0.2.10:9000
#     node-0:
#       ansible_host: 192.0.2.11
"""

import errno
import fcntl
import hashlib
import json
import os
import re
import select
import shlex
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

from ansible.errors import AnsibleConnectionFailure, AnsibleError, AnsibleFileNotFound
from ansible.module_utils.common.text.converters import to_bytes, to_native
from ansible.plugins.connection import ConnectionBase
from ansible.utils.display import Display

display = Display()

COPY_CHUNK = 64 * 1024
MUX_MAX_SESSIONS = 16
MUX_START_TIMEOUT = 60.0
_COLLECTIONS_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), *([os.pardir] * 5)))


# ---------------------------------------------------------------------------------------------
# Settings: the options, validated, as one record the relay process can be given as JSON.


class SettingsError(AnsibleError):
    """An option has a value the plugin cannot use; names the option and what was expected."""


@dataclass
class Settings:
    endpoint: str
    variant: str
    measurements: Optional[Dict[str, Any]]
    admin_priv_key_file: str
    timeout: float
    attestation_timeout: float
    command_timeout: float
    persist: float
    control_path_dir: str
    netns: Optional[str]
    warm_interpreter: bool = True
    ek_ca_path: Optional[str] = None

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Settings":
        return cls(**json.loads(text))

    def control_path(self, playbook_pid: str) -> str:
        """One relay per (playbook run, endpoint, policy, admin key, namespace): a changed policy
        or key never reuses a connection attested under another one."""
        try:
            with open(self.admin_priv_key_file, "rb") as handle:
                key_digest = hashlib.sha256(handle.read()).hexdigest()
        except OSError:
            key_digest = ""
        material = json.dumps([playbook_pid, self.endpoint, self.variant, self.measurements, key_digest,
                               self.netns, _file_digest(self.ek_ca_path)], sort_keys=True)
        return os.path.join(self.control_path_dir, "atls-%s.sock" % hashlib.sha256(material.encode()).hexdigest()[:20])


def _file_digest(path: Optional[str]) -> str:
    if not path:
        return ""
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return ""


def _split_endpoint(endpoint: str):
    host, sep, port = endpoint.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host:
        raise SettingsError("endpoint: expected host:port, got %r" % endpoint)
    try:
        number = int(port)
    except ValueError:
        raise SettingsError("endpoint: expected host:port with a numeric port, got %r" % endpoint) from None
    if not 0 < number < 65536:
        raise SettingsError("endpoint: expected a port in 1-65535, got %r" % endpoint)
    return host, number


def _load_policy_file(path: str) -> Dict[str, Any]:
    import yaml  # JSON is YAML: one loader for both spellings of the policy

    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except OSError as err:
        raise SettingsError("measurements_path: expected a readable JSON or YAML file, got %s (%s)"
                            % (path, err.strerror)) from None
    except yaml.YAMLError as err:
        raise SettingsError("measurements_path: expected a JSON or YAML file, got %s (%s)" % (path, err)) from None
    if not isinstance(data, dict):
        raise SettingsError("measurements_path: expected a mapping of PCR index to measurement in %s" % path)
    return data


def _boolean(name: str, value: Any) -> bool:
    from ansible.module_utils.parsing.convert_bool import boolean

    if value is None:
        return True
    try:
        return boolean(value, strict=True)
    except TypeError:
        raise SettingsError("%s: expected a boolean, got %r" % (name, value)) from None


def _positive(name: str, value: Any, allow_zero: bool = False) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SettingsError("%s: expected a number of seconds, got %r" % (name, value)) from None
    if number < 0 or (number == 0 and not allow_zero) or number > 86400:
        interval = "[0, 86400]" if allow_zero else "(0, 86400]"
        raise SettingsError("%s: expected seconds in %s, got %r" % (name, interval, value))
    return number


def settings_from_options(get_option: Callable[[str], Any]) -> Settings:
    """Validates the plugin's options; every error names the option and what was expected."""
    endpoint = get_option("endpoint")
    if endpoint:
        endpoint = str(endpoint)
    else:
        host = get_option("host")
        port = get_option("port")
        if not host:
            raise SettingsError("host: expected the node's address (or set endpoint)")
        endpoint = "[%s]:%s" % (host, port) if ":" in str(host) else "%s:%s" % (host, port)
    _split_endpoint(endpoint)

    from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose

    variant = get_option("attestation_variant") or choose.DEFAULT_VARIANT
    if variant not in choose.VARIANT_NAMES:
        raise SettingsError("attestation_variant: expected one of %s, got %r" % (", ".join(choose.VARIANT_NAMES),
                                                                                 variant))
    ek_ca_path = get_option("ek_ca_path") or None
    if choose.spec(variant).needs_ek_ca:
        if not ek_ca_path:
            raise SettingsError("ek_ca_path: expected the PEM file of the CA(s) that TPMs' EK certificates chain to "
                                "(constellation_ek_ca_path), for variant %s" % variant)
        ek_ca_path = os.path.abspath(os.path.expanduser(str(ek_ca_path)))
        if not os.path.isfile(ek_ca_path):
            raise SettingsError("ek_ca_path: expected a readable PEM file, got %s" % ek_ca_path)
    else:
        ek_ca_path = None
    inline, path = get_option("measurements"), get_option("measurements_path")
    if inline is not None and path:
        raise SettingsError("measurements and measurements_path are mutually exclusive: set one")
    measurements = _load_policy_file(path) if path else inline
    if measurements is not None and not isinstance(measurements, dict):
        raise SettingsError("measurements: expected a mapping of PCR index to measurement, got %s"
                            % type(measurements).__name__)
    if variant != "dummy":
        if not measurements:
            raise SettingsError("measurements: expected a measurements policy (measurements or measurements_path) "
                                "for variant %s; an empty policy would accept any TPM" % variant)
        _policy(measurements)  # validate now: a typo must not surface as "unreachable" later

    key_file = get_option("admin_priv_key_file")
    if not key_file:
        raise SettingsError("admin_priv_key_file: expected the path of the admin's private key "
                            "(constellation_admin_priv_key_file)")
    key_file = os.path.abspath(os.path.expanduser(str(key_file)))
    if not os.path.isfile(key_file):
        raise SettingsError("admin_priv_key_file: expected a readable private key file, got %s" % key_file)

    netns = get_option("netns") or None
    if netns is not None and (not isinstance(netns, str) or "/" in netns or netns in (".", "..")):
        raise SettingsError("netns: expected the name of a network namespace in /run/netns, got %r" % netns)

    return Settings(
        endpoint=endpoint,
        variant=variant,
        measurements=measurements if variant != "dummy" else None,
        admin_priv_key_file=key_file,
        timeout=_positive("connect_timeout", get_option("connect_timeout")),
        attestation_timeout=_positive("attestation_timeout", get_option("attestation_timeout")),
        command_timeout=_positive("command_timeout", get_option("command_timeout") or 0, allow_zero=True),
        persist=_positive("persist", get_option("persist") or 0, allow_zero=True),
        control_path_dir=os.path.abspath(os.path.expanduser(str(get_option("control_path_dir") or "~/.ansible/cp"))),
        netns=netns,
        warm_interpreter=_boolean("warm_interpreter", get_option("warm_interpreter")),
        ek_ca_path=ek_ca_path,
    )


def _policy(measurements: Dict[str, Any]):
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import Measurements
    from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError

    try:
        policy = Measurements.from_dict(measurements)
    except (ConstellationError, ValueError, TypeError) as err:
        raise SettingsError("measurements: %s" % err) from None
    if not policy.pcrs:
        raise SettingsError("measurements: expected at least one PCR: an empty policy would accept any TPM")
    return policy


# ---------------------------------------------------------------------------------------------
# Opening an attested, admin-authenticated connection (used by the relay, or per task)


def _tcp_socket(settings: Settings) -> socket.socket:
    host, port = _split_endpoint(settings.endpoint)
    if settings.netns is None:
        return socket.create_connection((host, port), timeout=settings.timeout)
    # Lab only: a socket keeps the namespace it was made in, so make it in a thread that entered it.
    box: Dict[str, Any] = {}

    def make() -> None:
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open("/run/netns/%s" % settings.netns, os.O_RDONLY)
            try:
                if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
                    raise OSError(ctypes.get_errno(), "setns %s: %s" % (settings.netns,
                                                                        os.strerror(ctypes.get_errno())))
            finally:
                os.close(fd)
            box["sock"] = socket.create_connection((host, port), timeout=settings.timeout)
        except OSError as err:
            box["error"] = err

    worker = threading.Thread(target=make, name="atls-netns")
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["sock"]


def _pcr_table(err: BaseException) -> str:
    rows = []
    for check in getattr(err, "checks", None) or []:
        if not check.ok:
            rows.append("PCR %d: expected %s, found %s" % (check.index, check.expected, check.found or "(not quoted)"))
    return "; ".join(rows)


def open_admin_client(settings: Settings):
    """An AgentClient on a TLS connection whose peer passed attestation and which proved the admin
    key. Raises AnsibleConnectionFailure naming the reason."""
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import settings_from_args
    from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
        AttestationError, ConstellationError)
    from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import (
        AgentClient, connect_enrolling, load_priv_key)
    from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import RemoteError

    where = settings.endpoint
    try:
        # The validators come from the one chooser, through the same settings as the cluster actions.
        attestation = settings_from_args({"variant": settings.variant, "measurements": settings.measurements,
                                          "ek_ca_path": settings.ek_ca_path, "netns": settings.netns,
                                          "timeout": settings.timeout,
                                          "attestation_timeout": settings.attestation_timeout})
        validators = attestation.validators()
    except ConstellationError as err:
        raise AnsibleConnectionFailure("%s: %s" % (where, err)) from None
    try:
        with open(settings.admin_priv_key_file, "rb") as handle:
            priv_key = load_priv_key(handle.read())
    except OSError as err:
        raise AnsibleConnectionFailure("admin_priv_key_file: cannot read %s: %s"
                                       % (settings.admin_priv_key_file, err.strerror)) from None
    except ConstellationError as err:
        raise AnsibleConnectionFailure("admin_priv_key_file %s: %s" % (settings.admin_priv_key_file, err)) from None

    def connect(with_validators):
        try:
            sock = _tcp_socket(settings)
        except OSError as err:
            raise AnsibleConnectionFailure("%s: cannot connect: %s" % (where, err.strerror or err)) from None
        return AgentClient.connect(where, with_validators, sock=sock, timeout=settings.timeout)

    try:
        # qemu-vtpm-ek: a node whose AK is not certified yet is enrolled first (EnrollAK), then attested.
        client = connect_enrolling(connect, validators)
    except AttestationError as err:
        table = _pcr_table(err)
        raise AnsibleConnectionFailure("%s: attestation refused, nothing was sent: %s%s"
                                       % (where, err, " [%s]" % table if table else "")) from None
    except ConstellationError as err:
        raise AnsibleConnectionFailure("%s: %s" % (where, err)) from None
    try:
        client.admin_auth(priv_key)
    except RemoteError as err:
        client.close()
        if err.kind == "StateError":
            raise AnsibleConnectionFailure("%s: attested, but the admin channel is refused: %s" % (where, err)) from None
        if err.kind == "AccessDenied":
            raise AnsibleConnectionFailure("%s: attested, but not authorised: %s (is %s the admin key pinned at "
                                           "activation?)" % (where, err, settings.admin_priv_key_file)) from None
        raise AnsibleConnectionFailure("%s: AdminAuth failed: %s: %s" % (where, err.kind, err)) from None
    except ConstellationError as err:
        client.close()
        raise AnsibleConnectionFailure("%s: AdminAuth failed: %s" % (where, err)) from None
    for warning in client.attested.validation.warnings:
        display.warning("%s: %s" % (where, warning))
    return client


# ---------------------------------------------------------------------------------------------
# The relay ("mux"): one process per host and playbook run, holding attested TLS connections.
#
# Session protocol on the Unix socket (same frames as the agent): the relay first sends one END
# (result: the connection is ready; error: why not), then relays requests. It knows the methods'
# shapes, so it knows when a TLS connection is idle again and can lend it to the next task.

_STDIN_METHODS = ("Exec", "ExecModule", "PutFile")
_NEXT = "next"
_SESSION_END = "session-end"
_BROKEN = "broken"
_RELAYED_METHODS = ("Exec", "ExecModule", "PutFile", "FetchFile", "GetState")


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

    def take(self):
        with self.lock:
            while self.idle:
                client = self.idle.pop()
                # A readable idle connection holds an EOF or garbage: the agent closed it.
                readable, _w, _x = select.select([client.sock], [], [], 0)
                if not readable:
                    return client
                client.close()
        return open_admin_client(self.settings)

    def give_back(self, client) -> None:
        with self.lock:
            if len(self.idle) < 2:
                self.idle.append(client)
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
        if method not in _RELAYED_METHODS:
            local.send_error(ProtocolError("the relay passes on only %s" % ", ".join(_RELAYED_METHODS)))
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
            if method in _STDIN_METHODS:
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
            for client in self.idle:
                client.close()
            self.idle = []


def relay_main() -> int:
    """Entry of the relay process: settings as JSON on stdin; one status line on stdout."""
    request = json.loads(sys.stdin.readline())
    settings = Settings.from_json(request["settings"])
    path, playbook_pid = request["path"], int(request["playbook_pid"])
    out = sys.stdout
    try:
        first = open_admin_client(settings)  # attest before anyone may use the socket
    except AnsibleError as err:
        out.write(json.dumps({"error": to_native(err.message)}) + "\n")
        out.flush()
        return 1
    relay = _Relay(settings, playbook_pid, path)
    relay.idle.append(first)
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
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    relay.run(listener)
    return 0


_SHELLS = ("/bin/sh", "/bin/bash", "/bin/dash", "/usr/bin/sh", "/usr/bin/bash", "/usr/bin/dash")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def pipelined_module(cmd: str, in_data: Optional[bytes]):
    """(interpreter, env) when ``cmd``/``in_data`` is Ansible's pipelined module execution
    (``/bin/sh -c '[NAME=value ...] /path/python [&& sleep 0]'`` with the payload on stdin), else None.

    Only that exact shape qualifies; anything else (become, a shell construct, expansions) is left
    to Exec, and the agent runs ``cmd`` itself whenever it cannot run the payload warm."""
    if not in_data or not in_data.startswith(b"#!"):
        return None
    try:
        outer = shlex.split(cmd)
    except ValueError:
        return None
    if len(outer) != 3 or outer[0] not in _SHELLS or outer[1] != "-c":
        return None
    inner = outer[2]
    if any(c in inner for c in "$`\\;|<>(){}*?[]~\n"):
        return None
    try:
        words = shlex.split(inner)
    except ValueError:
        return None
    env: Dict[str, str] = {}
    while words and "=" in words[0]:
        name, _eq, value = words.pop(0).partition("=")
        if not _ENV_NAME.match(name):
            return None
        env[name] = value
    if words[1:] not in ([], ["&&", "sleep", "0"]) or not words:
        return None
    interpreter = words[0]
    if not os.path.isabs(interpreter) or not os.path.basename(interpreter).startswith("python"):
        return None
    if in_data.split(b"\n", 1)[0] != b"#!" + to_bytes(interpreter):
        return None
    return interpreter, env


def _ensure_private_dir(path: str) -> None:
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.stat(path)
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise AnsibleConnectionFailure("control_path_dir %s must be owned by this user with mode 0700" % path)


def _connect_unix(path: str) -> Optional[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as err:
        sock.close()
        if err.errno in (errno.ENOENT, errno.ECONNREFUSED):
            return None
        raise
    return sock


def _start_relay(settings: Settings, path: str, playbook_pid: str) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([_COLLECTIONS_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                               if p])
    code = "from ansible_collections.constellation.cluster.plugins.connection.atls import relay_main; " \
           "raise SystemExit(relay_main())"
    with open(os.devnull, "wb") as devnull:
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=devnull, env=env, start_new_session=True, close_fds=True)
    try:
        proc.stdin.write(to_bytes(json.dumps({"settings": settings.to_json(), "path": path,
                                              "playbook_pid": playbook_pid}) + "\n"))
        proc.stdin.close()
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


# ---------------------------------------------------------------------------------------------
# The connection plugin


class Connection(ConnectionBase):
    """aTLS to the node agent; commands and files over its admin channel."""

    transport = "constellation.cluster.atls"
    has_pipelining = True
    has_tty = False

    def __init__(self, play_context, *args, **kwargs):
        super().__init__(play_context, *args, **kwargs)
        self._client = None
        self._settings: Optional[Settings] = None
        # Task workers are told the run's pid; the strategy itself (reset_connection) is that process.
        self._playbook_pid = str(kwargs.get("ansible_playbook_pid") or os.getpid())

    # -- connecting
    def _settings_now(self) -> Settings:
        try:
            return settings_from_options(self.get_option)
        except SettingsError as err:
            raise AnsibleConnectionFailure("constellation.cluster.atls: %s" % err.message) from None

    def _connect(self):
        if self._connected:
            return self
        self._settings = settings = self._settings_now()
        if settings.persist > 0:
            self._client = self._via_relay(settings)
        else:
            self._client = open_admin_client(settings)
        self._connected = True
        display.vvv("ATLS: attested and admin-authenticated connection to %s" % settings.endpoint,
                    host=settings.endpoint)
        return self

    def _via_relay(self, settings: Settings):
        from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
        from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient
        from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import RemoteError

        _ensure_private_dir(settings.control_path_dir)
        path = settings.control_path(self._playbook_pid)
        sock = _connect_unix(path)
        if sock is None:
            with open(path + ".lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                sock = _connect_unix(path)
                if sock is None:
                    _start_relay(settings, path, self._playbook_pid)
                    sock = _connect_unix(path)
        if sock is None:
            raise AnsibleConnectionFailure("%s: the connection relay at %s is gone" % (settings.endpoint, path))
        sock.settimeout(None)
        client = AgentClient(sock)  # the relay attested and authenticated; this socket is local
        try:
            client.stream.recv_end()
        except RemoteError as err:
            client.close()
            raise AnsibleConnectionFailure(str(err)) from None
        except ConstellationError as err:
            client.close()
            raise AnsibleConnectionFailure("%s: connection relay: %s" % (settings.endpoint, err)) from None
        return client

    def _call(self, what: str, func, *args, **kwargs):
        from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
        from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import (
            ConnectionClosed, RemoteError)

        try:
            return func(*args, **kwargs)
        except RemoteError as err:
            if err.kind == "AccessDenied":
                raise AnsibleConnectionFailure("%s: %s: not authorised: %s" % (self._settings.endpoint, what, err))
            raise AnsibleError("%s: %s failed: %s: %s" % (self._settings.endpoint, what, err.kind, err)) from None
        except ConnectionClosed as err:
            self.close()
            raise AnsibleConnectionFailure("%s: %s: connection lost: %s" % (self._settings.endpoint, what, err)) from None
        except ConstellationError as err:
            self.close()
            raise AnsibleConnectionFailure("%s: %s: %s" % (self._settings.endpoint, what, err)) from None

    # -- commands
    def exec_command(self, cmd, in_data=None, sudoable=True):
        super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        self._connect()
        cmd = to_native(cmd)
        timeout = self._settings.command_timeout or None
        module = pipelined_module(cmd, in_data) if self._settings.warm_interpreter else None
        if module is not None:
            interpreter, env = module
            display.vvv("ATLS: EXEC (module, %s) %s" % (interpreter, cmd), host=self._settings.endpoint)
            result = self._call("ExecModule", self._client.exec_module, cmd, interpreter, in_data, env=env,
                                timeout=timeout)
        else:
            display.vvv("ATLS: EXEC %s" % cmd, host=self._settings.endpoint)
            result = self._call("Exec", self._client.exec_command, cmd, stdin=in_data or b"", timeout=timeout)
        return result.exit_code, result.stdout, result.stderr

    # -- files
    @staticmethod
    def _remote_path(path: str, field: str) -> str:
        path = to_native(path)
        if not os.path.isabs(path):
            raise AnsibleError("%s: the atls connection needs an absolute remote path, got %r" % (field, path))
        return path

    def put_file(self, in_path, out_path):
        super().put_file(in_path, out_path)
        self._connect()
        remote = self._remote_path(out_path, "out_path")
        display.vvv("ATLS: PUT %s TO %s" % (in_path, remote), host=self._settings.endpoint)
        local = to_bytes(in_path, errors="surrogate_or_strict")
        if not os.path.exists(local):
            raise AnsibleFileNotFound("file or module does not exist: %s" % to_native(in_path))
        digest = hashlib.sha256()
        with open(local, "rb") as handle:
            class _Hashing:  # streams the file in chunks and hashes what was sent
                @staticmethod
                def read(_size):
                    chunk = handle.read(COPY_CHUNK)
                    digest.update(chunk)
                    return chunk

            result = self._call("PutFile", self._client.put_file, _Hashing(), remote)
        if result.get("sha256") != digest.hexdigest():
            raise AnsibleError("%s: PutFile %s: the node stored sha256 %s, but %s was sent"
                               % (self._settings.endpoint, remote, result.get("sha256"), digest.hexdigest()))

    def fetch_file(self, in_path, out_path):
        super().fetch_file(in_path, out_path)
        self._connect()
        remote = self._remote_path(in_path, "in_path")
        display.vvv("ATLS: FETCH %s TO %s" % (remote, out_path), host=self._settings.endpoint)
        local = to_bytes(out_path, errors="surrogate_or_strict")
        digest = hashlib.sha256()
        tmp = local + b".atls-part"
        try:
            with open(tmp, "wb") as handle:
                def sink(data: bytes) -> None:
                    digest.update(data)
                    handle.write(data)

                result = self._call("FetchFile", self._client.fetch_file, remote, sink)
                handle.flush()
                os.fsync(handle.fileno())
            if result.get("sha256") != digest.hexdigest():
                raise AnsibleError("%s: FetchFile %s: received sha256 %s, the node sent %s"
                                   % (self._settings.endpoint, remote, digest.hexdigest(), result.get("sha256")))
            os.replace(tmp, local)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    # -- lifecycle
    def close(self):
        if self._client is not None:
            self._client.close()
            self._client = None
        self._connected = False

    def reset(self):
        """Drops this host's kept connection: the next task connects and attests again."""
        self.close()
        settings = self._settings or self._settings_now()
        if settings.persist > 0:
            try:
                sock = _connect_unix(settings.control_path(self._playbook_pid))
            except OSError:
                sock = None
            if sock is not None:
                from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import FrameStream

                stream = FrameStream(sock)
                try:
                    sock.settimeout(10)
                    stream.recv()  # the relay's greeting
                    stream.send_request("RelayShutdown")
                    stream.recv()
                except Exception:  # pylint: disable=broad-except
                    pass
                finally:
                    sock.close()
