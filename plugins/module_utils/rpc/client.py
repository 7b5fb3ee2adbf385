# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Clients of the agent's pubapi, admin channel and vpnapi (docs/protocol.md).

``AgentClient.connect`` returns only after the agent passed attestation (aTLS verifies before
the first application byte), so nothing here is ever sent to an unverified agent.

aTLS and ``cryptography`` are imported only where they are used (connecting, AdminAuth, keys):
the atls connection plugin's task workers speak over an already attested relay socket and
import this module once per task.
"""

from __future__ import annotations

import hashlib
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils import rpc as apis
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.admin_key import sign_admin
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.peer_auth_client import PeerAuthClient
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import (
    CHANNEL_STDERR,
    CHANNEL_STDIN,
    CHANNEL_STDOUT,
    KIND_DATA,
    KIND_END,
    KIND_EOF,
    KIND_MSG,
    FrameStream,
    ProtocolError,
    b64d,
    b64e,
    raise_for_end,
)

if TYPE_CHECKING:  # pragma: no cover
    from ansible_collections.constellation.cluster.plugins.module_utils import atls

ADMIN_AUTH_CONTEXT = b"constellation-admin-auth-v1\x00"
JOIN_CONTEXT = b"constellation-join-v1\x00"
REJOIN_CONTEXT = b"constellation-rejoin-v1\x00"
DEFAULT_TIMEOUT = 60.0


def admin_auth_message(challenge: bytes, server_spki_hash: bytes) -> bytes:
    """What the admin signs: a fresh server challenge bound to this connection's server key."""
    return ADMIN_AUTH_CONTEXT + challenge + server_spki_hash


def join_user_data(server_spki_hash: bytes, node_vpn_pub_key: bytes, disk_uuid: str) -> bytes:
    """User data of a joining node's attestation: binds this connection and the request."""
    return hashlib.sha256(JOIN_CONTEXT + server_spki_hash + node_vpn_pub_key + disk_uuid.encode("utf-8")).digest()


def rejoin_user_data(server_spki_hash: bytes, vpn_ip: str, node_vpn_pub_key: bytes, disk_uuid: str) -> bytes:
    """User data of a rebooted Node's attestation (IssueRejoinTicket): binds this connection and the
    identity the Node claims (its VPN IP, WireGuard key and disk)."""
    return hashlib.sha256(REJOIN_CONTEXT + server_spki_hash + vpn_ip.encode("ascii") + b"\x00" + node_vpn_pub_key
                          + disk_uuid.encode("utf-8")).digest()


def _no_delay(sock: socket.socket) -> None:
    """Requests are small frames written one after another (request, stdin, EOF): without
    TCP_NODELAY each waits for the agent's delayed ACK (~40 ms)."""
    try:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass


def connect_enrolling(connect: Callable[[Sequence], "AgentClient"], validators: Sequence) -> "AgentClient":
    """``connect(validators)`` opens a new attested AgentClient. Where a validator trusts AKs only
    after enrollment (qemu-vtpm-ek) and this peer's AK is not certified yet, enroll it over a
    connection validated in everything but AK trust (EnrollAK carries no secret), then connect
    again: only that second connection, validated in full, is returned."""
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.ek import (
        EnrollmentRequired, enroll_over)

    try:
        return connect(validators)
    except EnrollmentRequired as needed:
        asking = needed.validator
    with connect([asking.enrollment_validator()]) as client:
        record = enroll_over(client, asking.ca_certs)
    asking.certified_aks.add(record)
    return connect(validators)


@dataclass
class ExecResult:
    exit_code: int
    stdout: bytes
    stderr: bytes
    warm: bool = False  # ExecModule ran it in a pre-warmed interpreter


class Channel:
    """One connection to an agent, shared by the per-API clients. Requests run one after another;
    ``invoke`` runs any request/answer method of the schema (rpc/schema.py) for this client's APIs."""

    APIS: Tuple[str, ...] = apis.APIS

    def __init__(self, sock: socket.socket, server_spki_hash: Optional[bytes] = None,
                 attested: Optional[atls.AttestedConnection] = None):
        self.sock = sock
        self.stream = FrameStream(sock)
        self.server_spki_hash = server_spki_hash
        self.attested = attested

    def attested_pcrs(self) -> Dict[int, bytes]:
        """The PCR values of the peer's verified attestation ({} on a plain connection)."""
        return dict(self.attested.validation.pcrs) if self.attested is not None else {}

    @property
    def measurement_set(self) -> Optional[str]:  # the accepted set the peer's attestation matched (None: plain)
        return self.attested.validation.measurement_set if self.attested is not None else None

    @property
    def agent(self) -> Optional[Tuple[str, bytes]]:
        """(name, PCR 13 value) of the accepted agent the peer's attestation matched (None: plain, or no PCR 13)."""
        from ansible_collections.constellation.cluster.plugins.module_utils.attestation.agent_measurement import running_agent

        return running_agent(self.attested.validation) if self.attested is not None else None

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> "Channel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- generic
    def invoke(self, name: str, on_log: Optional[Callable[[str], None]] = None, **fields: Any) -> Dict[str, Any]:
        """A method of the table (rpc/schema.py) that is one request and one END: the request
        record is built from ``fields`` and encoded, the answer is checked against its record."""
        from ansible_collections.constellation.cluster.plugins.module_utils.rpc import schema  # not per task

        spec = schema.method(name, self.APIS)
        result = self.call(spec.name, spec.request(**fields).encode(), on_log)
        spec.answer.decode(result)  # a malformed answer is refused here, naming the field
        return result

    def call(self, method: str, params: Optional[Dict[str, Any]] = None,
             on_log: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
        """A request whose answer is optional log lines and an END."""
        self.stream.send_request(method, params)
        while True:
            frame = self.stream.recv()
            if frame.kind == KIND_END:
                return raise_for_end(frame.message)
            if frame.kind == KIND_MSG and "log" in frame.message:
                if on_log is not None:
                    on_log(str(frame.message["log"]))
                continue
            raise ProtocolError("%s: unexpected %s frame in the answer" % (method, frame.kind_name))


class PubAPIClient(Channel):
    """The pubapi (docs/protocol.md): state, activation, join, recovery, AK enrollment."""

    APIS = (apis.PUBAPI,)

    def get_state(self) -> Dict[str, Any]:
        return self.invoke("GetState")

    def activate_as_coordinator(self, kms_uri: str, measurement_salt: bytes, admin_pub_key: str,
                                storage_uri: Optional[str] = None, cluster_config: Optional[Dict] = None,
                                on_log: Optional[Callable[[str], None]] = None,
                                init_secret: Optional[bytes] = None,
                                restore_state: Optional[Dict[str, Any]] = None,
                                peer_resource_version_floor: Optional[int] = None) -> Dict[str, Any]:
        """``init_secret``: the cluster's init secret (32 bytes), required by a node provisioned with an ``init_secret_hash``
        (docs/agent.md). ``restore_state``: an ``export_state`` answer a fresh peer resumes, above ``peer_resource_version_floor``."""
        return self.invoke("ActivateAsCoordinator", on_log, kms_uri=kms_uri, measurement_salt=measurement_salt,
                           admin_pub_key=admin_pub_key, storage_uri=storage_uri or None, cluster_config=cluster_config or {},
                           init_secret=init_secret, restore_state=restore_state, peer_resource_version_floor=peer_resource_version_floor)

    def activate_as_node(self, params: Dict[str, Any], disk_key_for: Callable[[str, str], bytes]) -> Dict[str, Any]:
        """The Coordinator's side of the two-step exchange; ``disk_key_for(uuid, node_vpn_pub_key)``
        records the node and derives the key."""
        uuid, pub_key = self._first_step("ActivateAsNode", params)
        self.stream.send_msg({"state_disk_key": b64e(disk_key_for(uuid, pub_key))})
        result = self.stream.recv_end()
        result["state_disk_uuid"] = uuid
        result["node_vpn_pub_key"] = pub_key
        return result

    def _first_step(self, method: str, params: Dict[str, Any]) -> Tuple[str, str]:
        """Sends an activation request; the peer's first answer: (its disk UUID, its WireGuard key, base64)."""
        self.stream.send_request(method, params)
        step = self.stream.recv_msg("the peer's disk UUID and VPN key")
        uuid = step.get("state_disk_uuid")
        if not isinstance(uuid, str):
            raise ProtocolError("%s: the peer sent no state_disk_uuid" % method)
        return uuid, b64e(b64d(step.get("node_vpn_pub_key"), "node_vpn_pub_key", 32))

    def activate_as_additional_coordinator(self, params: Dict[str, Any], secrets_for, promote) -> Dict[str, Any]:
        """The activating Coordinator's side (core/cluster.py, ports.NodeClient)."""
        self.stream.send_msg(secrets_for(*self._first_step("ActivateAsAdditionalCoordinator", params)))
        if self.stream.recv_msg("the start of its etcd member").get("etcd_member") != "started":
            raise ProtocolError("ActivateAsAdditionalCoordinator: the peer did not start its etcd member")
        promote()
        self.stream.send_msg({"etcd_member": "voting"})
        return self.stream.recv_end()

    def activate_additional_nodes(self, node_public_endpoints: List[str],
                                  on_log: Optional[Callable[[str], None]] = None,
                                  coordinator_public_endpoints: Optional[List[str]] = None,
                                  control_plane_endpoints: Optional[List[str]] = None, node_names=None) -> Dict[str, Any]:
        return self.invoke("ActivateAdditionalNodes", on_log, node_public_endpoints=list(node_public_endpoints),
                           coordinator_public_endpoints=list(coordinator_public_endpoints or []) or None,
                           control_plane_endpoints=list(control_plane_endpoints or []) or None, node_names=node_names or None)

    def recover(self, kms_uri: str) -> Dict[str, Any]:
        return self.invoke("Recover", kms_uri=kms_uri)

    def issue_rejoin_ticket(self, vpn_ip: str, node_vpn_pub_key: str, disk_uuid: str, issuer,
                            on_ticket: Callable[[Dict[str, Any]], None]) -> Dict[str, Any]:
        """A rebooted Node's side of IssueRejoinTicket: ``issuer`` attests this node bound to this
        connection and to the identity it claims; ``on_ticket(ticket)`` checks and takes the ticket."""
        if self.server_spki_hash is None:
            raise ProtocolError("IssueRejoinTicket needs an aTLS connection")
        raw_key = b64d(node_vpn_pub_key, "node_vpn_pub_key", 32)
        self.stream.send_request("IssueRejoinTicket", {"vpn_ip": vpn_ip, "node_vpn_pub_key": b64e(raw_key),
                                                       "disk_uuid": disk_uuid})
        nonce = b64d(self.stream.recv_msg("a nonce").get("nonce"), "nonce", 32)
        binding = rejoin_user_data(self.server_spki_hash, vpn_ip, raw_key, disk_uuid)
        document = issuer.issue(binding, nonce)
        self.stream.send_msg({"attestation": b64e(document), "variant_oid": issuer.oid})
        step = self.stream.recv_msg("a rejoin ticket")
        if step.get("enroll") is True:
            if not hasattr(issuer, "enrollment_request"):
                raise ProtocolError("IssueRejoinTicket: the Coordinator asks for an AK enrollment this variant cannot do")
            self.stream.send_msg(issuer.enrollment_request())
            challenge = self.stream.recv_msg("a credential challenge").get("challenge")
            self.stream.send_msg({"secret": b64e(issuer.activate_credential(challenge))})
            step = self.stream.recv_msg("a rejoin ticket")
        ticket = step.get("ticket")
        if not isinstance(ticket, dict):
            raise ProtocolError("IssueRejoinTicket: the answer holds no ticket")
        on_ticket(ticket, binding)  # the Coordinators' signature covers this connection and request
        self.stream.send_msg({"rejoined": True})
        return self.stream.recv_end()

    def enroll_ak(self, challenge_for: Callable[[Dict[str, Any]], Dict[str, Any]]) -> bytes:
        """EnrollAK (qemu-vtpm-ek): the node's {ek_cert, ak_pub} go to ``challenge_for``, whose
        credential challenge goes back; returns the secret the node's TPM recovered."""
        self.stream.send_request("EnrollAK", {})
        request = self.stream.recv_msg("the enrollment request")
        self.stream.send_msg({"challenge": challenge_for(request)})
        return b64d(self.stream.recv_end().get("secret"), "secret", 32)

    def issue_join_ticket(self, disk_uuid: str, node_vpn_pub_key: bytes, issuer,
                          on_ticket: Callable[[Dict[str, Any]], None], is_control_plane: bool = False,
                          certificate_request: Optional[bytes] = None) -> Dict[str, Any]:
        """The joining node's side. ``issuer`` attests this node; ``on_ticket(ticket)`` locks and
        configures the node (raising aborts the join); then the Coordinator records the peer.
        ``certificate_request``: the kubelet's CSR (Constellation's ``certificate_request``); the ticket's
        ``kubeadm`` part then holds ``kubelet_cert``."""
        if self.server_spki_hash is None:
            raise ProtocolError("IssueJoinTicket needs an aTLS connection")
        params = {"disk_uuid": disk_uuid, "node_vpn_pub_key": b64e(node_vpn_pub_key),
                  "is_control_plane": bool(is_control_plane)}
        if certificate_request is not None:
            params["certificate_request"] = b64e(certificate_request)
        self.stream.send_request("IssueJoinTicket", params)
        step = self.stream.recv_msg("a nonce")
        nonce = b64d(step.get("nonce"), "nonce", 32)
        binding = join_user_data(self.server_spki_hash, node_vpn_pub_key, disk_uuid)
        document = issuer.issue(binding, nonce)
        self.stream.send_msg({"attestation": b64e(document), "variant_oid": issuer.oid})
        step = self.stream.recv_msg("a join ticket")
        if step.get("enroll") is True:
            # qemu-vtpm-ek: the Coordinator certifies our AK through our EK first (EnrollAK in-band).
            if not hasattr(issuer, "enrollment_request"):
                raise ProtocolError("IssueJoinTicket: the Coordinator asks for an AK enrollment this variant cannot do")
            self.stream.send_msg(issuer.enrollment_request())
            challenge = self.stream.recv_msg("a credential challenge").get("challenge")
            self.stream.send_msg({"secret": b64e(issuer.activate_credential(challenge))})
            step = self.stream.recv_msg("a join ticket")
        ticket = step.get("ticket")
        if not isinstance(ticket, dict):
            raise ProtocolError("IssueJoinTicket: the answer holds no ticket")
        on_ticket(ticket, binding)  # the Coordinators' signature covers this connection and request
        self.stream.send_msg({"joined": True})
        return self.stream.recv_end()


class AdminClient(Channel):
    """The admin channel: AdminAuth, then commands and files."""

    APIS = (apis.ADMIN,)

    def admin_auth(self, priv_key) -> Dict[str, Any]:
        if self.server_spki_hash is None:
            raise ProtocolError("AdminAuth needs an aTLS connection")
        self.stream.send_request("AdminAuth", {})
        step = self.stream.recv_msg("a challenge")
        challenge = b64d(step.get("challenge"), "challenge", 32)
        self.stream.send_msg({"signature": b64e(sign_admin(priv_key, admin_auth_message(challenge,
                                                                                        self.server_spki_hash)))})
        return self.stream.recv_end()

    def export_state(self) -> Dict[str, Any]:
        """The Coordinator's whole store (after ``admin_auth``; backup.yml). Secret: keep it no longer than needed."""
        return self.invoke("ExportState")

    def coordinator_auth(self, sign_auth: Callable[[bytes, bytes], bytes]) -> Dict[str, Any]:
        """AdminAuth as the Coordinators (core/signing.py): ``sign_auth(challenge, server_spki_hash)``
        signs with their key. Unlocks GetState's details on this connection, nothing else."""
        if self.server_spki_hash is None:
            raise ProtocolError("AdminAuth needs an aTLS connection")
        self.stream.send_request("AdminAuth", {"role": "coordinator"})
        challenge = b64d(self.stream.recv_msg("a challenge").get("challenge"), "challenge", 32)
        self.stream.send_msg({"signature": b64e(sign_auth(challenge, self.server_spki_hash))})
        return self.stream.recv_end()

    def attest_again(self, validators: Sequence, attestation_timeout: float = 30.0):
        """A fresh proof on this kept connection: a new nonce, the agent's quote over it bound to this
        connection's certificate key, validated as the handshake's was. Returns the Validation;
        AttestationError says why it was refused."""
        import os

        from ansible_collections.constellation.cluster.plugins.module_utils import atls

        if self.server_spki_hash is None:
            raise ProtocolError("Attest needs an aTLS connection")
        nonce = os.urandom(atls.NONCE_SIZE)
        answer = self.invoke("Attest", nonce=nonce)
        document = b64d(answer.get("attestation"), "attestation", max_size=1 << 20)
        return atls.validate_document(str(answer.get("variant_oid")), document, validators, nonce,
                                      self.server_spki_hash, attestation_timeout)

    def exec_command(self, cmd=None, argv: Optional[List[str]] = None, stdin: bytes = b"",
                     cwd: Optional[str] = None, env: Optional[Dict[str, str]] = None, timeout: Optional[float] = None,
                     on_stdout: Optional[Callable[[bytes], None]] = None,
                     on_stderr: Optional[Callable[[bytes], None]] = None) -> ExecResult:
        params: Dict[str, Any] = {}
        if argv is not None:
            params["argv"] = list(argv)
        else:
            params["cmd"] = cmd
        if cwd:
            params["cwd"] = cwd
        if env:
            params["env"] = dict(env)
        if timeout:
            params["timeout"] = timeout
        return self._exec("Exec", params, stdin, on_stdout, on_stderr)

    def exec_module(self, cmd: str, interpreter: str, payload: bytes, env: Optional[Dict[str, str]] = None,
                    timeout: Optional[float] = None) -> ExecResult:
        """A pipelined Ansible module: ``cmd`` runs ``interpreter`` reading ``payload`` on stdin. The
        agent may run it in a pre-warmed interpreter, or else runs ``cmd`` as Exec would."""
        params: Dict[str, Any] = {"cmd": cmd, "interpreter": interpreter}
        if env:
            params["env"] = dict(env)
        if timeout:
            params["timeout"] = timeout
        return self._exec("ExecModule", params, payload)

    def _exec(self, method: str, params: Dict[str, Any], stdin: bytes,
              on_stdout: Optional[Callable[[bytes], None]] = None,
              on_stderr: Optional[Callable[[bytes], None]] = None) -> ExecResult:
        self.stream.send_request(method, params)
        self.stream.send_data(CHANNEL_STDIN, stdin or b"")
        self.stream.send_eof(CHANNEL_STDIN)
        out: Dict[int, List[bytes]] = {CHANNEL_STDOUT: [], CHANNEL_STDERR: []}
        sinks = {CHANNEL_STDOUT: on_stdout, CHANNEL_STDERR: on_stderr}
        while True:
            frame = self.stream.recv()
            if frame.kind == KIND_DATA and frame.channel in out:
                out[frame.channel].append(frame.data)
                if sinks[frame.channel] is not None:
                    sinks[frame.channel](frame.data)
            elif frame.kind == KIND_EOF:
                continue
            elif frame.kind == KIND_END:
                result = raise_for_end(frame.message)
                return ExecResult(int(result.get("exit_code", -1)), b"".join(out[CHANNEL_STDOUT]),
                                  b"".join(out[CHANNEL_STDERR]), bool(result.get("warm", False)))
            else:
                raise ProtocolError("%s: unexpected %s frame" % (method, frame.kind_name))

    def put_file(self, data, path: str, mode: Optional[int] = None) -> Dict[str, Any]:
        """``data``: bytes or a binary file object (read in chunks)."""
        params: Dict[str, Any] = {"path": path}
        if mode is not None:
            params["mode"] = int(mode)
        self.stream.send_request("PutFile", params)
        if isinstance(data, (bytes, bytearray, memoryview)):
            self.stream.send_data(CHANNEL_STDIN, bytes(data))
        else:
            while True:
                chunk = data.read(1 << 20)
                if not chunk:
                    break
                self.stream.send_data(CHANNEL_STDIN, chunk)
        self.stream.send_eof(CHANNEL_STDIN)
        return self.stream.recv_end()

    def fetch_file(self, path: str, sink) -> Dict[str, Any]:
        """``sink``: a binary file object or a callable taking bytes."""
        write = sink if callable(sink) else sink.write
        self.stream.send_request("FetchFile", {"path": path})
        self.stream.recv_data_until_eof(CHANNEL_STDOUT, write)
        return self.stream.recv_end()


class VPNAPIClient(PeerAuthClient, Channel):
    """The vpnapi, inside the VPN: ``peer_auth`` first (rpc/peer_auth_client.py)."""

    APIS = (apis.VPNAPI,)

    def get_update(self, resource_version: int, wait: Optional[float] = None) -> Dict[str, Any]:
        """``wait``: a long poll (the Coordinator answers at a change or after ``wait`` seconds; its answer
        then says ``long_poll``; an older Coordinator answers at once)."""
        return self.invoke("GetUpdate", resource_version=int(resource_version), wait=wait)

    def get_state_disk_key(self) -> bytes:
        """A node whose activation was interrupted: its own disk key (the caller's VPN IP says whose)."""
        return b64d(self.invoke("GetStateDiskKey").get("state_disk_key"), "state_disk_key", 32)

    def get_data_key(self, data_key_id: str, length: int = 32) -> bytes:
        return b64d(self.invoke("GetDataKey", data_key_id=data_key_id, length=length)["data_key"], "data_key", length)

    def get_join_args(self, certificate_request: Optional[bytes] = None, is_control_plane: bool = False) -> Dict[str, Any]:
        """A fresh token, the API server endpoint and the pinned CA hash; with ``certificate_request`` (the
        kubelet's CSR for this node's name and VPN IP) ``kubelet_cert``; a control plane gets
        ``control_plane_files`` too."""
        return self.invoke("GetJoinArgs", certificate_request=certificate_request,
                           is_control_plane=True if is_control_plane else None)

    def get_certificate_key(self) -> str:
        return self.invoke("GetCertificateKey")["certificate_key"]


class AgentClient(PubAPIClient, AdminClient, VPNAPIClient):
    """All three APIs on one connection (the agent's public listener serves pubapi and admin)."""

    APIS = apis.APIS

    # -- connecting
    @classmethod
    def connect(cls, endpoint: str, validators: Sequence, *, sock: Optional[socket.socket] = None,
                timeout: float = DEFAULT_TIMEOUT) -> "AgentClient":
        """aTLS to the agent's public endpoint; ``sock``: an already connected TCP socket."""
        from ansible_collections.constellation.cluster.plugins.module_utils import atls

        if sock is None:
            conn = atls.connect(endpoint, validators)
        else:
            conn = atls.client_handshake(sock, validators)
        conn.sock.settimeout(timeout)
        _no_delay(conn.sock)
        from cryptography import x509
        cert = x509.load_der_x509_certificate(conn.peer_certificate)
        return cls(conn.sock, atls.spki_hash(cert.public_key()), conn)

    @classmethod
    def connect_plain(cls, endpoint: str, *, timeout: float = DEFAULT_TIMEOUT, sock: Optional[socket.socket] = None,
                      connect_timeout: Optional[float] = None) -> "AgentClient":
        """Plain TCP (the vpnapi inside the VPN); ``connect_timeout`` (default ``timeout``) for the connect."""
        if sock is None:
            from ansible_collections.constellation.cluster.plugins.module_utils import atls

            host, port = atls.parse_endpoint(endpoint)
            try:
                sock = socket.create_connection((host, port), timeout=connect_timeout or timeout)
            except OSError as err:
                raise ConstellationError("cannot connect to %s: %s" % (endpoint, err)) from None
        sock.settimeout(timeout)
        return cls(sock)


# Inside the VPN a live Coordinator accepts within a round trip (WireGuard's keepalive keeps its session up).
FAILOVER_CONNECT_TIMEOUT = 2.0


def ask_in_turn(endpoints: List[str], call: Callable[[AgentClient], Any], timeout: float) -> Tuple[str, Any]:
    """``call(client)`` on the first of ``endpoints`` (vpnapi, plain: the WireGuard tunnel authenticates)
    that answers; (that endpoint, the answer). Only a connection that fails moves on to the next: an
    error the server answered with is raised. The last connection error when none answers. With another
    to ask, a connect waits at most FAILOVER_CONNECT_TIMEOUT (a dead host drops the SYN: no refusal comes)."""
    if not endpoints:
        raise ConstellationError("no Coordinator VPN IP is known")
    last: Optional[BaseException] = None
    for index, endpoint in enumerate(endpoints):
        connect_timeout = min(timeout, FAILOVER_CONNECT_TIMEOUT) if index < len(endpoints) - 1 else timeout
        try:
            client = AgentClient.connect_plain(endpoint, timeout=timeout, connect_timeout=connect_timeout)
        except (OSError, ConstellationError) as err:  # "cannot connect to ...": no answer from there
            last = err
            continue
        with client:
            return endpoint, call(client)
    raise last  # type: ignore[misc]
