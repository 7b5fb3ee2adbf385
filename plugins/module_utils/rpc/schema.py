# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The RPC schema: ONE table of methods, each one declaration (``declare``) with its request and answer records.

From the table (``METHODS``) come the server's dispatch (``server.FrameServer`` refuses a method
its API does not have and decodes every request before the handler sees it), the clients
(``client.PubAPIClient``, ``AdminClient``, ``VPNAPIClient``: ``invoke(name, **fields)``), the relay
of the atls connection plugin (which methods it passes on, which carry stdin) and the tables of
docs/protocol.md that list methods (``render_markdown``, checked by a test). A new method is one
``declare(...)`` here (its records' fields as ``spec(...)``, or records it shares), plus its handler.

Decoding is strict on types (base64 through ``encoding.b64decode`` with the size, integers are
not booleans) and never echoes a value: a wrong field is named with its expected kind and the
type found. Unknown fields are ignored (an older agent accepts a newer client's extras).
"""

from __future__ import annotations

import dataclasses
import re
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


# ------------------------------------------------------------------ one declaration per method

# A field of a spec: ``name kind``, ``(size)`` for base64 of a fixed size, ``!`` if required, ``: what it is``.
_FIELD = re.compile(r"^([a-z_][a-z0-9_]*) ([a-z0-9]+)(?:\((\d+)\))?(!?)(?:: (.+))?$", re.S)


@dataclass(frozen=True)
class Spec:
    """A record's fields as ``declare`` takes them (``spec(...)``); ``name`` where it is not the method's name plus
    Request or Answer, ``base`` a record whose fields come first."""

    fields: Tuple[str, ...]
    name: str = ""
    base: Type[Record] = Record
    doc: str = ""


def spec(*fields: str, name: str = "", base: Type[Record] = Record, doc: str = "") -> Spec:
    return Spec(fields, name, base, doc)


def record(name: str, declared: Spec) -> Type[Record]:
    """The record class ``name`` (a frozen dataclass of ``wire`` fields) that ``declared`` describes."""
    items = []
    for text in declared.fields:
        match = _FIELD.match(text)
        if match is None:
            raise ValueError("record %s: field %r is not 'name kind[(size)][!][: what it is]'" % (name, text))
        field_name, kind, size, required, doc = match.groups()
        items.append((field_name, Any, wire(kind, bool(required), int(size) if size else None, doc or "")))
    return dataclasses.make_dataclass(name, items, bases=(declared.base,), frozen=True,
                                      namespace={"__module__": __name__, "__doc__": declared.doc or None})


def declare(name: str, api: str, streams: str, access: Access, summary: str, request: Any,
            answer: Any) -> Tuple[Type[Record], Type[Record]]:
    """Registers the method ``name`` (see ``Method``); ``request`` and ``answer`` are records, or a ``spec`` of a new
    one (named ``<name>Request``, ``<name>Answer``). Returns the two records."""
    records = tuple(record(part.name or name + suffix, part) if isinstance(part, Spec) else part
                    for part, suffix in ((request, "Request"), (answer, "Answer")))
    register(Method(name, api, records[0], records[1], streams, summary, access=access))
    return records[0], records[1]


Empty, StateAnswer = declare(
    "GetState", PUBAPI, STREAMS_NONE,
    Access(CALLER_ANYONE, SERVED_ALWAYS, "the details: admin or Coordinators"),
    "the peer's state and role; after AdminAuth also its VPN IP and key, disk UUID, whether its state is on an "
    "encrypted disk (and a Coordinator's evicted peers); any state",
    request=Empty,
    answer=spec("state str!", "state_code int!", "role str!", "vpn_ip str", "vpn_pub_key str", "state_disk_uuid str",
                "evicted list: the Coordinator's evicted peers",
                "removed list: the Nodes the admin removed (RemovePeer; a Coordinator's details)",
                "join_admission str: how joins are consented to (AdmitNodes; a Coordinator's details)",
                "etcd_member str: running or stopped: a Coordinator's etcd member (several Coordinators)",
                "state_disk object: whether the state is on the encrypted state disk: {encrypted, device, "
                "luks_uuid, open, message} (details only)",
                "agent_measurement object: PCR 13: {pcr, value, events: [{event, digest}]}, the agent's code and "
                "trust configuration (details only; absent in image mode, where the agent extends nothing)",
                "secrets_at_rest object: {sealed, pcrs}: the secrets at rest are encrypted with a key sealed to "
                "these PCRs of the TPM (details only)",
                "peer_resource_version int: the peer set's version a Node applied (it refuses an older one) or a "
                "Coordinator holds (details only)",
                "deployment_mode str: host: the agent runs on an ordinary host; image: inside the measured node "
                "image, whose boot chain measures it (details only)",
                "host_root_trusted bool: true: the host's root can replay what the agent measures and read this "
                "peer's secrets in a genuine boot (host); false in the image (details only)",
                "node_pod_cidr str: this peer's own pod CIDR (the pod network; details only)",
                "cluster_pod_cidr str: the cluster's pod range, routed into wg0 (the pod network; details only)",
                name="StateAnswer"))

ActivateAsCoordinatorRequest, ActivateAsCoordinatorAnswer = declare(
    "ActivateAsCoordinator", PUBAPI, STREAMS_LOG,
    Access(CALLER_INIT_SECRET, SERVED_ACCEPTING_INIT, "init_secret; checked by the Core before the node lock"),
    "the admin makes this peer the Coordinator (node lock, KMS, WireGuard); AcceptingInit only",
    request=spec("kms_uri str!: secret",
                 "measurement_salt b64(32)!", "admin_pub_key str!",
                 "storage_uri str: secret",
                 "cluster_config object",
                 "init_secret b64(32): secret",
                 "restore_state object: secret: a Coordinator's ExportState answer; the fresh peer resumes it "
                 "(restore.yml) instead of starting a cluster",
                 "peer_resource_version_floor int: with restore_state: the highest peer set version the Nodes "
                 "applied; the restored set continues above it"),
    answer=spec("cluster_id b64(32)!", "coordinator_vpn_ip str!", "coordinator_vpn_pub_key str!", "state str!",
                "cluster_pod_cidr str: the cluster's pod range (cluster_config cluster_pod_cidr; the pod network)",
                "coordinator_pod_cidr str: the Coordinator's own pod CIDR"))

ActivateAsNodeRequest, ActivateAsNodeAnswer = declare(
    "ActivateAsNode", PUBAPI, STREAMS_EXCHANGE,
    Access(CALLER_INIT_SECRET, SERVED_ACCEPTING_INIT, "init_proof; checked by the Core before the node lock"),
    "the Coordinator makes this peer a Node: it answers its disk UUID and VPN key, gets its disk key",
    request=spec("node_vpn_ip str", "peers list", "cluster_id b64(32)", "measurement_salt b64(32)",
                 "admin_pub_key str", "coordinator_vpn_ip str",
                 "init_proof b64(32): secret",
                 "coordinator_pub_key str: the Coordinators' Ed25519 signing key, pinned by the node",
                 "node_pod_cidr str: the node's own pod CIDR (the pod network)",
                 "cluster_pod_cidr str: the cluster's pod range, which the node routes into wg0",
                 doc="Types only: the Core checks the state first (a second activation is a StateError whatever it "
                 "sends), then that every field is there (core/records/tickets.py NodeActivationRequest)."),
    answer=spec("state str!", "node_vpn_ip str"))

ActivateAsNodeRequest, ActivateAsAdditionalCoordinatorAnswer = declare(
    "ActivateAsAdditionalCoordinator", PUBAPI, STREAMS_EXCHANGE,
    Access(CALLER_INIT_SECRET, SERVED_ACCEPTING_INIT, "init_proof; checked by the Core before the node lock"),
    "a Coordinator makes this peer a further Coordinator: disk UUID and VPN key out, the KMS URI and etcd cluster "
    "in, its etcd member joins (docs/store.md)",
    request=ActivateAsNodeRequest,
    answer=spec("state str!", "coordinator_vpn_ip str", "state_disk_uuid str"))

ActivateAdditionalNodesRequest, ActivateAdditionalNodesAnswer = declare(
    "ActivateAdditionalNodes", PUBAPI, STREAMS_LOG,
    Access(CALLER_ADMIN, SERVED_COORDINATOR),
    "the admin (authenticated) asks the Coordinator to attest and activate these nodes (and further Coordinators)",
    request=spec("node_public_endpoints strlist!",
                 "coordinator_public_endpoints strlist: further Coordinators, activated first",
                 "control_plane_endpoints strlist: those of node_public_endpoints the admin designates control "
                 "planes",
                 "node_names object: endpoint -> the node's name (its inventory name): its only kubelet node name"),
    answer=spec("nodes list!", "resource_version int"))

IssueJoinTicketRequest, IssueJoinTicketAnswer = declare(
    "IssueJoinTicket", PUBAPI, STREAMS_EXCHANGE,
    Access(CALLER_ANYONE, SERVED_COORDINATOR, "attested in-band: the Core checks the quote"),
    "a fresh node attests itself in-band (and enrolls its AK for qemu-vtpm-ek) and takes a join ticket (with its "
    "kubelet certificate and the Kubernetes join arguments)",
    request=spec("disk_uuid str!", "node_vpn_pub_key b64(32)!", "is_control_plane bool",
                 "certificate_request b64: the kubelet's PKCS#10 CSR (DER or PEM)"),
    answer=spec("resource_version int!", "node_vpn_ip str"))

RecoverRequest, StateAnswer = declare(
    "Recover", PUBAPI, STREAMS_NONE,
    Access(CALLER_ANYONE, SERVED_ACCEPTING_INIT, "the KMS URI: the Core checks it derives the cluster ID"),
    "the rebooted Coordinator (PCR 15 reset, state stored) gets the KMS URI back; Nodes rejoin instead",
    request=spec("kms_uri str!: secret"),
    answer=StateAnswer)

IssueRejoinTicketRequest, IssueRejoinTicketAnswer = declare(
    "IssueRejoinTicket", PUBAPI, STREAMS_EXCHANGE,
    Access(CALLER_ANYONE, SERVED_COORDINATOR, "attested in-band: the Core checks the quote and the peer"),
    "a rebooted Node attests itself in-band and takes its disk key, the measurement secret and its peers",
    request=spec("vpn_ip str!", "node_vpn_pub_key b64(32)!", "disk_uuid str!"),
    answer=spec("resource_version int!"))

Empty, EnrollAKAnswer = declare(
    "EnrollAK", PUBAPI, STREAMS_EXCHANGE,
    Access(CALLER_ANYONE, SERVED_ALWAYS, "rate limited per source"),
    "qemu-vtpm-ek: EK certificate and AK out, credential challenge in, recovered secret out",
    request=Empty,
    answer=spec("secret b64(32)!"))

AdminAuthRequest, AdminAuthAnswer = declare(
    "AdminAuth", ADMIN, STREAMS_EXCHANGE,
    Access(CALLER_ANYONE, SERVED_ALWAYS, "the proof itself: role admin once the admin key is pinned, role "
                                         "coordinator once the Coordinators' key is"),
    "proves the admin key pinned at activation, bound to this TLS connection (role coordinator: the Coordinators' "
    "key, for GetState's details only)",
    request=spec("role str: admin (default) or coordinator: GetState's details only"),
    answer=spec("authenticated bool!"))

AttestRequest, AttestAnswer = declare(
    "Attest", ADMIN, STREAMS_NONE,
    Access(CALLER_ADMIN, SERVED_ACTIVATED),
    "a fresh quote over the caller's nonce, bound to this connection's certificate key (a proof per task)",
    request=spec("nonce b64(32)!"),
    answer=spec("attestation b64!", "variant_oid str!"))

ExecRequest, ExecAnswer = declare(
    "Exec", ADMIN, STREAMS_PROCESS,
    Access(CALLER_ADMIN, SERVED_ACTIVATED),
    "runs a command (argv or /bin/sh -c cmd)",
    request=spec("cmd str", "argv strlist", "cwd str", "env object", "timeout number"),
    answer=spec("exit_code int!"))

ExecModuleRequest, ExecModuleAnswer = declare(
    "ExecModule", ADMIN, STREAMS_PROCESS,
    Access(CALLER_ADMIN, SERVED_ACTIVATED),
    "runs a pipelined Ansible module, in a pre-warmed interpreter where possible",
    request=spec("interpreter str", base=ExecRequest,
                 doc="Exec's fields plus the module's interpreter (the handler requires it: an absolute path)."),
    answer=spec("warm bool", base=ExecAnswer))

PutFileRequest, PutFileAnswer = declare(
    "PutFile", ADMIN, STREAMS_STDIN,
    Access(CALLER_ADMIN, SERVED_ACTIVATED),
    "writes a file atomically",
    request=spec("path str!", "mode int"),
    answer=spec("path str!", "size int!", "sha256 str!"))

FetchFileRequest, FetchFileAnswer = declare(
    "FetchFile", ADMIN, STREAMS_STDOUT,
    Access(CALLER_ADMIN, SERVED_ACTIVATED),
    "reads a file",
    request=spec("path str!"),
    answer=spec("size int!", "sha256 str!"))

Empty, ExportStateAnswer = declare(
    "ExportState", ADMIN, STREAMS_NONE,
    Access(CALLER_ADMIN, SERVED_COORDINATOR),
    "an activated Coordinator's whole store, for backup.yml (the controller encrypts it); admin only",
    request=Empty,
    answer=spec("format str!", "cluster_id b64(32)!", "vpn_ip str!",
                "items object!: secret: every key of the Coordinator's store, values in base64",
                "cluster_items object: secret: the keys its etcd members share (several Coordinators)",
                "peer_resource_version int: the peer set's version: the backup's counter"))

RemovePeerRequest, RemovePeerAnswer = declare(
    "RemovePeer", ADMIN, STREAMS_NONE,
    Access(CALLER_ADMIN, SERVED_COORDINATOR),
    "the admin removes a Node from the Coordinator's cluster: its registry entry and VPN IP, its Kubernetes Node, "
    "what it held (kubelet names, control-plane designation, disk UUID); check: only reports",
    request=spec("node_public_ip str: the Node's public IP (or node_vpn_ip)",
                 "node_vpn_ip str",
                 "check bool: only report what would be removed"),
    answer=spec("changed bool!", "msg str!",
                "peer object: {vpn_ip, vpn_pub_key, public_ip, role} of the removed Node",
                "kubernetes_node_names strlist", "disk_uuid str", "control_plane bool", "evicted bool",
                "resource_version int"))

AdmitNodesRequest, AdmitNodesAnswer = declare(
    "AdmitNodes", ADMIN, STREAMS_NONE,
    Access(CALLER_ADMIN, SERVED_COORDINATOR),
    "the admin (authenticated) admits nodes to join on an activated Coordinator: the SHA-256 of each TPM's EK "
    "public key -> the node's name (its kubelet node name); state absent removes; check: only predicts",
    request=spec("nodes list!: [{ek_pub_sha256 (hex SHA-256 of the EK's SubjectPublicKeyInfo DER), name, state "
                 "(present, absent)}]",
                 "check bool: predict only (check mode)"),
    answer=spec("changed bool!", "added strlist!", "removed strlist!", "renamed strlist!",
                "admissions list!: [{ek_pub_sha256, name, joined}], after the change"))

UsePodCIDRsRequest, UsePodCIDRsAnswer = declare(
    "UsePodCIDRs", ADMIN, STREAMS_NONE,
    Access(CALLER_ADMIN, SERVED_COORDINATOR),
    "the admin turns the pod network on for a cluster activated without it: every Coordinator and Node gets a pod "
    "CIDR in one new peer set version (the same range again changes nothing); check: only predicts",
    request=spec("cluster_pod_cidr str!: the cluster's pod range", "node_pod_cidr_mask_size int: default 24",
                 "check bool: predict only (check mode)"),
    answer=spec("changed bool!", "cluster_pod_cidr str!", "coordinator_pod_cidr str",
                "allocated list: [{vpn_ip, pod_cidr}] of the peers that got one", "resource_version int"))

ResetAgentRequest, ResetAgentAnswer = declare(
    "ResetAgent", ADMIN, STREAMS_NONE,
    Access(CALLER_ADMIN, SERVED_ADMIN_KEY_PINNED),
    "the admin resets this agent: it answers, stops, wipes its state (store, sealed key, disk UUID), takes its "
    "WireGuard interface down and starts fresh (AcceptingInit; PCR 15 only after a reboot)",
    request=spec("confirm str!: this peer's public IP (a reset sent to the wrong host is refused)",
                 "force bool: reset a Coordinator too"),
    answer=spec("state str!", "wiped strlist!"))

Empty, PeerAuthAnswer = declare(
    "PeerAuth", VPNAPI, STREAMS_EXCHANGE,
    Access(CALLER_VPN_PEER, SERVED_COORDINATOR, "the proof itself"),
    "proves the caller's WireGuard private key (the one recorded for its VPN IP) for this connection: a MAC over a "
    "fresh challenge; every other vpnapi method requires it",
    request=Empty,
    answer=spec("authenticated bool!"))

GetUpdateRequest, GetUpdateAnswer = declare(
    "GetUpdate", VPNAPI, STREAMS_NONE,
    Access(CALLER_PEER, SERVED_COORDINATOR),
    "the peer changes since a version (only the version when nothing changed); with `wait`, a long poll: held until "
    "the peers or the measurements version change, or `wait` seconds passed",
    request=spec("resource_version int!",
                 "wait number: a long poll: seconds (up to 60) the Coordinator may hold the request until the "
                 "peers or the measurements version change"),
    answer=spec("resource_version int!", "full bool", "added list", "removed strlist", "changed list",
                "signature str: the Coordinators' signature of the peer set at this version",
                "long_poll bool: true: the Coordinator held the request (``wait``) until a change or the wait "
                "passed",
                "measurements_version int: the version of the accepted measurement sets (GetMeasurements when "
                "above the node's)",
                "cluster_pod_cidr str: the cluster's pod range, signed with the peer set (the pod network)"))

GetJoinArgsRequest, GetJoinArgsAnswer = declare(
    "GetJoinArgs", VPNAPI, STREAMS_NONE,
    Access(CALLER_VERIFIED_PEER, SERVED_COORDINATOR, "control-plane files: a designated control plane"),
    "kubeadm join arguments (API server endpoint, a fresh token, pinned CA hash), the kubelet certificate for the "
    "caller's CSR, a control plane's PKI files",
    request=spec("certificate_request b64: the kubelet's PKCS#10 CSR (DER or PEM)",
                 "is_control_plane bool"),
    answer=spec("api_server_endpoint str!",
                "token str!: secret",
                "discovery_token_ca_cert_hash str!",
                "kubelet_cert str: PEM, signed by the cluster CA",
                "node_name str",
                "control_plane_files list: secret"))

Empty, GetCertificateKeyAnswer = declare(
    "GetCertificateKey", VPNAPI, STREAMS_NONE,
    Access(CALLER_CONTROL_PLANE, SERVED_COORDINATOR),
    "a fresh kubeadm certificate key, the control-plane certificates uploaded under it",
    request=Empty,
    answer=spec("certificate_key str!: secret"))

GetDataKeyRequest, GetDataKeyAnswer = declare(
    "GetDataKey", VPNAPI, STREAMS_NONE,
    Access(CALLER_VERIFIED_PEER, SERVED_COORDINATOR),
    "a data key derived by the Coordinator's KMS (never a disk key or a reserved ID)",
    request=spec("data_key_id str!", "length int"),
    answer=spec("data_key b64!: secret"))

Empty, GetStateDiskKeyAnswer = declare(
    "GetStateDiskKey", VPNAPI, STREAMS_NONE,
    Access(CALLER_VERIFIED_PEER, SERVED_COORDINATOR, "its own key only"),
    "the caller's own state disk key, for a node whose activation was interrupted (docs/agent.md)",
    request=Empty,
    answer=spec("state_disk_key b64(32)!: secret"))

SetMeasurementsRequest, SetMeasurementsAnswer = declare(
    "SetMeasurements", ADMIN, STREAMS_NONE,
    Access(CALLER_ADMIN, SERVED_COORDINATOR),
    "the admin (authenticated) sets the accepted measurement sets on a Coordinator: checked (signature, version), "
    "kept in its store, applied; retiring a set a peer still runs, or no longer accepting the agent a peer runs, is "
    "refused, naming the peers",
    request=spec("document b64: the policy file's exact bytes (at most 1 MiB); none: only report",
                 "signature str: its detached signature (cosign sign-blob); required where a measurements key is "
                 "pinned",
                 "check bool: predict only (check mode)"),
    answer=spec("changed bool!", "version int!", "sets strlist!", "added strlist", "removed strlist",
                "peers object: {vpn_ip: the set it matched at its last re-attestation}",
                "agents object: {vpn_ip: the accepted agent its PCR 13 matched at its last re-attestation}"))

Empty, GetMeasurementsAnswer = declare(
    "GetMeasurements", VPNAPI, STREAMS_NONE,
    Access(CALLER_PEER, SERVED_COORDINATOR),
    "the accepted measurement sets the Coordinators hold (the document and its signature; each node checks them "
    "with its own pinned key)",
    request=Empty,
    answer=spec("version int!", "document b64!", "signature str"))


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
