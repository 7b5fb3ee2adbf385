# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A peer's Core: states, roles, the node lock and the activation logic (SPEC.md 4, 6).

No sockets here: the servers in ``rpc/`` call these methods and turn errors into answers.

* States only advance (SPEC 6.4); any error after the point of no return leaves ``Failed``.
* The node lock (``NodeLock``): an in-process compare-and-swap, then PCR 15 is extended with the
  cluster ID (``tpm.mark_initialized``) BEFORE any other secret is stored or used. A second
  activation, or a concurrent one, is refused with ``StateError``.
* Activation as Coordinator derives the measurement secret and cluster ID from the KMS, allocates
  the VPN IPs and persists everything in the store; activation as Node takes the VPN IP, peers,
  cluster ID and admin key, and stores the disk key derived for the UUID it reported.
* Persistence: the node state, KMS settings and the peer registry live in the store
  (``peerstore``), so an agent restart loses nothing.
"""

from __future__ import annotations

import base64
import enum
import hmac
import ipaddress
import os
import threading
import uuid as uuid_mod
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

try:
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519
except ImportError:  # ansible-test's import sanity runs without third-party packages
    HAS_CRYPTOGRAPHY = False
else:
    HAS_CRYPTOGRAPHY = True

from ansible_collections.constellation.cluster.plugins.module_utils import kms as kms_mod
from ansible_collections.constellation.cluster.plugins.module_utils import peerstore
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    expected_pcr15,
)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    ConstellationError,
    InputError,
    StateError,
)
from ansible_collections.constellation.cluster.plugins.module_utils.peers import PeerRecord, PeerUpdate
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import (
    LISTEN_PORT,
    VPN_CIDR,
    CommandRunner,
    PeerRequest,
    WireGuard,
    diff_peers,
    generate_priv_key,
    parse_interface_spec,
    pub_key_from_priv_key,
)

MEASUREMENT_SALT_LENGTH = 32
CLUSTER_ID_LENGTH = 32
STATE_DISK_KEY_FILE = "state_disk.key"
ADMIN_PUB_KEY_MAX = 16384
# GetDataKey never hands out these: they are given only to whom they belong, at activation.
RESERVED_DATA_KEY_IDS = frozenset((kms_mod.MEASUREMENT_SECRET_KEY_ID, kms_mod.EMERGENCY_SSH_CA_KEY_ID,
                                   kms_mod.CLUSTER_ID_KEY_ID))


class State(enum.IntEnum):
    """SPEC 6.4: values and names as Constellation's Coordinator."""

    UNINITIALIZED = 0
    ACCEPTING_INIT = 1
    ACTIVATING_NODES = 2
    NODE_WAITING_FOR_CLUSTER_JOIN = 3
    IS_NODE = 4
    FAILED = 5

    @property
    def wire_name(self) -> str:
        return _STATE_NAMES[self]


_STATE_NAMES = {
    State.UNINITIALIZED: "Uninitialized",
    State.ACCEPTING_INIT: "AcceptingInit",
    State.ACTIVATING_NODES: "ActivatingNodes",
    State.NODE_WAITING_FOR_CLUSTER_JOIN: "NodeWaitingForClusterJoin",
    State.IS_NODE: "IsNode",
    State.FAILED: "Failed",
}

ROLE_UNKNOWN = "unknown"
ROLE_COORDINATOR = "coordinator"
ROLE_NODE = "node"


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class CoordinatorActivation:
    cluster_id: bytes
    coordinator_vpn_ip: str
    coordinator_vpn_pub_key: str
    state: str

    def to_dict(self) -> Dict[str, Any]:
        return {"cluster_id": _b64(self.cluster_id), "coordinator_vpn_ip": self.coordinator_vpn_ip,
                "coordinator_vpn_pub_key": self.coordinator_vpn_pub_key, "state": self.state}


@dataclass(frozen=True)
class NodeActivationRequest:
    """What the Coordinator sends a node in the first step of ActivateAsNode."""

    node_vpn_ip: str
    peers: Tuple[PeerRecord, ...]
    cluster_id: bytes
    measurement_salt: bytes
    admin_pub_key: str
    coordinator_vpn_ip: str

    @classmethod
    def from_dict(cls, params: Mapping[str, Any]) -> "NodeActivationRequest":
        if not isinstance(params, Mapping):
            raise InputError("params", "a JSON object", type(params).__name__)
        node_vpn_ip = _ip(params.get("node_vpn_ip"), "node_vpn_ip")
        coordinator_vpn_ip = _ip(params.get("coordinator_vpn_ip"), "coordinator_vpn_ip")
        peers_raw = params.get("peers")
        if not isinstance(peers_raw, list) or len(peers_raw) > 65536:
            raise InputError("peers", "a list of {vpn_ip, vpn_pub_key, public_ip, role}", type(peers_raw).__name__)
        peers = []
        for index, item in enumerate(peers_raw):
            if not isinstance(item, Mapping):
                raise InputError("peers[%d]" % index, "an object", type(item).__name__)
            peers.append(PeerRecord.parse(item.get("vpn_ip"), item.get("vpn_pub_key"), item.get("public_ip"),
                                          item.get("role", "node"), "peers[%d]" % index))
        cluster_id = _b64d(params.get("cluster_id"), "cluster_id", CLUSTER_ID_LENGTH)
        salt = _b64d(params.get("measurement_salt"), "measurement_salt", MEASUREMENT_SALT_LENGTH)
        admin_pub_key = params.get("admin_pub_key")
        parse_admin_pub_key(admin_pub_key)
        return cls(node_vpn_ip, tuple(peers), cluster_id, salt, admin_pub_key, coordinator_vpn_ip)

    def to_dict(self) -> Dict[str, Any]:
        return {"node_vpn_ip": self.node_vpn_ip, "peers": [p.to_dict() for p in self.peers],
                "cluster_id": _b64(self.cluster_id), "measurement_salt": _b64(self.measurement_salt),
                "admin_pub_key": self.admin_pub_key, "coordinator_vpn_ip": self.coordinator_vpn_ip}


@dataclass(frozen=True)
class NodeActivationStep:
    """The node's answer to the first step: its disk UUID and WireGuard public key."""

    state_disk_uuid: str
    node_vpn_pub_key: str


@dataclass(frozen=True, repr=False)
class JoinTicket:
    """What the join service hands a verified node (SPEC 4.1, the parts that apply here)."""

    cluster_id: bytes
    measurement_salt: bytes
    measurement_secret: bytes
    state_disk_key: bytes
    node_vpn_ip: str
    peers: Tuple[PeerRecord, ...]
    coordinator_vpn_ip: str
    admin_pub_key: str
    kubeadm: Dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return "JoinTicket(node_vpn_ip=%r, <secrets>)" % self.node_vpn_ip

    def to_dict(self) -> Dict[str, Any]:
        return {"cluster_id": _b64(self.cluster_id), "measurement_salt": _b64(self.measurement_salt),
                "measurement_secret": _b64(self.measurement_secret), "state_disk_key": _b64(self.state_disk_key),
                "node_vpn_ip": self.node_vpn_ip, "peers": [p.to_dict() for p in self.peers],
                "coordinator_vpn_ip": self.coordinator_vpn_ip, "admin_pub_key": self.admin_pub_key,
                "kubeadm": dict(self.kubeadm)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "JoinTicket":
        request = NodeActivationRequest.from_dict(data)
        kubeadm = data.get("kubeadm") or {}
        if not isinstance(kubeadm, Mapping):
            raise InputError("kubeadm", "an object", type(kubeadm).__name__)
        return cls(request.cluster_id, request.measurement_salt,
                   _b64d(data.get("measurement_secret"), "measurement_secret", 32),
                   _b64d(data.get("state_disk_key"), "state_disk_key", kms_mod.STATE_DISK_KEY_LENGTH),
                   request.node_vpn_ip, request.peers, request.coordinator_vpn_ip, request.admin_pub_key,
                   dict(kubeadm))


# --------------------------------------------------------------------------- helpers


def _b64(data: bytes) -> str:
    return base64.b64encode(bytes(data)).decode("ascii")


def _b64d(value: Any, field_name: str, size: int) -> bytes:
    if not isinstance(value, str) or len(value) > 4 * ((size + 2) // 3) + 4:
        raise InputError(field_name, "standard base64 of %d bytes" % size)
    try:
        raw = base64.b64decode(value.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise InputError(field_name, "standard base64 of %d bytes" % size) from None
    if len(raw) != size:
        raise InputError(field_name, "standard base64 of %d bytes" % size, "%d bytes" % len(raw))
    return raw


def _ip(value: Any, field_name: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise InputError(field_name, "an IP address", value) from None


def _open_kms(kms_uri: Any) -> kms_mod.ClusterKMS:
    """The KMS of a URI; every error names the field ``kms_uri`` (never a secret)."""
    try:
        return kms_mod.open_kms(kms_uri, "kms_uri")
    except InputError as err:
        if err.field.startswith("kms_uri"):
            raise
        raise InputError("kms_uri", "a valid KMS URI (%s)" % err) from None


def parse_admin_pub_key(text: Any):
    """The admin's public key: PEM SubjectPublicKeyInfo or an OpenSSH line; Ed25519 or ECDSA P-256."""
    if not HAS_CRYPTOGRAPHY:
        raise ConstellationError("the Python package cryptography is required for admin keys")
    if not isinstance(text, str) or not text.strip() or len(text) > ADMIN_PUB_KEY_MAX:
        raise InputError("admin_pub_key", "a PEM or OpenSSH public key (Ed25519 or ECDSA P-256)")
    data = text.strip().encode("ascii", "replace")
    key = None
    for loader in (serialization.load_pem_public_key, serialization.load_ssh_public_key):
        try:
            key = loader(data)
            break
        except (ValueError, TypeError, UnsupportedAlgorithm):
            continue
    if key is None:
        raise InputError("admin_pub_key", "a PEM or OpenSSH public key (Ed25519 or ECDSA P-256)", text[:40])
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key
    if isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1):
        return key
    raise InputError("admin_pub_key", "an Ed25519 or ECDSA P-256 key", type(key).__name__)


def parse_measurement_salt(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        raw = bytes(value)
        if len(raw) != MEASUREMENT_SALT_LENGTH:
            raise InputError("measurement_salt", "%d bytes" % MEASUREMENT_SALT_LENGTH, "%d bytes" % len(raw))
        return raw
    return _b64d(value, "measurement_salt", MEASUREMENT_SALT_LENGTH)


def normalize_disk_uuid(value: Any) -> str:
    return kms_mod.state_disk_key_id(value)


def new_disk_uuid() -> str:
    return str(uuid_mod.uuid4())


# --------------------------------------------------------------------------- seams


class TPMDevice:
    """The TPM operations the Core needs, on a TCTI (swtpm in the lab, /dev/tpmrm0 on a node)."""

    def __init__(self, tcti: Optional[str]):
        self.tcti = tcti

    def mark_initialized(self, cluster_id: bytes) -> None:
        from ansible_collections.constellation.cluster.plugins.module_utils.attestation import tpm

        tpm.mark_initialized(self.tcti, cluster_id)

    def pcr15(self) -> bytes:
        from ansible_collections.constellation.cluster.plugins.module_utils.attestation import tpm

        with tpm.open_tpm(self.tcti) as dev:
            return dev.pcr_read("sha256", [tpm.PCR_INDEX_CLUSTER_ID])[tpm.PCR_INDEX_CLUSTER_ID]


class NodeLock:
    """Constellation's nodelock: one transition, unlocked -> locked, that extends PCR 15.

    ``try_lock_once`` is a compare-and-swap: exactly one caller (thread) ever gets True, and only
    that caller extends PCR 15. A failed TPM call still leaves the lock taken (the node must then
    be reset, as Constellation's)."""

    def __init__(self, tpm: TPMDevice):
        self._tpm = tpm
        self._mutex = threading.Lock()
        self._locked = False

    @property
    def locked(self) -> bool:
        return self._locked

    def try_lock_once(self, cluster_id: bytes) -> bool:
        with self._mutex:
            if self._locked:
                return False
            self._locked = True
        self._tpm.mark_initialized(cluster_id)
        return True

    def mark_taken(self) -> None:
        """At start-up, PCR 15 already holds a cluster ID: the lock was taken in an earlier life."""
        with self._mutex:
            self._locked = True


class WireGuardVPN:
    """The WireGuard Core (wireguard.py) as the agent uses it: one interface, a full peer list."""

    def __init__(self, interface: str = "wg0", key_file: str = "wg0.key", runner: Optional[CommandRunner] = None,
                 listen_port: int = LISTEN_PORT, vpn_cidr: str = VPN_CIDR):
        self.interface = interface
        self.key_file = key_file
        self.listen_port = listen_port
        self.vpn_cidr = vpn_cidr
        self.wg = WireGuard(runner or CommandRunner())
        self._lock = threading.Lock()

    def setup(self, vpn_ip: str, priv_key: str) -> None:
        kms_mod.write_secret_file(self.key_file, priv_key.encode("ascii") + b"\n")
        prefix = ipaddress.ip_network(self.vpn_cidr).prefixlen
        spec = parse_interface_spec(self.interface, "%s/%d" % (vpn_ip, prefix), self.listen_port,
                                    vpn_cidr=self.vpn_cidr)
        with self._lock:
            self.wg.ensure_interface(spec, self.key_file, pub_key_from_priv_key(priv_key))

    def set_peers(self, records: List[PeerRecord], own_pub_key: str) -> bool:
        """Makes the interface's peers exactly ``records`` (minus ourselves), changing in place."""
        wanted = [PeerRequest(r.to_peer(self.listen_port)) for r in records if r.vpn_pub_key != own_pub_key]
        with self._lock:
            live = self.wg.show(self.interface)
            if live is None:
                raise StateError("WireGuard interface %s does not exist" % self.interface)
            diff = diff_peers(wanted, live, exclusive=True)
            self.wg.apply_peer_diff(self.interface, diff)
        return bool(diff)


# --------------------------------------------------------------------------- the Core


class Core:
    """One peer. Thread-safe; every method may be called from a server thread."""

    def __init__(self, store, tpm: TPMDevice, vpn, state_dir: str, public_ip: str,
                 disk_uuid: str, log: Optional[Callable[..., None]] = None,
                 kubeadm_join_args: Optional[Callable[[], Dict[str, Any]]] = None):
        self.store = store
        self.tpm = tpm
        self.vpn = vpn
        self.state_dir = state_dir
        self.public_ip = _ip(public_ip, "public_ip")
        self.disk_uuid = normalize_disk_uuid(disk_uuid)
        self._log = log or (lambda event, **fields: None)
        self.kubeadm_join_args = kubeadm_join_args
        self.lock = NodeLock(tpm)
        self._mutex = threading.RLock()
        self._state = State.UNINITIALIZED
        self._role = ROLE_UNKNOWN
        self._node: Dict[str, Any] = {}  # persisted node state (no secrets beyond the store's)
        self._kms: Optional[kms_mod.ClusterKMS] = None
        self._pending_node: Optional[NodeActivationRequest] = None
        self.recovery_pending = False
        self.failure: Optional[str] = None
        self._listeners: List[Callable[[State], None]] = []

    # -- state
    @property
    def state(self) -> State:
        return self._state

    @property
    def role(self) -> str:
        return self._role

    @property
    def node_state(self) -> Dict[str, Any]:
        with self._mutex:
            return dict(self._node)

    def on_state_change(self, listener: Callable[[State], None]) -> None:
        self._listeners.append(listener)

    def _advance(self, new: State) -> None:
        with self._mutex:
            if new <= self._state and not (new == State.FAILED and self._state != State.FAILED):
                raise StateError("state cannot go from %s back to %s" % (self._state.wire_name, new.wire_name))
            old, self._state = self._state, new
        self._log("state", old=old.wire_name, new=new.wire_name)
        for listener in list(self._listeners):
            listener(new)

    def _fail(self, what: str, err: BaseException) -> None:
        self.failure = "%s failed after the node lock: %s" % (what, err)
        self._log("failed", what=what, error=str(err) if isinstance(err, ConstellationError) else type(err).__name__)
        if self._state != State.FAILED:
            self._advance(State.FAILED)

    def require_state(self, method: str, *allowed: State) -> None:
        if self._state not in allowed:
            raise StateError("%s is allowed only in state %s; this node is %s"
                             % (method, " or ".join(s.wire_name for s in allowed), self._state.wire_name))

    def get_state(self) -> Dict[str, Any]:
        return {"state": self._state.wire_name, "state_code": int(self._state), "role": self._role}

    # -- start-up
    def load(self) -> State:
        """Restores a persisted state (agent restart) or enters AcceptingInit (fresh node)."""
        node = peerstore.load_node_state(self.store)
        pcr15 = self.tpm.pcr15()
        if node is None:
            if pcr15 != bytes(32):
                self.lock.mark_taken()
                self.failure = "PCR 15 is set but no node state is stored: this node must be reset"
                self._advance(State.FAILED)
                return self._state
            self._advance(State.ACCEPTING_INIT)
            return self._state
        cluster_id = base64.b64decode(node["cluster_id"])
        with self._mutex:
            self._node = node
            self._role = node["role"]
        if pcr15 == expected_pcr15(cluster_id):
            self.lock.mark_taken()
            self._resume()
        elif pcr15 == bytes(32):
            # A reboot reset the TPM: wait for Recover (the KMS URI proves who asks).
            self.recovery_pending = True
            self._advance(State.ACCEPTING_INIT)
        else:
            self.lock.mark_taken()
            self.failure = "PCR 15 holds another cluster's ID than the stored state"
            self._advance(State.FAILED)
        return self._state

    def _resume(self) -> None:
        node = self._node
        if node["role"] == ROLE_COORDINATOR:
            kms_data = peerstore.load_kms_data(self.store)
            if kms_data is None:
                raise StateError("the store holds a Coordinator state without KMS settings")
            self._kms = kms_mod.open_kms(kms_data["kms_uri"])
        self.vpn.setup(node["vpn_ip"], node["vpn_priv_key"])
        if node["role"] == ROLE_COORDINATOR:
            registry = peerstore.load_peer_registry(self.store)
            if registry is not None:
                self.vpn.set_peers(list(registry.peers.peers.values()), self.vpn_pub_key)
        else:
            self.vpn.set_peers([PeerRecord.from_dict(p) for p in node.get("peers", [])], self.vpn_pub_key)
        stored = State(int(node.get("state", State.IS_NODE)))
        if stored == State.NODE_WAITING_FOR_CLUSTER_JOIN:
            # Locked, but the activation never completed: the node must be reset.
            self.failure = "the activation was interrupted after the node lock"
            stored = State.FAILED
        self._advance(stored)

    # -- accessors for servers
    @property
    def vpn_pub_key(self) -> str:
        return pub_key_from_priv_key(self._node["vpn_priv_key"])

    @property
    def vpn_ip(self) -> Optional[str]:
        return self._node.get("vpn_ip")

    @property
    def coordinator_vpn_ip(self) -> Optional[str]:
        return self._node.get("coordinator_vpn_ip")

    @property
    def cluster_id(self) -> Optional[bytes]:
        value = self._node.get("cluster_id")
        return base64.b64decode(value) if value else None

    def admin_pub_key(self):
        text = self._node.get("admin_pub_key")
        return parse_admin_pub_key(text) if text else None

    def _save_node(self, **changes: Any) -> None:
        with self._mutex:
            node = dict(self._node)
            node.update(changes)
            peerstore.save_node_state(self.store, node)
            self._node = node

    def _take_lock(self, cluster_id: bytes, method: str) -> None:
        if not self.lock.try_lock_once(cluster_id):
            raise StateError("%s: the node lock is already taken (another activation is running or done)" % method)

    # -- activation as Coordinator
    def activate_as_coordinator(self, kms_uri: str, measurement_salt: Any, admin_pub_key: str,
                                storage_uri: Optional[str] = None,
                                cluster_config: Optional[Mapping[str, Any]] = None) -> CoordinatorActivation:
        method = "ActivateAsCoordinator"
        self.require_state(method, State.ACCEPTING_INIT)
        if self.recovery_pending:
            raise StateError("%s: this node holds a cluster's state and waits for Recover" % method)
        # All input is checked before the point of no return.
        kms = _open_kms(kms_uri)
        storage_uri = storage_uri or kms_mod.NO_STORE_URI
        kms_mod.parse_storage_uri(storage_uri)
        salt = parse_measurement_salt(measurement_salt)
        parse_admin_pub_key(admin_pub_key)
        config = dict(cluster_config or {})
        unknown = set(config) - {"cluster_name", "vpn_cidr"}
        if unknown:
            raise InputError("cluster_config", "only cluster_name and vpn_cidr", sorted(unknown))
        vpn_cidr = config.get("vpn_cidr", VPN_CIDR)
        if vpn_cidr != getattr(self.vpn, "vpn_cidr", VPN_CIDR):
            raise InputError("cluster_config.vpn_cidr", "the agent's VPN CIDR %s" % getattr(self.vpn, "vpn_cidr", VPN_CIDR),
                             vpn_cidr)
        cluster_id = kms.cluster_id(salt)
        self._take_lock(cluster_id, method)
        self._log("node_lock", role=ROLE_COORDINATOR, pcr=15)
        try:
            priv_key = generate_priv_key()
            pub_key = pub_key_from_priv_key(priv_key)

            def add_self(registry):
                return registry.add(pub_key, self.public_ip, "coordinator")

            record = peerstore.update_peer_registry(self.store, add_self, vpn_cidr)
            peerstore.save_kms_data(self.store, {"kms_uri": kms_uri, "storage_uri": storage_uri})
            self._kms = kms
            with self._mutex:
                self._role = ROLE_COORDINATOR
            self.vpn.setup(record.vpn_ip, priv_key)
            self._save_node(role=ROLE_COORDINATOR, vpn_ip=record.vpn_ip, vpn_priv_key=priv_key,
                            cluster_id=_b64(cluster_id), measurement_salt=_b64(salt), admin_pub_key=admin_pub_key,
                            coordinator_vpn_ip=record.vpn_ip, cluster_name=str(config.get("cluster_name", "")),
                            disk_uuid=self.disk_uuid, state=int(State.ACTIVATING_NODES))
            self._write_disk_key(kms.state_disk_key(self.disk_uuid))
            self._advance(State.ACTIVATING_NODES)
        except BaseException as err:
            self._fail(method, err)
            raise
        return CoordinatorActivation(cluster_id, record.vpn_ip, pub_key, self._state.wire_name)

    # -- activation as Node (two steps)
    def activate_as_node_begin(self, params: Mapping[str, Any]) -> NodeActivationStep:
        method = "ActivateAsNode"
        self.require_state(method, State.ACCEPTING_INIT)
        if self.recovery_pending:
            raise StateError("%s: this node holds a cluster's state and waits for Recover" % method)
        request = NodeActivationRequest.from_dict(params)
        self._take_lock(request.cluster_id, method)
        self._log("node_lock", role=ROLE_NODE, pcr=15)
        try:
            priv_key = generate_priv_key()
            with self._mutex:
                self._role = ROLE_NODE
                self._pending_node = request
            self.vpn.setup(request.node_vpn_ip, priv_key)
            self._node = {"vpn_priv_key": priv_key}
            self.vpn.set_peers(list(request.peers), pub_key_from_priv_key(priv_key))
            self._save_node(**self._node_fields(request, priv_key, State.NODE_WAITING_FOR_CLUSTER_JOIN))
            self._advance(State.NODE_WAITING_FOR_CLUSTER_JOIN)
        except BaseException as err:
            self._fail(method, err)
            raise
        return NodeActivationStep(self.disk_uuid, pub_key_from_priv_key(priv_key))

    def activate_as_node_finish(self, state_disk_key: bytes) -> Dict[str, Any]:
        method = "ActivateAsNode"
        self.require_state(method + " (second step)", State.NODE_WAITING_FOR_CLUSTER_JOIN)
        try:
            if not isinstance(state_disk_key, bytes) or len(state_disk_key) != kms_mod.STATE_DISK_KEY_LENGTH:
                raise InputError("state_disk_key", "%d bytes" % kms_mod.STATE_DISK_KEY_LENGTH)
            self._write_disk_key(state_disk_key)
            self._save_node(state=int(State.IS_NODE))
            self._advance(State.IS_NODE)
        except BaseException as err:
            self._fail(method, err)
            raise
        return {"state": self._state.wire_name, "node_vpn_ip": self.vpn_ip}

    def abort_node_activation(self, reason: str) -> None:
        """The Coordinator went away between the two steps: locked but incomplete -> Failed."""
        if self._state == State.NODE_WAITING_FOR_CLUSTER_JOIN:
            self._fail("ActivateAsNode", StateError(reason))

    def _node_fields(self, request: NodeActivationRequest, priv_key: str, state: State) -> Dict[str, Any]:
        coordinator = next((p for p in request.peers if p.vpn_ip == request.coordinator_vpn_ip), None)
        return {"role": ROLE_NODE, "vpn_ip": request.node_vpn_ip, "vpn_priv_key": priv_key,
                "cluster_id": _b64(request.cluster_id), "measurement_salt": _b64(request.measurement_salt),
                "admin_pub_key": request.admin_pub_key, "coordinator_vpn_ip": request.coordinator_vpn_ip,
                "coordinator_vpn_pub_key": coordinator.vpn_pub_key if coordinator else None,
                "peers": [p.to_dict() for p in request.peers], "resource_version": -1,
                "disk_uuid": self.disk_uuid, "state": int(state)}

    def _write_disk_key(self, key: bytes) -> None:
        # The simulated state disk's passphrase: a 0600 file in the agent's directory.
        kms_mod.write_secret_file(os.path.join(self.state_dir, STATE_DISK_KEY_FILE), key)

    def read_disk_key(self) -> Optional[bytes]:
        try:
            with open(os.path.join(self.state_dir, STATE_DISK_KEY_FILE), "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    # -- join (node side)
    def join(self, ticket: JoinTicket) -> Dict[str, Any]:
        """A node takes a join ticket: check the cluster ID, node lock, then use the secrets."""
        method = "IssueJoinTicket"
        self.require_state(method, State.ACCEPTING_INIT)
        if self.recovery_pending:
            raise StateError("%s: this node holds a cluster's state and waits for Recover" % method)
        derived = kms_mod.derive_cluster_id(ticket.measurement_secret, ticket.measurement_salt)
        if not hmac.compare_digest(derived, ticket.cluster_id):
            raise StateError("%s: the ticket's cluster ID does not follow from its measurement secret and salt"
                             % method)
        self._take_lock(ticket.cluster_id, method)
        self._log("node_lock", role=ROLE_NODE, pcr=15, via="join")
        try:
            priv_key = self._join_priv_key
            with self._mutex:
                self._role = ROLE_NODE
            request = NodeActivationRequest(ticket.node_vpn_ip, ticket.peers, ticket.cluster_id,
                                            ticket.measurement_salt, ticket.admin_pub_key, ticket.coordinator_vpn_ip)
            self.vpn.setup(ticket.node_vpn_ip, priv_key)
            self.vpn.set_peers(list(ticket.peers), pub_key_from_priv_key(priv_key))
            self._write_disk_key(ticket.state_disk_key)
            self._node = {"vpn_priv_key": priv_key}
            self._save_node(**self._node_fields(request, priv_key, State.IS_NODE))
            self._advance(State.NODE_WAITING_FOR_CLUSTER_JOIN)
            self._advance(State.IS_NODE)
        except BaseException as err:
            self._fail(method, err)
            raise
        return {"state": self._state.wire_name, "node_vpn_ip": self.vpn_ip}

    _join_key_lock = threading.Lock()
    _join_priv_key_value: Optional[str] = None

    @property
    def _join_priv_key(self) -> str:
        """The WireGuard key a joining node announces; generated once per agent life."""
        with self._join_key_lock:
            if self._join_priv_key_value is None:
                self._join_priv_key_value = generate_priv_key()
            return self._join_priv_key_value

    def join_vpn_pub_key(self) -> bytes:
        return base64.b64decode(pub_key_from_priv_key(self._join_priv_key))

    # -- Coordinator: activating nodes
    def require_coordinator(self, method: str) -> kms_mod.ClusterKMS:
        self.require_state(method, State.ACTIVATING_NODES)
        if self._kms is None:
            raise StateError("%s: this Coordinator has no KMS" % method)
        return self._kms

    def reserve_node_ip(self) -> str:
        self.require_coordinator("ActivateAdditionalNodes")
        return peerstore.update_peer_registry(self.store, lambda r: r.allocator.allocate("node"))

    def release_node_ip(self, vpn_ip: str) -> None:
        def release(registry):
            if registry.peers.get(vpn_ip) is None:
                registry.allocator.release(vpn_ip)

        peerstore.update_peer_registry(self.store, release)

    def node_activation_request(self, node_vpn_ip: str) -> NodeActivationRequest:
        self.require_coordinator("ActivateAdditionalNodes")
        registry = peerstore.load_peer_registry(self.store)
        node = self._node
        return NodeActivationRequest(node_vpn_ip, tuple(registry.peers.peers.values()),
                                     base64.b64decode(node["cluster_id"]), base64.b64decode(node["measurement_salt"]),
                                     node["admin_pub_key"], node["vpn_ip"])

    def state_disk_key(self, disk_uuid: str) -> bytes:
        return self.require_coordinator("state disk key").state_disk_key(disk_uuid)

    def add_node_peer(self, vpn_ip: str, vpn_pub_key: str, public_ip: str) -> int:
        """Records an activated node (its reserved IP) and adds it to our WireGuard peers."""
        self.require_coordinator("add node")
        record = PeerRecord.parse(vpn_ip, vpn_pub_key, public_ip, "node")

        def put(registry):
            if registry.peers.by_pub_key(record.vpn_pub_key) not in (None, registry.peers.get(vpn_ip)):
                raise StateError("WireGuard key of %s is already used by another peer" % vpn_ip)
            if not registry.allocator.in_use(vpn_ip):
                registry.allocator.reserve(vpn_ip)
            version = registry.peers.put(record)
            return version, list(registry.peers.peers.values())

        version, records = peerstore.update_peer_registry(self.store, put)
        self.vpn.set_peers(records, self.vpn_pub_key)
        self._log("peer_added", vpn_ip=vpn_ip, public_ip=public_ip, resource_version=version)
        return version

    def remove_peer(self, vpn_ip: str) -> int:
        self.require_coordinator("remove peer")

        def remove(registry):
            registry.remove(vpn_ip)
            return registry.peers.version, list(registry.peers.peers.values())

        version, records = peerstore.update_peer_registry(self.store, remove)
        self.vpn.set_peers(records, self.vpn_pub_key)
        return version

    def issue_join_ticket(self, disk_uuid: str, vpn_ip: str) -> JoinTicket:
        kms = self.require_coordinator("IssueJoinTicket")
        request = self.node_activation_request(vpn_ip)
        kubeadm_args: Dict[str, Any] = {"available": False, "reason": "kubeadm not available on the Coordinator"}
        if self.kubeadm_join_args is not None:
            try:
                kubeadm_args = dict(self.kubeadm_join_args(), available=True)
            except ConstellationError as err:
                kubeadm_args = {"available": False, "reason": str(err)}
        return JoinTicket(request.cluster_id, request.measurement_salt, kms.measurement_secret(),
                          kms.state_disk_key(normalize_disk_uuid(disk_uuid)), vpn_ip, request.peers,
                          request.coordinator_vpn_ip, request.admin_pub_key, kubeadm_args)

    # -- vpnapi
    def is_known_peer_ip(self, ip: str) -> bool:
        registry = peerstore.load_peer_registry(self.store)
        return registry is not None and registry.peers.get(ip) is not None

    def get_update(self, resource_version: Any) -> Dict[str, Any]:
        self.require_coordinator("GetUpdate")
        if not isinstance(resource_version, int) or isinstance(resource_version, bool):
            raise InputError("resource_version", "an integer", type(resource_version).__name__)
        registry = peerstore.load_peer_registry(self.store)
        return registry.peers.updates_since(resource_version).to_dict()

    def get_data_key(self, data_key_id: Any, length: Any) -> bytes:
        kms = self.require_coordinator("GetDataKey")
        if not isinstance(data_key_id, str) or not data_key_id:
            raise InputError("data_key_id", "a non-empty key ID")
        if data_key_id in RESERVED_DATA_KEY_IDS:
            raise InputError("data_key_id", "an ID other than %s (reserved)" % ", ".join(sorted(RESERVED_DATA_KEY_IDS)),
                             data_key_id)
        try:
            kms_mod.state_disk_key_id(data_key_id)
        except InputError:
            pass
        else:
            raise InputError("data_key_id", "no disk UUID (state disk keys go only to their node)", data_key_id)
        if not isinstance(length, int) or isinstance(length, bool) or not 1 <= length <= 64:
            raise InputError("length", "an integer in 1..64", length)
        return kms.derive_key(data_key_id, length)

    # -- node: updates
    def apply_update(self, update: Mapping[str, Any]) -> bool:
        """Applies a GetUpdate answer; returns True if the peers changed."""
        self.require_state("apply update", State.IS_NODE)
        parsed = PeerUpdate.from_dict(update)
        with self._mutex:
            current = {p["vpn_ip"]: PeerRecord.from_dict(p) for p in self._node.get("peers", [])}
            version = self._node.get("resource_version", -1)
        if parsed.resource_version == version and not parsed:
            return False
        new = parsed.apply_to(current)
        self.vpn.set_peers(list(new.values()), self.vpn_pub_key)
        self._save_node(peers=[new[ip].to_dict() for ip in sorted(new, key=lambda a: int(ipaddress.ip_address(a)))],
                        resource_version=parsed.resource_version)
        changed = new != current
        if changed:
            self._log("peers_updated", resource_version=parsed.resource_version, peers=len(new))
        return changed

    @property
    def resource_version(self) -> int:
        return int(self._node.get("resource_version", -1))

    # -- recovery
    def recover(self, kms_uri: str) -> Dict[str, Any]:
        method = "Recover"
        if not self.recovery_pending:
            raise StateError("%s is allowed only on a node whose stored state waits for recovery (PCR 15 reset); "
                             "this node is %s" % (method, self._state.wire_name))
        kms = _open_kms(kms_uri)
        node = self._node
        salt = base64.b64decode(node["measurement_salt"])
        cluster_id = kms.cluster_id(salt)
        if not hmac.compare_digest(cluster_id, base64.b64decode(node["cluster_id"])):
            raise StateError("%s: the KMS URI does not derive this node's cluster ID" % method)
        if node["role"] == ROLE_NODE:
            disk_key = self.read_disk_key()
            if disk_key is not None and not hmac.compare_digest(disk_key, kms.state_disk_key(node["disk_uuid"])):
                raise StateError("%s: the KMS URI does not derive this node's disk key" % method)
        self._take_lock(cluster_id, method)
        try:
            self.recovery_pending = False
            self._resume()
        except BaseException as err:
            self._fail(method, err)
            raise
        return self.get_state()
