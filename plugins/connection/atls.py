# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Connection plugin atls: Ansible runs modules on attested Constellation nodes (docs/connection.md).

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
        (a mapping of PCR index to C(expected) hex and C(warnOnly)). Mutually exclusive with O(measurements_file).
      - Required for every variant but C(dummy). An empty policy is refused.
    type: dict
    vars:
      - name: constellation_measurements
  measurements_file:
    description:
      - A JSON or YAML file holding the measurements policy. Mutually exclusive with O(measurements).
      - The variable's old name C(constellation_measurements_path) is deprecated and will be removed in 2.0.0.
    type: path
    vars:
      - name: constellation_measurements_path
        deprecated:
          why: renamed to follow the collection's naming convention
          version: "2.0.0"
          collection_name: constellation.cluster
          alternatives: constellation_measurements_file
      - name: constellation_measurements_file
  measurements_pub_key_file:
    description:
      - A pinned ECDSA P-256 public key (PEM, as C(cosign.pub)). The policy file O(measurements_file) is used only
        if its detached signature C(<file>.sig) (C(cosign sign-blob) form) verifies with it; an unsigned or altered
        file makes the host unreachable, naming the file. Inline O(measurements) are then refused.
      - The variable's old name C(constellation_measurements_public_key_path) is deprecated and will be removed in 2.0.0.
    type: path
    vars:
      - name: constellation_measurements_public_key_path
        deprecated:
          why: renamed to follow the collection's naming convention
          version: "2.0.0"
          collection_name: constellation.cluster
          alternatives: constellation_measurements_pub_key_file
      - name: constellation_measurements_pub_key_file
  attestation_variant:
    description:
      - Attestation variant the node must present (the chooser in C(module_utils/attestation/choose.py)).
      - V(qemu-vtpm-ek) (the default) trusts the node's attestation key only after enrollment through the TPM's
        EK certificate chain (to O(ek_ca_path)) and credential activation.
      - V(qemu-vtpm) trusts any attestation key, as Constellation does (a software key that declares itself a
        TPM key passes); it is refused unless O(insecure_trust_any_ak) is true, and then warned about.
      - V(sev-snp) trusts the node's AMD SEV-SNP report (no vTPM), chained to O(amd_roots).
      - V(azure-sev-snp) and V(aws-sev-snp) trust the vTPM's attestation key because the node's SEV-SNP report
        (chained to O(amd_roots)) binds it.
      - V(dummy) accepts any node and is refused outside the test suite.
    type: str
    default: qemu-vtpm-ek
    choices: [qemu-vtpm, qemu-vtpm-ek, sev-snp, azure-sev-snp, aws-sev-snp, dummy]
    vars:
      - name: constellation_attestation_variant
  insecure_trust_any_ak:
    description:
      - The explicit acknowledgement that V(qemu-vtpm) trusts ANY attestation key. Without it V(qemu-vtpm) is
        refused naming this option; with it every run warns.
    type: bool
    default: false
    vars:
      - name: constellation_insecure_trust_any_ak
  ek_ca_path:
    description:
      - PEM file with the CA certificate(s) (roots and intermediates; a bundle of several CAs) or a folder of such
        files, that the nodes' TPM EK certificates chain to; required for V(qemu-vtpm-ek). Only self-signed CAs
        are trust anchors; the others are intermediates. A node whose AK is not certified yet is enrolled first
        (C(EnrollAK)), and a TPM whose EK certificate does not chain to these CAs is unreachable with that reason.
    type: path
    vars:
      - name: constellation_ek_ca_path
  amd_roots:
    description:
      - PEM file (or folder of them) with AMD's root certificates (ARK, ASK/ASVK) the nodes' SEV-SNP reports chain
        to, for the SEV-SNP variants. Default AMD's own roots, pinned in the collection.
    type: path
    vars:
      - name: constellation_amd_roots_path
  admin_priv_key_file:
    description:
      - The admin's private key (PEM or OpenSSH; Ed25519 or ECDSA P-256), whose public key was pinned at
        activation. It signs a fresh challenge bound to each TLS connection; it is never sent.
      - It may be an Ansible Vault file (decrypted in memory with the run's vault secrets, never written
        decrypted) or passphrase-protected (O(admin_priv_key_passphrase)).
    type: path
    required: true
    env:
      - name: CONSTELLATION_ADMIN_PRIV_KEY_FILE
    vars:
      - name: constellation_admin_priv_key_file
  admin_priv_key_passphrase:
    description:
      - The passphrase of a passphrase-protected admin key. Keep it in Ansible Vault.
      - A passphrase-protected OpenSSH key needs the Python package C(bcrypt) on the controller.
    type: str
    version_added: "0.4.0"
    vars:
      - name: constellation_admin_key_passphrase
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
  prestart:
    description:
      - A task that attests the host from the controller and finds it activated (M(constellation.cluster.agent_state),
        as step 1 of C(site.yml) does for every peer) starts the host's relay (O(persist)) in the background, so the
        run's first task over this connection does not wait for the attestation and admin authentication. The relay
        attests the host as always; with O(fresh_proof) the first task still gets a fresh proof.
      - V(false) starts the relay with the first task over the connection. Without O(persist) there is no relay to start.
    type: bool
    default: true
    env:
      - name: CONSTELLATION_ATLS_PRESTART
    vars:
      - name: constellation_atls_prestart
  fresh_proof:
    description:
      - Before every task on a kept connection (O(persist)), the agent proves itself again - a new quote over a
        new nonce, bound to that very connection's certificate key, checked against the policy (the admin
        channel's C(Attest)). A host whose PCRs changed since the connection was attested is unreachable for that
        task, with the attestation error, and nothing is sent to it.
      - V(false) trusts the attestation of the connection's handshake for every task it serves (at most
        O(persist) idle seconds apart). A new connection is always attested in its handshake.
    type: bool
    default: true
    env:
      - name: CONSTELLATION_ATLS_FRESH_PROOF
    vars:
      - name: constellation_atls_fresh_proof
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
#     constellation_measurements_file: "{{ inventory_dir }}/measurements.json"
#     constellation_admin_priv_key_file: ~/.constellation/admin.key
#   hosts:
#     coordinator-0:
#       constellation_public_endpoint: 192.0.2.10:9000
#     node-0:
#       ansible_host: 192.0.2.11
"""

import fcntl
import hashlib
import os
from typing import Optional

from ansible.errors import AnsibleConnectionFailure, AnsibleError, AnsibleFileNotFound
from ansible.module_utils.common.text.converters import to_bytes, to_native
from ansible.plugins.connection import ConnectionBase
from ansible.utils.display import Display

# The plugin is a shim (as mitogen's): settings, the session opener, the relay process and the
# module planner live in plugins/plugin_utils/atls/. Names kept importable from here.
from ansible_collections.constellation.cluster.plugins.plugin_utils import quiet_library_warnings
from ansible_collections.constellation.cluster.plugins.plugin_utils.atls.planner import pipelined_module
from ansible_collections.constellation.cluster.plugins.plugin_utils.atls.relay import (
    connect_unix,
    ensure_private_dir,
    relay_main,
    start_relay,
    start_relay_in_background,
)
from ansible_collections.constellation.cluster.plugins.plugin_utils.atls.session import open_admin_client, validators_for
from ansible_collections.constellation.cluster.plugins.plugin_utils.atls.settings import (
    Settings,
    SettingsError,
    settings_from_options,
)

__all__ = ["Connection", "Settings", "SettingsError", "open_admin_client", "pipelined_module", "relay_main",
           "settings_from_options"]

display = Display()

COPY_CHUNK = 64 * 1024


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
        quiet_library_warnings()
        self._settings = settings = self._settings_now()
        if settings.insecure_trust_any_ak:
            from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose

            display.warning(choose.insecure_warning(settings.variant) or "insecure_trust_any_ak is set")
        if settings.persist > 0:
            self._client = self._via_relay(settings)
        else:
            self._client = open_admin_client(settings, validators_for(settings, self._playbook_pid))
        self._connected = True
        display.vvv("ATLS: attested and admin-authenticated connection to %s" % settings.endpoint,
                    host=settings.endpoint)
        return self

    def start_in_background(self) -> bool:
        """Starts this host's relay without waiting for it (option prestart); False if it is not
        started now (prestart or persist off, or a relay runs or is starting). The first task over
        the connection waits for a relay that is starting; a relay that failed is started again by
        that task, which reports why."""
        settings = self._settings_now()
        if settings.persist <= 0 or not settings.prestart:
            return False
        return start_relay_in_background(settings, settings.control_path(self._playbook_pid), self._playbook_pid)

    def _via_relay(self, settings: Settings):
        from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
        from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient
        from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import RemoteError

        ensure_private_dir(settings.control_path_dir)
        path = settings.control_path(self._playbook_pid)
        sock = connect_unix(path)
        if sock is None:
            with open(path + ".lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                sock = connect_unix(path)
                if sock is None:
                    start_relay(settings, path, self._playbook_pid)
                    sock = connect_unix(path)
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
                sock = connect_unix(settings.control_path(self._playbook_pid))
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
