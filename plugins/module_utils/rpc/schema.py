# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The RPC schema: one dataclass per request and per answer, and ONE table of methods.

From the table (``METHODS``) come the server's dispatch (``server.FrameServer`` refuses a method
its API does not have and decodes every request before the handler sees it), the clients
(``client.PubAPIClient``, ``AdminClient``, ``VPNAPIClient``: ``invoke(name, **fields)``), the relay
of the atls connection plugin (which methods it passes on, which carry stdin) and the tables of
docs/protocol.md that list methods (``render_markdown``, checked by a test). A new method is one request
record, one answer record and one ``register(Method(...))`` here, plus its handler.

Decoding is strict on types (base64 through ``encoding.b64decode`` with the size, integers are
not booleans) and never echoes a value: a wrong field is named with its expected kind and the
type found. Unknown fields are ignored (an older agent accepts a newer client's extras).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple, Type

from ansible_collections.constellation.cluster.plugins.module_utils.encoding import b64decode, b64encode
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError

from ansible_collections.constellation.cluster.plugins.module_utils.rpc import (  # noqa: F401 pylint: disable=unused-import
    ADMIN,
    APIS,
    PUBAPI,
    VPNAPI,
)
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.access import (  # noqa: F401 pylint: disable=unused-import
    CALLER_ADMIN,
    CALLER_ANYONE,
    CALLER_CONTROL_PLANE,
    CALLER_COORDINATORS,
    CALLER_INIT_SECRET,
    CALLER_PEER,
    CALLER_VERIFIED_PEER,
    CALLER_VPN_PEER,
    SERVED_ACCEPTING_INIT,
    SERVED_ACTIVATED,
    SERVED_ADMIN_KEY_PINNED,
    SERVED_ALWAYS,
    SERVED_COORDINATOR,
    Access,
)

# What a method streams besides its request and END (docs/protocol.md, "Frames").
STREAMS_NONE = "none"
STREAMS_LOG = "log lines (MSG)"
STREAMS_EXCHANGE = "message exchange (MSG steps)"
STREAMS_STDIN = "stdin (DATA 0, EOF)"
STREAMS_STDOUT = "stdout (DATA 1, EOF)"
STREAMS_PROCESS = "stdin, then stdout and stderr"

MAX_LIST = 65536
MAX_TEXT = 1 << 20

_KINDS = ("str", "int", "bool", "number", "b64", "list", "strlist", "object")


def wire(kind: str, required: bool = False, size: Optional[int] = None, doc: str = "") -> Any:
    """A record field: its kind on the wire, whether it is required, the size of a base64 value."""
    if kind not in _KINDS:
        raise ValueError("unknown field kind %r" % kind)
    metadata = {"kind": kind, "required": required, "size": size, "doc": doc}
    if required:
        return dataclasses.field(metadata=metadata)  # pylint: disable=invalid-field-call
    return dataclasses.field(default=None, metadata=metadata)  # pylint: disable=invalid-field-call


def _decode_value(kind: str, value: Any, name: str, size: Optional[int]) -> Any:
    if kind == "b64":
        return b64decode(value, name, size)
    checks = {
        "str": lambda v: isinstance(v, str) and len(v) <= MAX_TEXT,
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "bool": lambda v: isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "list": lambda v: isinstance(v, list) and len(v) <= MAX_LIST,
        "strlist": lambda v: isinstance(v, list) and len(v) <= MAX_LIST and all(isinstance(i, str) for i in v),
        "object": lambda v: isinstance(v, dict),
    }
    if not checks[kind](value):
        expected = {"str": "a string", "int": "an integer", "bool": "true or false", "number": "a number",
                    "list": "a list", "strlist": "a list of strings", "object": "a JSON object"}[kind]
        raise InputError(name, expected, type(value).__name__)
    return value


class Record:
    """Base of every request and answer: ``decode(params)`` checks and converts the wire form,
    ``encode()`` makes it (base64 for bytes; absent optional fields are left out)."""

    @classmethod
    def decode(cls, params: Any) -> "Record":
        if params is None:
            params = {}
        if not isinstance(params, Mapping):
            raise InputError("params", "a JSON object", type(params).__name__)
        values = {}
        for item in dataclasses.fields(cls):
            meta = item.metadata
            value = params.get(item.name)
            if value is None:
                if meta.get("required"):
                    raise InputError(item.name, "a value (required)")
                values[item.name] = None
                continue
            values[item.name] = _decode_value(meta["kind"], value, item.name, meta.get("size"))
        return cls(**values)

    def encode(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if value is None:
                continue
            out[item.name] = b64encode(value) if item.metadata["kind"] == "b64" else value
        return out

    @classmethod
    def describe(cls) -> str:
        """``name: kind`` for the docs (``?`` marks an optional field)."""
        parts = []
        for item in dataclasses.fields(cls):
            meta = item.metadata
            kind = "b64(%d)" % meta["size"] if meta["kind"] == "b64" and meta.get("size") else meta["kind"]
            parts.append("`%s%s` %s" % (item.name, "" if meta["required"] else "?", kind))
        return ", ".join(parts) or "—"


@dataclass(frozen=True)
class Empty(Record):
    """No fields."""


# ------------------------------------------------------------------ pubapi


@dataclass(frozen=True)
class StateAnswer(Record):
    state: str = wire("str", True)
    state_code: int = wire("int", True)
    role: str = wire("str", True)
    vpn_ip: Optional[str] = wire("str")
    vpn_pub_key: Optional[str] = wire("str")
    state_disk_uuid: Optional[str] = wire("str")
    evicted: Optional[list] = wire("list", doc="the Coordinator's evicted peers")
    removed: Optional[list] = wire("list", doc="the Nodes the admin removed (RemovePeer; a Coordinator's details)")
    join_admission: Optional[str] = wire("str", doc="how joins are consented to (AdmitNodes; a Coordinator's details)")
    etcd_member: Optional[str] = wire("str", doc="running or stopped: a Coordinator's etcd member (several Coordinators)")
    state_disk: Optional[dict] = wire("object", doc="whether the state is on the encrypted state disk: {encrypted, device, "
                                      "luks_uuid, open, message} (details only)")
    agent_measurement: Optional[dict] = wire("object", doc="PCR 13: {pcr, value, events: [{event, digest}]}, the "
                                             "agent's code and trust configuration (details only)")
    secrets_at_rest: Optional[dict] = wire("object", doc="{sealed, pcrs}: the secrets at rest are encrypted with a "
                                           "key sealed to these PCRs of the TPM (details only)")
    peer_resource_version: Optional[int] = wire("int", doc="the peer set's version a Node applied (it refuses an older "
                                                "one) or a Coordinator holds (details only)")
    deployment_mode: Optional[str] = wire("str", doc="host: the agent runs on an ordinary host (details only)")
    host_root_trusted: Optional[bool] = wire("bool", doc="true: the host's root can replay what the agent measures and "
                                             "read this peer's secrets in a genuine boot (details only)")


@dataclass(frozen=True)
class ActivateAsCoordinatorRequest(Record):
    kms_uri: str = wire("str", True, doc="secret")
    measurement_salt: bytes = wire("b64", True, 32)
    admin_pub_key: str = wire("str", True)
    storage_uri: Optional[str] = wire("str", doc="secret")
    cluster_config: Optional[dict] = wire("object")
    init_secret: Optional[bytes] = wire("b64", False, 32, doc="secret")
    restore_state: Optional[dict] = wire("object", doc="secret: a Coordinator's ExportState answer; the fresh peer "
                                         "resumes it (restore.yml) instead of starting a cluster")
    peer_resource_version_floor: Optional[int] = wire("int", doc="with restore_state: the highest peer set version "
                                                      "the Nodes applied; the restored set continues above it")


@dataclass(frozen=True)
class ActivateAsCoordinatorAnswer(Record):
    cluster_id: bytes = wire("b64", True, 32)
    coordinator_vpn_ip: str = wire("str", True)
    coordinator_vpn_pub_key: str = wire("str", True)
    state: str = wire("str", True)


@dataclass(frozen=True)
class ActivateAsNodeRequest(Record):
    """Types only: the Core checks the state first (a second activation is a StateError whatever
    it sends), then that every field is there (core/records.py NodeActivationRequest)."""

    node_vpn_ip: Optional[str] = wire("str")
    peers: Optional[list] = wire("list")
    cluster_id: Optional[bytes] = wire("b64", False, 32)
    measurement_salt: Optional[bytes] = wire("b64", False, 32)
    admin_pub_key: Optional[str] = wire("str")
    coordinator_vpn_ip: Optional[str] = wire("str")
    init_proof: Optional[bytes] = wire("b64", False, 32, doc="secret")
    coordinator_pub_key: Optional[str] = wire("str", doc="the Coordinators' Ed25519 signing key, pinned by the node")


@dataclass(frozen=True)
class ActivateAsNodeAnswer(Record):
    state: str = wire("str", True)
    node_vpn_ip: Optional[str] = wire("str")


@dataclass(frozen=True)
class ActivateAdditionalNodesRequest(Record):
    node_public_endpoints: List[str] = wire("strlist", True)
    coordinator_public_endpoints: Optional[List[str]] = wire("strlist", doc="further Coordinators, activated first")
    control_plane_endpoints: Optional[List[str]] = wire(
        "strlist", doc="those of node_public_endpoints the admin designates control planes")
    node_names: Optional[dict] = wire("object", doc="endpoint -> the node's name (its inventory name): its only "
                                      "kubelet node name")


@dataclass(frozen=True)
class ActivateAsAdditionalCoordinatorAnswer(Record):
    state: str = wire("str", True)
    coordinator_vpn_ip: Optional[str] = wire("str")
    state_disk_uuid: Optional[str] = wire("str")


@dataclass(frozen=True)
class ActivateAdditionalNodesAnswer(Record):
    nodes: list = wire("list", True)
    resource_version: Optional[int] = wire("int")


@dataclass(frozen=True)
class IssueJoinTicketRequest(Record):
    disk_uuid: str = wire("str", True)
    node_vpn_pub_key: bytes = wire("b64", True, 32)
    is_control_plane: Optional[bool] = wire("bool")
    certificate_request: Optional[bytes] = wire("b64", doc="the kubelet's PKCS#10 CSR (DER or PEM)")


@dataclass(frozen=True)
class IssueJoinTicketAnswer(Record):
    resource_version: int = wire("int", True)
    node_vpn_ip: Optional[str] = wire("str")


@dataclass(frozen=True)
class RecoverRequest(Record):
    kms_uri: str = wire("str", True, doc="secret")


@dataclass(frozen=True)
class IssueRejoinTicketRequest(Record):
    vpn_ip: str = wire("str", True)
    node_vpn_pub_key: bytes = wire("b64", True, 32)
    disk_uuid: str = wire("str", True)


@dataclass(frozen=True)
class IssueRejoinTicketAnswer(Record):
    resource_version: int = wire("int", True)


@dataclass(frozen=True)
class EnrollAKAnswer(Record):
    secret: bytes = wire("b64", True, 32)


# ------------------------------------------------------------------ admin channel


@dataclass(frozen=True)
class AdminAuthRequest(Record):
    role: Optional[str] = wire("str", doc="admin (default) or coordinator: GetState's details only")


@dataclass(frozen=True)
class AdminAuthAnswer(Record):
    authenticated: bool = wire("bool", True)


@dataclass(frozen=True)
class AttestRequest(Record):
    nonce: bytes = wire("b64", True, 32)


@dataclass(frozen=True)
class AttestAnswer(Record):
    attestation: bytes = wire("b64", True)
    variant_oid: str = wire("str", True)


@dataclass(frozen=True)
class ExecRequest(Record):
    cmd: Optional[str] = wire("str")
    argv: Optional[List[str]] = wire("strlist")
    cwd: Optional[str] = wire("str")
    env: Optional[dict] = wire("object")
    timeout: Optional[float] = wire("number")


@dataclass(frozen=True)
class ExecAnswer(Record):
    exit_code: int = wire("int", True)


@dataclass(frozen=True)
class ExecModuleRequest(ExecRequest):
    """Exec's fields plus the module's interpreter (the handler requires it: an absolute path)."""

    interpreter: Optional[str] = wire("str")


@dataclass(frozen=True)
class ExecModuleAnswer(ExecAnswer):
    warm: Optional[bool] = wire("bool")


@dataclass(frozen=True)
class PutFileRequest(Record):
    path: str = wire("str", True)
    mode: Optional[int] = wire("int")


@dataclass(frozen=True)
class PutFileAnswer(Record):
    path: str = wire("str", True)
    size: int = wire("int", True)
    sha256: str = wire("str", True)


@dataclass(frozen=True)
class FetchFileRequest(Record):
    path: str = wire("str", True)


@dataclass(frozen=True)
class FetchFileAnswer(Record):
    size: int = wire("int", True)
    sha256: str = wire("str", True)


@dataclass(frozen=True)
class ExportStateAnswer(Record):
    format: str = wire("str", True)
    cluster_id: bytes = wire("b64", True, 32)
    vpn_ip: str = wire("str", True)
    items: dict = wire("object", True, doc="secret: every key of the Coordinator's store, values in base64")
    cluster_items: Optional[dict] = wire("object", doc="secret: the keys its etcd members share (several Coordinators)")
    peer_resource_version: Optional[int] = wire("int", doc="the peer set's version: the backup's counter")


@dataclass(frozen=True)
class RemovePeerRequest(Record):
    node_public_ip: Optional[str] = wire("str", doc="the Node's public IP (or node_vpn_ip)")
    node_vpn_ip: Optional[str] = wire("str")
    check: Optional[bool] = wire("bool", doc="only report what would be removed")


@dataclass(frozen=True)
class RemovePeerAnswer(Record):
    changed: bool = wire("bool", True)
    msg: str = wire("str", True)
    peer: Optional[dict] = wire("object", doc="{vpn_ip, vpn_pub_key, public_ip, role} of the removed Node")
    kubernetes_node_names: Optional[List[str]] = wire("strlist")
    disk_uuid: Optional[str] = wire("str")
    control_plane: Optional[bool] = wire("bool")
    evicted: Optional[bool] = wire("bool")
    resource_version: Optional[int] = wire("int")


@dataclass(frozen=True)
class ResetAgentRequest(Record):
    confirm: str = wire("str", True, doc="this peer's public IP (a reset sent to the wrong host is refused)")
    force: Optional[bool] = wire("bool", doc="reset a Coordinator too")


@dataclass(frozen=True)
class ResetAgentAnswer(Record):
    state: str = wire("str", True)
    wiped: List[str] = wire("strlist", True)


# ------------------------------------------------------------------ vpnapi


@dataclass(frozen=True)
class PeerAuthAnswer(Record):
    authenticated: bool = wire("bool", True)


@dataclass(frozen=True)
class GetUpdateRequest(Record):
    resource_version: int = wire("int", True)
    wait: Optional[float] = wire("number", doc="a long poll: seconds (up to 60) the Coordinator may hold the request "
                                 "until the peers or the measurements version change")


@dataclass(frozen=True)
class GetUpdateAnswer(Record):
    resource_version: int = wire("int", True)
    full: Optional[bool] = wire("bool")
    added: Optional[list] = wire("list")
    removed: Optional[List[str]] = wire("strlist")
    changed: Optional[list] = wire("list")
    signature: Optional[str] = wire("str", doc="the Coordinators' signature of the peer set at this version")
    long_poll: Optional[bool] = wire("bool", doc="true: the Coordinator held the request (``wait``) until a change or "
                                     "the wait passed")
    measurements_version: Optional[int] = wire("int", doc="the version of the accepted measurement sets "
                                               "(GetMeasurements when above the node's)")


@dataclass(frozen=True)
class GetJoinArgsRequest(Record):
    certificate_request: Optional[bytes] = wire("b64", doc="the kubelet's PKCS#10 CSR (DER or PEM)")
    is_control_plane: Optional[bool] = wire("bool")


@dataclass(frozen=True)
class GetJoinArgsAnswer(Record):
    api_server_endpoint: str = wire("str", True)
    token: str = wire("str", True, doc="secret")
    discovery_token_ca_cert_hash: str = wire("str", True)
    kubelet_cert: Optional[str] = wire("str", doc="PEM, signed by the cluster CA")
    node_name: Optional[str] = wire("str")
    control_plane_files: Optional[list] = wire("list", doc="secret")


@dataclass(frozen=True)
class GetCertificateKeyAnswer(Record):
    certificate_key: str = wire("str", True, doc="secret")


@dataclass(frozen=True)
class GetDataKeyRequest(Record):
    data_key_id: str = wire("str", True)
    length: Optional[int] = wire("int")


@dataclass(frozen=True)
class GetDataKeyAnswer(Record):
    data_key: bytes = wire("b64", True, doc="secret")


@dataclass(frozen=True)
class AdmitNodesRequest(Record):
    nodes: list = wire("list", True, doc="[{ek_pub_sha256 (hex SHA-256 of the EK's SubjectPublicKeyInfo DER), name, "
                       "state (present, absent)}]")
    check: Optional[bool] = wire("bool", doc="predict only (check mode)")


@dataclass(frozen=True)
class AdmitNodesAnswer(Record):
    changed: bool = wire("bool", True)
    added: List[str] = wire("strlist", True)
    removed: List[str] = wire("strlist", True)
    renamed: List[str] = wire("strlist", True)
    admissions: list = wire("list", True, doc="[{ek_pub_sha256, name, joined}], after the change")


@dataclass(frozen=True)
class GetStateDiskKeyAnswer(Record):
    state_disk_key: bytes = wire("b64", True, 32, doc="secret")


# ------------------------------------------------------------------ accepted measurement sets (image upgrades)


@dataclass(frozen=True)
class SetMeasurementsRequest(Record):
    document: Optional[bytes] = wire("b64", doc="the policy file's exact bytes (at most 1 MiB); none: only report")
    signature: Optional[str] = wire("str", doc="its detached signature (cosign sign-blob); required where a "
                                    "measurements key is pinned")
    check: Optional[bool] = wire("bool", doc="predict only (check mode)")


@dataclass(frozen=True)
class SetMeasurementsAnswer(Record):
    changed: bool = wire("bool", True)
    version: int = wire("int", True)
    sets: List[str] = wire("strlist", True)
    added: Optional[List[str]] = wire("strlist")
    removed: Optional[List[str]] = wire("strlist")
    peers: Optional[dict] = wire("object", doc="{vpn_ip: the set it matched at its last re-attestation}")


@dataclass(frozen=True)
class GetMeasurementsAnswer(Record):
    version: int = wire("int", True)
    document: bytes = wire("b64", True)
    signature: Optional[str] = wire("str")


# ------------------------------------------------------------------ the table


@dataclass(frozen=True)
class Method:
    """One RPC method: its name, API, request and answer records, what it streams, what it does, and who may call
    it in which states (``access``, rpc/access.py: the server enforces it before the handler runs)."""

    name: str
    api: str
    request: Type[Record]
    answer: Type[Record]
    streams: str
    summary: str
    access: Optional[Access] = None

    @property
    def stdin(self) -> bool:
        """The client sends DATA on channel 0 and an EOF after the request."""
        return self.streams in (STREAMS_STDIN, STREAMS_PROCESS)


METHODS: Dict[str, Method] = {}


def register(method: Method) -> Method:
    if method.api not in APIS:
        raise ValueError("API %r is not one of %s" % (method.api, ", ".join(APIS)))
    if not isinstance(method.access, Access):
        raise ValueError("RPC method %s declares no access: who may call it and in which states (access=Access(CALLER_*, "
                         "SERVED_*), rpc/access.py)" % method.name)
    if method.name in METHODS and METHODS[method.name] != method:
        raise ValueError("RPC method %s is already registered" % method.name)
    METHODS[method.name] = method
    return method


def unregister(name: str) -> None:
    """Removes a method (tests)."""
    METHODS.pop(name, None)


for _method in (
        Method("GetState", PUBAPI, Empty, StateAnswer, STREAMS_NONE,
               "the peer's state and role; after AdminAuth also its VPN IP and key, disk UUID, whether its state is on "
               "an encrypted disk (and a Coordinator's evicted peers); any state",
               access=Access(CALLER_ANYONE, SERVED_ALWAYS, "the details: admin or Coordinators")),
        Method("ActivateAsCoordinator", PUBAPI, ActivateAsCoordinatorRequest, ActivateAsCoordinatorAnswer, STREAMS_LOG,
               "the admin makes this peer the Coordinator (node lock, KMS, WireGuard); AcceptingInit only",
               access=Access(CALLER_INIT_SECRET, SERVED_ACCEPTING_INIT, "init_secret; checked by the Core before the node lock")),
        Method("ActivateAsNode", PUBAPI, ActivateAsNodeRequest, ActivateAsNodeAnswer, STREAMS_EXCHANGE,
               "the Coordinator makes this peer a Node: it answers its disk UUID and VPN key, gets its disk key",
               access=Access(CALLER_INIT_SECRET, SERVED_ACCEPTING_INIT, "init_proof; checked by the Core before the node lock")),
        Method("ActivateAsAdditionalCoordinator", PUBAPI, ActivateAsNodeRequest, ActivateAsAdditionalCoordinatorAnswer,
               STREAMS_EXCHANGE, "a Coordinator makes this peer a further Coordinator: disk UUID and VPN key out, the "
               "KMS URI and etcd cluster in, its etcd member joins (docs/store.md)",
               access=Access(CALLER_INIT_SECRET, SERVED_ACCEPTING_INIT, "init_proof; checked by the Core before the node lock")),
        Method("ActivateAdditionalNodes", PUBAPI, ActivateAdditionalNodesRequest, ActivateAdditionalNodesAnswer,
               STREAMS_LOG, "the admin (authenticated) asks the Coordinator to attest and activate these nodes "
               "(and further Coordinators)",
               access=Access(CALLER_ADMIN, SERVED_COORDINATOR)),
        Method("IssueJoinTicket", PUBAPI, IssueJoinTicketRequest, IssueJoinTicketAnswer, STREAMS_EXCHANGE,
               "a fresh node attests itself in-band (and enrolls its AK for qemu-vtpm-ek) and takes a join ticket "
               "(with its kubelet certificate and the Kubernetes join arguments)",
               access=Access(CALLER_ANYONE, SERVED_COORDINATOR, "attested in-band: the Core checks the quote")),
        Method("Recover", PUBAPI, RecoverRequest, StateAnswer, STREAMS_NONE,
               "the rebooted Coordinator (PCR 15 reset, state stored) gets the KMS URI back; Nodes rejoin instead",
               access=Access(CALLER_ANYONE, SERVED_ACCEPTING_INIT, "the KMS URI: the Core checks it derives the cluster ID")),
        Method("IssueRejoinTicket", PUBAPI, IssueRejoinTicketRequest, IssueRejoinTicketAnswer, STREAMS_EXCHANGE,
               "a rebooted Node attests itself in-band and takes its disk key, the measurement secret and its peers",
               access=Access(CALLER_ANYONE, SERVED_COORDINATOR, "attested in-band: the Core checks the quote and the peer")),
        Method("EnrollAK", PUBAPI, Empty, EnrollAKAnswer, STREAMS_EXCHANGE,
               "qemu-vtpm-ek: EK certificate and AK out, credential challenge in, recovered secret out",
               access=Access(CALLER_ANYONE, SERVED_ALWAYS, "rate limited per source")),
        Method("AdminAuth", ADMIN, AdminAuthRequest, AdminAuthAnswer, STREAMS_EXCHANGE,
               "proves the admin key pinned at activation, bound to this TLS connection (role coordinator: the "
               "Coordinators' key, for GetState's details only)",
               access=Access(CALLER_ANYONE, SERVED_ALWAYS, "the proof itself: role admin once the admin key is pinned, "
                             "role coordinator once the Coordinators' key is")),
        Method("Attest", ADMIN, AttestRequest, AttestAnswer, STREAMS_NONE,
               "a fresh quote over the caller's nonce, bound to this connection's certificate key (a proof per task)",
               access=Access(CALLER_ADMIN, SERVED_ACTIVATED)),
        Method("Exec", ADMIN, ExecRequest, ExecAnswer, STREAMS_PROCESS, "runs a command (argv or /bin/sh -c cmd)",
               access=Access(CALLER_ADMIN, SERVED_ACTIVATED)),
        Method("ExecModule", ADMIN, ExecModuleRequest, ExecModuleAnswer, STREAMS_PROCESS,
               "runs a pipelined Ansible module, in a pre-warmed interpreter where possible",
               access=Access(CALLER_ADMIN, SERVED_ACTIVATED)),
        Method("PutFile", ADMIN, PutFileRequest, PutFileAnswer, STREAMS_STDIN, "writes a file atomically",
               access=Access(CALLER_ADMIN, SERVED_ACTIVATED)),
        Method("FetchFile", ADMIN, FetchFileRequest, FetchFileAnswer, STREAMS_STDOUT, "reads a file",
               access=Access(CALLER_ADMIN, SERVED_ACTIVATED)),
        Method("ExportState", ADMIN, Empty, ExportStateAnswer, STREAMS_NONE,
               "an activated Coordinator's whole store, for backup.yml (the controller encrypts it); admin only",
               access=Access(CALLER_ADMIN, SERVED_COORDINATOR)),
        Method("RemovePeer", ADMIN, RemovePeerRequest, RemovePeerAnswer, STREAMS_NONE,
               "the admin removes a Node from the Coordinator's cluster: its registry entry and VPN IP, its Kubernetes "
               "Node, what it held (kubelet names, control-plane designation, disk UUID); check: only reports",
               access=Access(CALLER_ADMIN, SERVED_COORDINATOR)),
        Method("AdmitNodes", ADMIN, AdmitNodesRequest, AdmitNodesAnswer, STREAMS_NONE,
               "the admin (authenticated) admits nodes to join on an activated Coordinator: the SHA-256 of each TPM's "
               "EK public key -> the node's name (its kubelet node name); state absent removes; check: only predicts",
               access=Access(CALLER_ADMIN, SERVED_COORDINATOR)),
        Method("ResetAgent", ADMIN, ResetAgentRequest, ResetAgentAnswer, STREAMS_NONE,
               "the admin resets this agent: it answers, stops, wipes its state (store, sealed key, disk UUID), takes "
               "its WireGuard interface down and starts fresh (AcceptingInit; PCR 15 only after a reboot)",
               access=Access(CALLER_ADMIN, SERVED_ADMIN_KEY_PINNED)),
        Method("PeerAuth", VPNAPI, Empty, PeerAuthAnswer, STREAMS_EXCHANGE,
               "proves the caller's WireGuard private key (the one recorded for its VPN IP) for this connection: "
               "a MAC over a fresh challenge; every other vpnapi method requires it",
               access=Access(CALLER_VPN_PEER, SERVED_COORDINATOR, "the proof itself")),
        Method("GetUpdate", VPNAPI, GetUpdateRequest, GetUpdateAnswer, STREAMS_NONE,
               "the peer changes since a version (only the version when nothing changed); with `wait`, a long poll: "
               "held until the peers or the measurements version change, or `wait` seconds passed",
               access=Access(CALLER_PEER, SERVED_COORDINATOR)),
        Method("GetJoinArgs", VPNAPI, GetJoinArgsRequest, GetJoinArgsAnswer, STREAMS_NONE,
               "kubeadm join arguments (API server endpoint, a fresh token, pinned CA hash), the kubelet "
               "certificate for the caller's CSR, a control plane's PKI files",
               access=Access(CALLER_VERIFIED_PEER, SERVED_COORDINATOR, "control-plane files: a designated control plane")),
        Method("GetCertificateKey", VPNAPI, Empty, GetCertificateKeyAnswer, STREAMS_NONE,
               "a fresh kubeadm certificate key, the control-plane certificates uploaded under it",
               access=Access(CALLER_CONTROL_PLANE, SERVED_COORDINATOR)),
        Method("GetDataKey", VPNAPI, GetDataKeyRequest, GetDataKeyAnswer, STREAMS_NONE,
               "a data key derived by the Coordinator's KMS (never a disk key or a reserved ID)",
               access=Access(CALLER_VERIFIED_PEER, SERVED_COORDINATOR)),
        Method("GetStateDiskKey", VPNAPI, Empty, GetStateDiskKeyAnswer, STREAMS_NONE,
               "the caller's own state disk key, for a node whose activation was interrupted (docs/agent.md)",
               access=Access(CALLER_VERIFIED_PEER, SERVED_COORDINATOR, "its own key only")),
        Method("SetMeasurements", ADMIN, SetMeasurementsRequest, SetMeasurementsAnswer, STREAMS_NONE,
               "the admin (authenticated) sets the accepted measurement sets on a Coordinator: checked (signature, "
               "version), kept in its store, applied; retiring a set a peer still runs is refused, naming the peers",
               access=Access(CALLER_ADMIN, SERVED_COORDINATOR)),
        Method("GetMeasurements", VPNAPI, Empty, GetMeasurementsAnswer, STREAMS_NONE,
               "the accepted measurement sets the Coordinators hold (the document and its signature; each node "
               "checks them with its own pinned key)",
               access=Access(CALLER_PEER, SERVED_COORDINATOR)),
):
    register(_method)


def method(name: Any, apis: Tuple[str, ...] = APIS) -> Method:
    """The method called ``name`` among ``apis``; InputError listing those APIs' methods otherwise."""
    found = METHODS.get(name) if isinstance(name, str) else None
    if found is None or found.api not in apis:
        raise InputError("method", "one of %s" % ", ".join(sorted(m.name for m in METHODS.values() if m.api in apis)),
                         name if isinstance(name, str) and len(name) <= 64 else None)
    return found


def methods_of(*apis: str) -> List[Method]:
    return [m for m in METHODS.values() if m.api in apis]


# The agent's listeners (docs/protocol.md's opening table): where, over what, and which APIs.
LISTENERS = (
    ("public endpoint, port 9000", "aTLS (server attested; client not verified by TLS)", (PUBAPI, ADMIN)),
    ("Coordinator VPN IP, port 9027", "plain TCP inside the WireGuard VPN; callers must be known peers (source IP = "
     "a peer's /32) and prove that peer's WireGuard private key (`PeerAuth`)", (VPNAPI,)),
)
API_TITLES = {PUBAPI: "the pubapi", ADMIN: "the admin channel", VPNAPI: "the vpnapi"}


def markdown_listeners() -> str:
    """The opening table of docs/protocol.md (the listeners and every method each serves), made from METHODS."""
    lines = ["| listener | transport | methods |", "|---|---|---|"]
    for listener, transport, apis in LISTENERS:
        served = "; ".join("%s: %s" % (API_TITLES[api], ", ".join("`%s`" % m.name for m in methods_of(api)))
                           for api in apis)
        lines.append("| %s | %s | %s |" % (listener, transport, served))
    return "\n".join(lines) + "\n"


def markdown_table() -> str:
    """The method table of docs/protocol.md, made from METHODS."""
    lines = ["| method | API | who may call | served in | request | answer (END result) | streams | what it does |",
             "|---|---|---|---|---|---|---|---|"]
    for item in METHODS.values():
        cells = (item.name, item.api, item.access.who(), item.access.served, item.request.describe(),
                 item.answer.describe(), item.streams, item.summary)
        lines.append("| `%s` | %s | %s | %s | %s | %s | %s | %s |" % cells)
    return "\n".join(lines) + "\n"


# docs/protocol.md's generated blocks: ``<!-- NAME:begin -->`` ... ``<!-- NAME:end -->``, by NAME.
MARKDOWN_BLOCKS = {"listeners": markdown_listeners, "methods": markdown_table}


def render_markdown(text: str) -> str:
    """``text`` (docs/protocol.md) with every generated block made again from METHODS; ValueError if a block's
    markers are missing."""
    for name, make in MARKDOWN_BLOCKS.items():
        begin, end = "<!-- %s:begin -->\n" % name, "<!-- %s:end -->" % name
        if begin not in text or end not in text:
            raise ValueError("the document has no generated block %s (%s ... %s)" % (name, begin.strip(), end))
        head, rest = text.split(begin, 1)
        text = head + begin + make() + end + rest.split(end, 1)[1]
    return text
