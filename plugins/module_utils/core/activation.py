# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Coordinator activates nodes (``Activation``: ActivateAdditionalNodes), and resumes an activation
that a crash or a cut link interrupted (docs/agent.md, "Resumable activation"). The transport to a node comes
in as a port (``ports.ConnectNode``); the registry (core/coordinator.py), the signatures (core/signing.py),
disk ownership (core/registry/peer_access.py) and the evictions (core/eviction/evictions.py) through the Protocols below."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Protocol, Sequence

from ansible_collections.constellation.cluster.plugins.module_utils import kms as kms_mod
from ansible_collections.constellation.cluster.plugins.module_utils.core.records import node_records
from ansible_collections.constellation.cluster.plugins.module_utils.core.admissions import parse_node_name
from ansible_collections.constellation.cluster.plugins.module_utils.encoding import parse_endpoint
from ansible_collections.constellation.cluster.plugins.module_utils.constants import (
    STATE_IS_NODE,
    STATE_NODE_WAITING_FOR_CLUSTER_JOIN,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.inputs import normalize_disk_uuid
from ansible_collections.constellation.cluster.plugins.module_utils.core.removal import require_not_removed
from ansible_collections.constellation.cluster.plugins.module_utils.core.ports import ConnectNode, NodeClient
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    ConnectionLost,
    ConstellationError,
    InputError,
    StateError,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_record import PeerRecord

MAX_NODES_PER_CALL = 256
# Nodes activated at once (each: one aTLS connection, the node's quote, one validation, two store writes).
# The agent's ``activation_workers`` sets it per Coordinator (docs/agent.md).
ACTIVATION_WORKERS = 16
MAX_ACTIVATION_WORKERS = 64
# A resumed node fetches its disk key over the VPN on its own loop; how long the Coordinator waits.
RESUME_TIMEOUT = 60
RESUME_POLL = 0.2

if TYPE_CHECKING:  # pragma: no cover
    from ansible_collections.constellation.cluster.plugins.module_utils.core.context import PeerContext


class Registry(Protocol):
    """The Coordinator's peer registry (core/coordinator.py ``Coordinator``)."""

    def membership(self, client: NodeClient) -> str:
        """'fresh', 'ours' or 'other' (PCR 15)."""

    def reserve_node_ip(self) -> str:
        """A fresh VPN IP for a node."""

    def release_node_ip(self, vpn_ip: str) -> None:
        """Frees a reserved IP nobody was recorded at."""

    def node_activation_request(self, node_vpn_ip: str) -> Any:
        """The cluster's identity and peers for the node at ``node_vpn_ip``."""

    def init_proof_for(self, public_ip: str) -> Dict[str, Any]:
        """The ``init_proof`` field for the node at ``public_ip``."""

    def state_disk_key(self, disk_uuid: str) -> bytes:
        """The disk key for ``disk_uuid``."""

    def add_node_peer(self, vpn_ip: str, vpn_pub_key: str, public_ip: str, role: str = "node") -> int:
        """Records a peer."""

    def is_known_peer_ip(self, ip: str) -> bool:
        """Whether ``ip`` is a peer's VPN IP."""


class CoordinatorAuth(Protocol):
    """Proves the Coordinators' key to a node (core/signing.py ``Signing``)."""

    def authenticate_as_coordinator(self, client: Any) -> None:
        """AdminAuth role coordinator on ``client``."""


class DiskClaim(Protocol):
    """Who owns a disk UUID (core/registry/peer_access.py ``PeerAccess``)."""

    def claim_disk_uuid(self, disk_uuid: str, vpn_ip: str, vpn_pub_key: str, method: str) -> None:
        """Records the owner, or AccessDenied if another peer holds it."""


class Readmission(Protocol):
    """Evicted Nodes that come back (core/eviction/evictions.py ``Evictions``)."""

    def check_readmission(self, vpn_ip: str, vpn_pub_key: str) -> bool:
        """True if ``vpn_ip`` is evicted (and comes back with its key); StateError for another key."""

    def clear_eviction(self, vpn_ip: str) -> None:
        """The Node is a peer again."""


class NodeNames(Protocol):
    """The admin's names for nodes (core/kubernetes.py ``Kubernetes``)."""

    def name_node(self, vpn_ip: str, name: str, method: str) -> None:
        """``name`` is the only kubelet node name of the peer at ``vpn_ip``; AccessDenied if taken."""

    def forget_node_name(self, vpn_ip: str) -> None:
        """Gives a failed activation's name back."""


class Activation:
    """ActivateAdditionalNodes over the peer's ``PeerContext``."""

    def __init__(self, context: PeerContext, registry: Registry, signing: CoordinatorAuth, peer_access: DiskClaim,
                 evictions: Readmission, names: Optional[NodeNames] = None, activation_workers: int = ACTIVATION_WORKERS):
        self.context = context
        self.names = names
        self.registry = registry
        self.signing = signing
        self.peer_access = peer_access
        self.evictions = evictions
        self.activation_workers = activation_workers  # the agent's ``activation_workers``

    def activate_nodes(self, endpoints: Sequence[str], connect_node: ConnectNode,
                       control_plane_endpoints: Sequence[str] = (),
                       on_row: Optional[Callable[[Dict[str, Any]], None]] = None,
                       node_names: Optional[Dict[str, str]] = None) -> List[Dict[str, Any]]:
        """Activates the nodes at ``endpoints`` (host:port), in parallel; one result row each. The admin
        designates those of ``control_plane_endpoints`` control planes (recorded with the node: only they
        get control-plane material from the vpnapi). ``on_row(row)`` is called with each row, in order, as
        soon as it and those before it are done (in this thread): the pubapi reports progress with it, so
        a client waiting for 64 activations hears from the Coordinator every few seconds. ``node_names``: endpoint
        -> the name the admin gives the node (its inventory name), its only kubelet node name."""
        self.context.require_coordinator("ActivateAdditionalNodes")
        if not isinstance(endpoints, list) or not endpoints or len(endpoints) > MAX_NODES_PER_CALL:
            raise InputError("node_public_endpoints", "a non-empty list of host:port (at most %d)" % MAX_NODES_PER_CALL)
        for index, endpoint in enumerate(endpoints):
            parse_endpoint(endpoint, "node_public_endpoints[%d]" % index)
        planes = set(control_plane_endpoints or ())
        if not planes <= set(endpoints):
            raise InputError("control_plane_endpoints", "endpoints of node_public_endpoints",
                             sorted(planes - set(endpoints))[:8])
        names = _parse_node_names(node_names, endpoints)
        with ThreadPoolExecutor(max_workers=min(self.activation_workers, len(endpoints)),
                                thread_name_prefix="activate") as pool:
            rows = []
            for row in pool.map(lambda e: self.activate_node(e, connect_node, e in planes, names.get(e)), endpoints):
                rows.append(row)
                if on_row is not None:
                    on_row(row)
            return rows

    def activate_node(self, endpoint: str, connect_node: ConnectNode, control_plane: bool = False,
                      node_name: Optional[str] = None) -> Dict[str, Any]:
        """Activates one node, or resumes its interrupted activation (docs/agent.md, "Resumable
        activation"). The transport verifies the node's attestation (all but PCR 15); PCR 15 says which:
        zeros -> a fresh node: reserve an IP and run ActivateAsNode; our cluster ID -> a node locked to
        us: record it if we have not (from its attested GetState), after which it fetches its disk key
        over the VPN (GetStateDiskKey); anything else is refused. Before the disk key is sent, the node
        (VPN IP, WireGuard key, disk UUID) is recorded, so a Coordinator that dies after that point
        loses nothing and the node can finish without it being reachable on its public endpoint."""
        host, _port = parse_endpoint(endpoint)
        row: Dict[str, Any] = {"node_public_endpoint": endpoint, "ok": False, "node_vpn_ip": None, "error": None,
                               "action": None}
        vpn_ip = None
        sent = locked = False
        try:
            with connect_node(endpoint) as client:
                membership = self.registry.membership(client)
                if membership == "ours":
                    return self._resume_node(endpoint, host, client, row, control_plane, node_name)
                if membership != "fresh":
                    raise StateError("%s is locked to another cluster (PCR 15)" % endpoint)
                vpn_ip = self.registry.reserve_node_ip()
                self.context.log("node_ip_reserved", node=endpoint, node_vpn_ip=vpn_ip)
                if node_name is not None and self.names is not None:  # before the node is asked anything
                    self.names.name_node(vpn_ip, node_name, "ActivateAdditionalNodes")
                request = self.registry.node_activation_request(vpn_ip)

                def record_then_key(disk_uuid: str, node_vpn_pub_key: str) -> bytes:
                    nonlocal locked
                    locked = True  # the node answered the first step: it holds the node lock
                    self.context.log("node_locked", node=endpoint, node_vpn_ip=vpn_ip)
                    normalized = normalize_disk_uuid(disk_uuid)
                    self.record_node(vpn_ip, node_vpn_pub_key, host, normalized, control_plane)
                    return self.registry.state_disk_key(normalized)

                sent = True
                result = client.activate_as_node(dict(request.to_dict(), **self.registry.init_proof_for(host)), record_then_key)
            row.update(ok=True, node_vpn_ip=vpn_ip, state_disk_uuid=result["state_disk_uuid"], action="activated")
            self.context.log("node_activated", node=endpoint, node_vpn_ip=vpn_ip)
        except (ConstellationError, OSError) as err:
            # Lost after the request went out: the node may hold the lock and this VPN IP, so the IP stays
            # reserved for it (a refusal by the node, by contrast, frees it).
            maybe_locked = locked or (sent and isinstance(err, (ConnectionLost, OSError)))
            if vpn_ip is not None and not maybe_locked:
                try:
                    if self.names is not None:
                        self.names.forget_node_name(vpn_ip)
                    self.registry.release_node_ip(vpn_ip)
                except ConstellationError:
                    pass
            row["error"] = str(err) or type(err).__name__
            if locked:
                # Recorded before the key was sent: the node finishes over the VPN by itself.
                row["error"] += " (the node holds the node lock and is recorded: it finishes, or the next run resumes it)"
            elif maybe_locked:
                row["error"] += " (the node may hold the node lock: the next run resumes it)"
            self.context.log("node_activation_failed", node=endpoint, error=row["error"][:300], locked=locked)
        return row

    def _resume_node(self, endpoint: str, host: str, client: NodeClient, row: Dict[str, Any],
                     control_plane: bool = False, node_name: Optional[str] = None) -> Dict[str, Any]:
        """A node locked to our cluster (attested PCR 15): record it if needed, then wait until it
        reports IsNode (it fetches its disk key over the VPN)."""
        self.signing.authenticate_as_coordinator(client)  # the node pinned our key: its GetState details are ours to read
        state = client.get_state()
        vpn_ip, vpn_pub_key, disk_uuid = state.get("vpn_ip"), state.get("vpn_pub_key"), state.get("state_disk_uuid")
        name = state.get("state")
        if name not in (STATE_NODE_WAITING_FOR_CLUSTER_JOIN, STATE_IS_NODE) or not vpn_ip or not vpn_pub_key \
                or not isinstance(disk_uuid, str):
            raise StateError("%s holds our node lock but is %s: it cannot resume (reset the node and run "
                             "add_nodes.yml)" % (endpoint, name))
        # Removed by the admin (core/removal.py): it comes back only reset, rebooted and as a new peer.
        require_not_removed(self.context.store, vpn_pub_key, vpn_ip, "ActivateAdditionalNodes")
        readmit = self.evictions.check_readmission(vpn_ip, vpn_pub_key)  # evicted (core/eviction/peer_trust.py): it passed again
        if node_name is not None and self.names is not None:
            self.names.name_node(vpn_ip, node_name, "ActivateAdditionalNodes")
        recorded = self.record_node(vpn_ip, vpn_pub_key, host, normalize_disk_uuid(disk_uuid), control_plane)
        if readmit:
            self.evictions.clear_eviction(vpn_ip)
        if name == STATE_NODE_WAITING_FOR_CLUSTER_JOIN:
            deadline = time.monotonic() + RESUME_TIMEOUT
            while name == STATE_NODE_WAITING_FOR_CLUSTER_JOIN and time.monotonic() < deadline:
                time.sleep(RESUME_POLL)
                name = client.get_state().get("state")
            if name != STATE_IS_NODE:
                raise StateError("%s did not finish its activation within %d s (it is %s; it fetches its disk key "
                                 "from this Coordinator over the VPN)" % (endpoint, RESUME_TIMEOUT, name))
            row["action"] = "resumed"
        else:
            row["action"] = "readmitted" if readmit else "recorded" if recorded else "none"
        row.update(ok=True, node_vpn_ip=vpn_ip, state_disk_uuid=disk_uuid)
        self.context.log("node_resumed", node=endpoint, node_vpn_ip=vpn_ip, action=row["action"])
        return row

    def record_node(self, vpn_ip: str, vpn_pub_key: str, public_ip: str, disk_uuid: str,
                    control_plane: bool = False) -> bool:
        """Records a node that holds our node lock, before it gets its disk key: its disk UUID (which
        becomes its own: refused, AccessDenied, if another peer's), the admin's control-plane designation,
        then its peer entry. True if anything changed. Refused if its VPN IP or key belongs to another peer."""
        self.context.require_coordinator("record node")
        record = PeerRecord.parse(vpn_ip, vpn_pub_key, public_ip, "node")
        known = node_records.load_node_disk_uuid(self.context.store, record.vpn_ip)
        if known is not None and known != disk_uuid:
            raise StateError("VPN IP %s belongs to another node (disk %s)" % (record.vpn_ip, known))
        registry = self.context.peer_registry.current()
        current = registry.peers.get(record.vpn_ip) if registry is not None else None
        if current is not None and current.vpn_pub_key != record.vpn_pub_key:
            raise StateError("VPN IP %s belongs to another peer (another WireGuard key)" % record.vpn_ip)
        self.peer_access.claim_disk_uuid(disk_uuid, record.vpn_ip, record.vpn_pub_key, "ActivateAdditionalNodes")
        designated = False
        if control_plane and node_records.load_control_plane(self.context.store, record.vpn_ip) != record.vpn_pub_key:
            node_records.save_control_plane(self.context.store, record.vpn_ip, record.vpn_pub_key)
            self.context.log("control_plane_designated", node_vpn_ip=record.vpn_ip)
            designated = True
        if current is not None and current.public_ip == record.public_ip:
            return known is None or designated
        self.registry.add_node_peer(record.vpn_ip, record.vpn_pub_key, public_ip)
        return True

    def node_state_disk_key(self, vpn_ip: str) -> bytes:
        """GetStateDiskKey: the disk key of the node at ``vpn_ip`` (the WireGuard tunnel
        authenticates that address), for the disk UUID recorded at its activation, and only while it
        is a peer."""
        kms = self.context.require_coordinator("GetStateDiskKey")
        if not self.registry.is_known_peer_ip(vpn_ip):
            raise StateError("GetStateDiskKey: %s is not a peer of this cluster" % vpn_ip)
        disk_uuid = node_records.load_node_disk_uuid(self.context.store, vpn_ip)
        if disk_uuid is None:
            raise StateError("GetStateDiskKey: no activation of %s is recorded" % vpn_ip)
        self.context.log("state_disk_key", node_vpn_ip=vpn_ip)
        return kms_mod.state_disk_key(kms, disk_uuid)


def _parse_node_names(node_names: Any, endpoints: Sequence[str]) -> Dict[str, str]:
    """``node_names`` checked: a mapping of some of ``endpoints`` to distinct node names."""
    if node_names is None:
        return {}
    if not isinstance(node_names, dict):
        raise InputError("node_names", "a mapping of node_public_endpoints to node names", type(node_names).__name__)
    unknown = sorted(set(node_names) - set(endpoints))
    if unknown:
        raise InputError("node_names", "keys among node_public_endpoints", unknown[:8])
    names = {endpoint: parse_node_name(name, "node_names[%s]" % endpoint) for endpoint, name in node_names.items()}
    twice = sorted({name for name in names.values() if list(names.values()).count(name) > 1})
    if twice:
        raise InputError("node_names", "a distinct name per node", twice[:8])
    return names
