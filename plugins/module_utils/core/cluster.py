# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Several Coordinators on one etcd cluster (docs/store.md, "Several Coordinators").

A Coordinator whose agent runs an etcd member (``etcd_member``: the port ``ClusterStoreMember``) keeps
the cluster's state (peer registry, disk UUIDs, evictions, Kubernetes bindings) in etcd and only its
own (node state, KMS settings) in its local store:

* the first Coordinator starts a cluster of one when it is activated and moves the cluster's keys there;
* a further Coordinator is activated by a running one, in the chain of trust
  (``ActivateAsAdditionalCoordinator``): the activating Coordinator has verified its attestation (fresh
  PCR 15); the new one takes the node lock and answers its disk UUID and WireGuard key; the activating one
  records it as a Coordinator peer (WireGuard tunnel) and adds its etcd member as a learner (the
  majority does not change yet), then sends the KMS URI and the initial cluster; the new one checks that
  the KMS derives the cluster ID, starts its member; the activating one promotes it to a voting member
  once it caught up; the new one opens the shared state and serves;
* every Coordinator follows the registry (``sync_coordinator_peers``): WireGuard peers, and its
  fellow Coordinators kept locally so that after a restart it can reach the others' members first;
* the agent's loop starts a member that died again (core/shared_store.py); GetState reports it.

``Cluster`` holds the peer's ``PeerContext`` and, through the Protocols below, the Coordinator's
registry (core/coordinator.py) and signatures (core/signing.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Protocol, Sequence

from ansible_collections.constellation.cluster.plugins.module_utils import kms as kms_mod
from ansible_collections.constellation.cluster.plugins.module_utils.encoding import parse_endpoint
from ansible_collections.constellation.cluster.plugins.module_utils.core.records import node_records, state_store
from ansible_collections.constellation.cluster.plugins.module_utils.core.inputs import b64, b64d, normalize_disk_uuid, open_kms
from ansible_collections.constellation.cluster.plugins.module_utils.core.records.node_state import NodeState
from ansible_collections.constellation.cluster.plugins.module_utils.core.ports import ConnectNode, NodeClient
from ansible_collections.constellation.cluster.plugins.module_utils.core.records.tickets import (
    NodeActivationRequest,
    NodeActivationStep,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.state import ROLE_COORDINATOR, State
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    ConstellationError,
    InputError,
    StateError,
)
from ansible_collections.constellation.cluster.plugins.module_utils.kms.init_secret import (
    check_node_proof,
    parse_init_secret,
)
from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd_argv import initial_cluster
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import (
    generate_priv_key,
    pub_key_from_priv_key,
)

if TYPE_CHECKING:  # pragma: no cover
    from ansible_collections.constellation.cluster.plugins.module_utils.core.context import PeerContext

METHOD = "ActivateAsAdditionalCoordinator"


class Registry(Protocol):
    """The activating Coordinator's peer registry (core/coordinator.py ``Coordinator``)."""

    def membership(self, client: NodeClient) -> str:
        """'fresh', 'ours' or 'other' (PCR 15)."""

    def node_activation_request(self, node_vpn_ip: str) -> NodeActivationRequest:
        """The cluster's identity and peers for the peer at ``node_vpn_ip``."""

    def init_proof_for(self, public_ip: str) -> Dict[str, Any]:
        """The ``init_proof`` field for the peer at ``public_ip``."""

    def add_node_peer(self, vpn_ip: str, vpn_pub_key: str, public_ip: str, role: str = "node") -> int:
        """Records a peer."""

    def remove_peer(self, vpn_ip: str) -> int:
        """Removes a peer."""

    def release_node_ip(self, vpn_ip: str) -> None:
        """Frees a reserved IP."""

    def apply_registry_peers(self) -> bool:
        """Our WireGuard peers become the registry's."""


class CoordinatorAuth(Protocol):
    """Proves the Coordinators' key to a peer (core/signing.py ``Signing``)."""

    def authenticate_as_coordinator(self, client: Any) -> None:
        """AdminAuth role coordinator on ``client``."""


class Cluster:
    """Further Coordinators on the shared etcd cluster, over the peer's ``PeerContext``."""

    def __init__(self, context: PeerContext, registry: Registry, signing: CoordinatorAuth):
        self.context = context
        self.registry = registry
        self.signing = signing
        self._pending_coordinator: Any = None  # an ActivateAsAdditionalCoordinator under way
        self._pending_priv_key: Any = None
        self._synced_version: Any = None  # the registry version whose peers WireGuard has

    def sync_coordinator_peers(self) -> bool:
        """A Coordinator on a shared etcd: makes its WireGuard peers those of the registry (another
        Coordinator may have added or removed some) and keeps its fellow Coordinators locally. True if
        anything changed."""
        if self.context.etcd_member is None or self.context.state != State.ACTIVATING_NODES:
            return False
        registry = self.context.peer_registry.current()
        if registry is None or registry.peers.version == self._synced_version:
            return False  # nothing committed since the last sync: no `wg` call
        records = list(registry.peers.peers.values())
        changed = self.registry.apply_registry_peers()
        fellows = tuple(p for p in records if p.role == ROLE_COORDINATOR and p.vpn_ip != self.context.vpn_ip)
        if fellows != tuple(self.context.stored_node().peers or ()):
            self.context.save_node(peers=fellows)
            changed = True
        self._synced_version = registry.peers.version
        return bool(changed)

    # -- the activating Coordinator's side
    def activate_coordinators(self, endpoints: Sequence[str], connect_node: ConnectNode) -> List[Dict[str, Any]]:
        """Activates the Coordinators at ``endpoints`` one after another (etcd adds one member at a time)."""
        self.context.require_coordinator("ActivateAdditionalNodes")
        if not self.context.shares_state():
            raise StateError("ActivateAdditionalNodes: this Coordinator keeps the cluster's state in its local store "
                             "(it runs no etcd member, agent config etcd_member, or was activated without one), so "
                             "no other Coordinator can share it")
        for index, endpoint in enumerate(endpoints):
            parse_endpoint(endpoint, "coordinator_public_endpoints[%d]" % index)
        return [self.activate_coordinator(endpoint, connect_node) for endpoint in endpoints]

    def activate_coordinator(self, endpoint: str, connect_node: ConnectNode) -> Dict[str, Any]:
        host, _port = parse_endpoint(endpoint)
        row: Dict[str, Any] = {"node_public_endpoint": endpoint, "role": ROLE_COORDINATOR, "ok": False,
                               "node_vpn_ip": None, "error": None, "action": None}
        vpn_ip = None
        added: Dict[str, Any] = {}
        try:
            with connect_node(endpoint) as client:
                membership = self.registry.membership(client)
                if membership == "ours":
                    return self._known_coordinator(client, endpoint, row)
                if membership != "fresh":
                    raise StateError("%s is locked to another cluster (PCR 15)" % endpoint)
                vpn_ip = self.context.peer_registry.update(lambda r: r.reserve(ROLE_COORDINATOR))
                request = self.registry.node_activation_request(vpn_ip)

                def record_then_secrets(disk_uuid: str, vpn_pub_key: str) -> Dict[str, Any]:
                    node_records.save_node_disk_uuid(self.context.store, vpn_ip, normalize_disk_uuid(disk_uuid))
                    self.registry.add_node_peer(vpn_ip, vpn_pub_key, host, role=ROLE_COORDINATOR)
                    added["peer"] = True
                    peer_url = self.context.etcd_member.peer_url(vpn_ip)
                    added["member"] = self.context.store.member_add(peer_url, learner=True)
                    secrets = {"etcd_initial_cluster": initial_cluster(
                        self.context.store.member_list(), self.context.etcd_member.member_name(vpn_ip), peer_url)}
                    secrets.update(state_store.load_kms_data(self.context.local_store) or {})
                    if self.context.init_secret is not None:
                        secrets["init_secret"] = b64(self.context.init_secret)
                    self.context.log("coordinator_member_added", coordinator=endpoint, coordinator_vpn_ip=vpn_ip)
                    return {k: v for k, v in secrets.items() if v}

                def promote() -> None:
                    self.context.store.member_promote(added["member"])

                result = client.activate_as_additional_coordinator(
                    dict(request.to_dict(), **self.registry.init_proof_for(host)), record_then_secrets, promote)
            row.update(ok=True, node_vpn_ip=vpn_ip, state_disk_uuid=result.get("state_disk_uuid"), action="activated")
            self.context.log("coordinator_activated", coordinator=endpoint, coordinator_vpn_ip=vpn_ip)
        except (ConstellationError, OSError) as err:
            row["error"] = (str(err) or type(err).__name__) + self._undo_coordinator(vpn_ip, added)
            self.context.log("coordinator_activation_failed", coordinator=endpoint, error=row["error"][:300])
        return row

    def _undo_coordinator(self, vpn_ip: Any, added: Mapping[str, Any]) -> str:
        """After a failed activation: the learner member leaves (the majority never counted it), the peer
        entry and its IP go; the new peer holds the node lock if it got that far and must be reset."""
        notes = []
        try:
            if "member" in added:
                self.context.store.member_remove(added["member"])
            if added.get("peer"):
                self.registry.remove_peer(vpn_ip)
                notes.append("it holds the node lock: reset it before it is added again")
            elif vpn_ip is not None:
                self.registry.release_node_ip(vpn_ip)
        except ConstellationError as err:
            notes.append("undoing failed too: %s" % err)
        return " (%s)" % "; ".join(notes) if notes else ""

    def _known_coordinator(self, client: Any, endpoint: str, row: Dict[str, Any]) -> Dict[str, Any]:
        self.signing.authenticate_as_coordinator(client)  # a Coordinator of ours derives the same key
        state = client.get_state()
        registry = self.context.peer_registry.current()
        record = registry.peers.get(state.get("vpn_ip") or "") if registry is not None else None
        if state.get("role") != ROLE_COORDINATOR or record is None or record.vpn_pub_key != state.get("vpn_pub_key"):
            raise StateError("%s holds our node lock but is not one of our Coordinators (%s): reset it and add it "
                             "again" % (endpoint, state.get("state")))
        row.update(ok=True, node_vpn_ip=record.vpn_ip, state_disk_uuid=state.get("state_disk_uuid"), action="none")
        return row

    # -- the new Coordinator's side
    def activate_as_additional_coordinator_begin(self, params: Mapping[str, Any]) -> NodeActivationStep:
        """First step: the node lock, WireGuard up with the activating Coordinator as peer; answers our
        disk UUID and WireGuard key. Nothing secret has reached us yet."""
        self.context.require_state(METHOD, State.ACCEPTING_INIT)
        if self.context.recovery_pending:
            raise StateError("%s: this node holds a cluster's state and waits for Recover" % METHOD)
        if self.context.etcd_member is None:
            raise StateError("%s: this agent runs no etcd member (agent config etcd_member)" % METHOD)
        request = NodeActivationRequest.from_dict(params)
        check_node_proof(request.init_proof, self.context.init_secret_hash, METHOD)
        self._pending_coordinator = request = request.without_proof()
        priv_key = generate_priv_key()
        self.context.take_lock(request.cluster_id, METHOD)
        self.context.log("node_lock", role=ROLE_COORDINATOR, pcr=15)
        try:
            self._pending_priv_key = priv_key
            self.context.vpn.setup(request.node_vpn_ip, priv_key, request.cluster_pod_cidr)
            self.context.vpn.set_peers(list(request.peers), pub_key_from_priv_key(priv_key))
        except BaseException as err:
            self.abort_coordinator_activation(err)
            raise
        return NodeActivationStep(self.context.disk_uuid, pub_key_from_priv_key(priv_key))

    def activate_as_additional_coordinator_join(self, secrets: Mapping[str, Any]) -> None:
        """Second step: the KMS URI (it must derive our cluster ID) and the etcd cluster to join; starts
        our member (a learner until the activating Coordinator promotes it)."""
        request = self._pending_request()
        if not isinstance(secrets, Mapping):
            raise InputError("secrets", "a mapping", type(secrets).__name__)
        kms = open_kms(secrets.get("kms_uri"))
        if kms_mod.cluster_id(kms, request.measurement_salt) != request.cluster_id:
            raise StateError("%s: the KMS URI does not derive this cluster's ID" % METHOD)
        members = secrets.get("etcd_initial_cluster")
        if not isinstance(members, str) or "=" not in members:
            raise InputError("etcd_initial_cluster", "name=peer_url,... of the etcd cluster", members)
        init_secret = secrets.get("init_secret")
        storage_uri = secrets.get("storage_uri") or kms_mod.NO_STORE_URI
        kms_mod.parse_storage_uri(storage_uri)
        state_store.save_kms_data(self.context.local_store, {"kms_uri": secrets["kms_uri"], "storage_uri": storage_uri})
        if init_secret is not None:
            self.context.init_secret = parse_init_secret(b64d(init_secret, "init_secret", 32))
            state_store.save_init_secret(self.context.local_store, self.context.init_secret)
        self.context.kms = kms
        self.context.etcd_member.start(request.node_vpn_ip, kms, members)

    def activate_as_additional_coordinator_finish(self) -> Dict[str, Any]:
        """Last step, once our member votes: the shared state, our WireGuard peers, our node state."""
        request = self._pending_request()
        self.context.switch_to(self.context.etcd_member.open_store(request.node_vpn_ip))
        registry = self.context.peer_registry.reload()
        own = registry.peers.get(request.node_vpn_ip) if registry is not None else None
        pub_key = pub_key_from_priv_key(self._pending_priv_key)
        if own is None or own.vpn_pub_key != pub_key or own.role != ROLE_COORDINATOR:
            raise StateError("%s: the cluster's registry does not list this Coordinator" % METHOD)
        self.context.set_role(ROLE_COORDINATOR)
        records = list(registry.peers.peers.values())
        self.context.vpn.set_peers(records, pub_key)
        self.context.save_node(NodeState(
            role=ROLE_COORDINATOR, vpn_ip=request.node_vpn_ip, vpn_priv_key=self._pending_priv_key,
            cluster_id=request.cluster_id, measurement_salt=request.measurement_salt,
            admin_pub_key=request.admin_pub_key, coordinator_vpn_ip=request.node_vpn_ip, disk_uuid=self.context.disk_uuid,
            peers=tuple(p for p in records if p.role == ROLE_COORDINATOR and p.vpn_ip != request.node_vpn_ip),
            state=int(State.ACTIVATING_NODES), cluster_pod_cidr=request.cluster_pod_cidr, pod_cidr=own.pod_cidr))
        self.context.keep_disk_key(kms_mod.state_disk_key(self.context.kms, self.context.disk_uuid))
        self._pending_coordinator = None
        self.context.advance(State.ACTIVATING_NODES)
        self.context.log("coordinator_joined", coordinator_vpn_ip=request.node_vpn_ip)
        return {"state": self.context.state.wire_name, "coordinator_vpn_ip": request.node_vpn_ip,
                "state_disk_uuid": self.context.disk_uuid}

    def abort_coordinator_activation(self, err: BaseException, voting: bool = False) -> None:
        """The activation did not finish: this peer fails (it holds the lock). A learner member stops; a
        voting one keeps running (stopping it could cost the cluster its majority) until the activating
        Coordinator removes it, which ends it."""
        if self.context.etcd_member is not None and not voting:
            self.context.etcd_member.stop()
        self._pending_coordinator = None
        if self.context.state != State.ACTIVATING_NODES:
            self.context.fail(METHOD, err)

    def _pending_request(self) -> NodeActivationRequest:
        request = self._pending_coordinator
        if request is None:
            raise StateError("%s: no activation as Coordinator is under way" % METHOD)
        return request
