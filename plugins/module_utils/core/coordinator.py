# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One Coordinator's duties (``Coordinator``): activation as Coordinator, the peer registry and the peer
updates of the vpnapi (its join service: core/join_service.py). Its collaborators come in through the small
Protocols below: the shared store (core/shared_store.py), disk UUID ownership (core/registry/peer_access.py) and the
Coordinators' signatures (core/signing.py)."""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Protocol

from ansible_collections.constellation.cluster.plugins.module_utils import kms as kms_mod
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import expected_pcr15
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import membership_without_pcrs
from ansible_collections.constellation.cluster.plugins.module_utils.constants import NODE_POD_CIDR_MASK_SIZE, PCR_INDEX_CLUSTER_ID
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.pod_cidrs import parse_cluster_pod_cidr
from ansible_collections.constellation.cluster.plugins.module_utils.core.records import state_store
from ansible_collections.constellation.cluster.plugins.module_utils.core.inputs import (
    b64,
    open_kms,
    parse_admin_pub_key,
    parse_measurement_salt,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.records.node_state import NodeState
from ansible_collections.constellation.cluster.plugins.module_utils.kms.init_secret import (
    check_node_proof,
    node_init_secret,
    parse_init_secret,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.ports import (
    KMS,
    NodeClient,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.records.tickets import (
    CoordinatorActivation,
    NodeActivationRequest,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.state import ROLE_COORDINATOR, State
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    AttestationError,
    ConnectionLost,
    ConstellationError,
    InputError,
    StateError,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_record import PeerRecord
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_set import PeerRegistry
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import (
    VPN_CIDR,
    generate_priv_key,
    pub_key_from_priv_key,
)

if TYPE_CHECKING:  # pragma: no cover
    from ansible_collections.constellation.cluster.plugins.module_utils.core.context import PeerContext


class SharedStoreStart(Protocol):
    """The first Coordinator starts its etcd member, if it runs one (core/shared_store.py ``SharedStore``)."""

    def start_first(self, vpn_ip: str, kms: KMS) -> None:
        """Starts a new etcd cluster of one and moves the cluster's keys there; nothing without a member."""


class DiskClaim(Protocol):
    """Who owns a disk UUID (core/registry/peer_access.py ``PeerAccess``)."""

    def claim_disk_uuid(self, disk_uuid: str, vpn_ip: str, vpn_pub_key: str, method: str) -> None:
        """Records the owner, or AccessDenied if another peer holds it."""


class Signatures(Protocol):
    """The Coordinators' signatures (core/signing.py ``Signing``)."""

    def coordinator_pub_key(self) -> str:
        """The key Nodes pin."""

    def signed_update(self, peer_set: Any, resource_version: int, cluster_pod_cidr: Optional[str] = None) -> dict:
        """GetUpdate's answer, signed when there is anything to apply (the pod range with it)."""


class Coordinator:
    """One Coordinator's duties over the peer's ``PeerContext``."""

    def __init__(self, context: PeerContext, shared_store: SharedStoreStart, peer_access: DiskClaim, signing: Signatures):
        self.context = context
        self.shared_store = shared_store
        self.peer_access = peer_access
        self.signing = signing

    # -- activation as Coordinator
    def activate_as_coordinator(self, kms_uri: str, measurement_salt: Any, admin_pub_key: str,
                                storage_uri: Optional[str] = None,
                                cluster_config: Optional[Mapping[str, Any]] = None,
                                init_secret: Optional[bytes] = None) -> CoordinatorActivation:
        method = "ActivateAsCoordinator"
        ctx = self.context
        ctx.require_state(method, State.ACCEPTING_INIT)
        if ctx.recovery_pending:
            raise StateError("%s: this node holds a cluster's state and waits for Recover" % method)
        # No hijacking a fresh node: the cluster's init secret must derive this node's (init_secret.py),
        # checked before anything else is parsed and before the node lock.
        secret = parse_init_secret(init_secret) if init_secret is not None else None
        check_node_proof(node_init_secret(secret, ctx.public_ip) if secret is not None else None,
                         ctx.init_secret_hash, method)
        # All input is checked before the point of no return.
        kms = open_kms(kms_uri)
        storage_uri = storage_uri or kms_mod.NO_STORE_URI
        kms_mod.parse_storage_uri(storage_uri)
        salt = parse_measurement_salt(measurement_salt)
        parse_admin_pub_key(admin_pub_key)
        config = dict(cluster_config or {})
        unknown = set(config) - {"cluster_name", "vpn_cidr", "cluster_pod_cidr", "node_pod_cidr_mask_size"}
        if unknown:
            raise InputError("cluster_config", "only cluster_name, vpn_cidr, cluster_pod_cidr and node_pod_cidr_mask_size",
                             sorted(unknown))
        vpn_cidr = config.get("vpn_cidr", VPN_CIDR)
        # The pod network (docs/wireguard.md, "Pod CIDRs"): without cluster_pod_cidr, no peer gets a pod CIDR.
        pod_range = None
        if config.get("cluster_pod_cidr"):
            mask = config.get("node_pod_cidr_mask_size", NODE_POD_CIDR_MASK_SIZE)
            net, mask = parse_cluster_pod_cidr(config["cluster_pod_cidr"], mask, vpn_cidr, "cluster_config.")
            pod_range = (str(net), mask)
        if vpn_cidr != getattr(ctx.vpn, "vpn_cidr", VPN_CIDR):
            raise InputError("cluster_config.vpn_cidr", "the agent's VPN CIDR %s" % getattr(ctx.vpn, "vpn_cidr", VPN_CIDR),
                             vpn_cidr)
        cluster_id = kms_mod.cluster_id(kms, salt)
        ctx.take_lock(cluster_id, method)
        ctx.log("node_lock", role=ROLE_COORDINATOR, pcr=15)
        try:
            priv_key = generate_priv_key()
            pub_key = pub_key_from_priv_key(priv_key)

            def add_self(registry):
                if pod_range is not None:
                    registry.use_pod_cidrs(*pod_range)
                return registry.add(pub_key, ctx.public_ip, "coordinator")

            record = ctx.peer_registry.update(add_self, vpn_cidr)
            cluster_pod_cidr = pod_range[0] if pod_range is not None else None
            self.peer_access.claim_disk_uuid(ctx.disk_uuid, record.vpn_ip, pub_key, method)  # no node may name ours
            state_store.save_kms_data(ctx.local_store, {"kms_uri": kms_uri, "storage_uri": storage_uri})
            if secret is not None:
                state_store.save_init_secret(ctx.local_store, secret)  # to prove itself to the nodes it activates
                ctx.init_secret = secret
            ctx.kms = kms
            ctx.set_role(ROLE_COORDINATOR)
            ctx.vpn.setup(record.vpn_ip, priv_key, cluster_pod_cidr)
            self.shared_store.start_first(record.vpn_ip, kms)
            ctx.save_node(NodeState(role=ROLE_COORDINATOR, vpn_ip=record.vpn_ip, vpn_priv_key=priv_key,
                                    cluster_id=cluster_id, measurement_salt=salt, admin_pub_key=admin_pub_key,
                                    coordinator_vpn_ip=record.vpn_ip, cluster_name=str(config.get("cluster_name", "")),
                                    disk_uuid=ctx.disk_uuid, state=int(State.ACTIVATING_NODES),
                                    cluster_pod_cidr=cluster_pod_cidr, pod_cidr=record.pod_cidr))
            ctx.keep_disk_key(kms_mod.state_disk_key(kms, ctx.disk_uuid))
            ctx.advance(State.ACTIVATING_NODES)
        except BaseException as err:
            ctx.fail(method, err)
            raise
        return CoordinatorActivation(cluster_id, record.vpn_ip, pub_key, ctx.state.wire_name, cluster_pod_cidr,
                                     record.pod_cidr)

    def require_coordinator(self, method: str) -> KMS:
        """The guard of every Coordinator request (the servers call it first): this peer is an activated
        Coordinator (``PeerContext.require_coordinator``); its KMS, or StateError."""
        return self.context.require_coordinator(method)

    # -- the peer registry
    def reserve_node_ip(self) -> str:
        self.context.require_coordinator("ActivateAdditionalNodes")
        return self.context.peer_registry.update(lambda r: r.reserve("node"))  # and its pod CIDR

    def release_node_ip(self, vpn_ip: str) -> None:
        """Frees a reserved VPN IP (and pod CIDR) whose node was not recorded."""
        self.context.peer_registry.update(lambda r: r.release_reserved(vpn_ip))

    def node_activation_request(self, node_vpn_ip: str) -> NodeActivationRequest:
        self.context.require_coordinator("ActivateAdditionalNodes")
        registry = self.context.peer_registry.current()
        if registry is None:
            raise StateError("this Coordinator has no peer registry")
        node = self.context.stored_node()
        pod_cidr = registry.pod_cidr_of(node_vpn_ip)
        return NodeActivationRequest(node_vpn_ip, tuple(registry.peers.peers.values()), node.cluster_id,
                                     node.measurement_salt, node.admin_pub_key, node.vpn_ip, coordinator_pub_key=self.signing.coordinator_pub_key(),
                                     node_pod_cidr=pod_cidr,
                                     cluster_pod_cidr=str(registry.pod_cidrs.cidr) if pod_cidr is not None else None)

    def init_proof_for(self, public_ip: str) -> Dict[str, Any]:
        """The ``init_proof`` field for the node at ``public_ip`` (init_secret.py); empty when this
        Coordinator was activated without an init secret."""
        if self.context.init_secret is None:
            return {}
        return {"init_proof": b64(node_init_secret(self.context.init_secret, public_ip))}

    def state_disk_key(self, disk_uuid: str) -> bytes:
        return kms_mod.state_disk_key(self.context.require_coordinator("state disk key"), disk_uuid)

    def add_node_peer(self, vpn_ip: str, vpn_pub_key: str, public_ip: str, role: str = "node") -> int:
        """Records an activated node (or Coordinator: ``role``) at its reserved IP and adds it to our
        WireGuard peers."""
        self.context.require_coordinator("add node")
        record = PeerRecord.parse(vpn_ip, vpn_pub_key, public_ip, role)

        version = self.context.peer_registry.update(lambda registry: registry.put_node(record))  # with its pod CIDR
        self.apply_registry_peers()
        self.context.log("peer_added", vpn_ip=vpn_ip, public_ip=public_ip, resource_version=version)
        return version

    def remove_peer(self, vpn_ip: str) -> int:
        self.context.require_coordinator("remove peer")

        def remove(registry):
            registry.remove(vpn_ip)
            return registry.peers.version

        version = self.context.peer_registry.update(remove)
        self.apply_registry_peers()
        return version

    def apply_registry_peers(self) -> bool:
        """Makes our WireGuard peers those of the newest committed registry; True if any changed.
        Serialised, and reading the registry under the same lock: of two threads that each committed a
        change, the one that applies last applies the newer list (applying each thread's own snapshot
        could leave the older one in place, without the other's peer)."""
        with self.context.peers_apply_lock:
            registry = self.context.peer_registry.current()
            if registry is None:
                return False
            changed = self.context.vpn.set_peers(list(registry.peers.peers.values()), self.context.vpn_pub_key)
            return self._own_pod_network(registry) or changed

    def _own_pod_network(self, registry: Any) -> bool:
        """This Coordinator's own pod CIDR and the cluster's range, as the registry has them: kept in its node state
        and the range routed into wg0 (a Coordinator activated before the cluster had pod CIDRs, or a further
        Coordinator that sees another one turn them on). True if anything changed."""
        node = self.context.node
        if registry.pod_cidrs is None or node is None:
            return False
        own = registry.peers.get(node.vpn_ip)
        pod_cidr, cluster = (own.pod_cidr if own is not None else None), str(registry.pod_cidrs.cidr)
        if pod_cidr is None or (pod_cidr, cluster) == (node.pod_cidr, node.cluster_pod_cidr):
            return False
        if cluster != node.cluster_pod_cidr:
            self.context.vpn.setup(node.vpn_ip, node.vpn_priv_key, cluster)
        self.context.save_node(pod_cidr=pod_cidr, cluster_pod_cidr=cluster)
        self.context.log("pod_cidr_learnt", pod_cidr=pod_cidr, cluster_pod_cidr=cluster)
        return True

    def use_pod_cidrs(self, cluster_pod_cidr: Any, node_pod_cidr_mask_size: Any = NODE_POD_CIDR_MASK_SIZE,
                      check: bool = False) -> Dict[str, Any]:
        """UsePodCIDRs (the admin, ``activate_coordinator`` on an activated Coordinator): turns the pod network on for
        a cluster activated without it; every Coordinator and Node gets a block in one new peer set version, which
        the Nodes take with their next update. The same range again changes nothing; another one is refused
        (``PeerRegistry.use_pod_cidrs``). ``check``: only reports."""
        method = "UsePodCIDRs"
        ctx = self.context
        ctx.require_coordinator(method)
        net, mask = parse_cluster_pod_cidr(cluster_pod_cidr, node_pod_cidr_mask_size,
                                           getattr(ctx.vpn, "vpn_cidr", VPN_CIDR))
        current = ctx.peer_registry.current()
        if current is None:
            raise StateError("%s: this Coordinator has no peer registry" % method)
        if check:
            updated = PeerRegistry.from_dict(current.to_dict()).use_pod_cidrs(str(net), mask)
            version = current.peers.version
        else:
            updated = ctx.peer_registry.update(lambda registry: registry.use_pod_cidrs(str(net), mask))
            version = ctx.peer_registry.current().peers.version
            self.apply_registry_peers()
            if updated:
                ctx.log("pod_cidrs_allocated", cluster_pod_cidr=str(net), peers=len(updated), resource_version=version)
        own = next((r.pod_cidr for r in updated if r.vpn_ip == ctx.vpn_ip), None) or ctx.stored_node().pod_cidr
        return {"changed": bool(updated), "cluster_pod_cidr": str(net), "coordinator_pod_cidr": own,
                "allocated": [{"vpn_ip": r.vpn_ip, "pod_cidr": r.pod_cidr} for r in updated],
                "resource_version": version}

    def membership(self, client: NodeClient) -> str:
        """'fresh', 'ours' or 'other', from PCR 15 of the peer's verified attestation. A peer whose variant quotes
        no PCRs (sev-snp: an attested connection without any) answers for itself on that connection
        (attestation/policy.py ``membership_without_pcrs``): its GetState, then whether it accepts the
        Coordinators' key (which unlocks its details on this connection, as the resume path needs anyway)."""
        pcrs = client.attested_pcrs()
        if not pcrs and getattr(client, "attested", None) is not None:
            state = client.get_state().get("state")
            accepted = None
            if state != State.ACCEPTING_INIT.wire_name:
                try:
                    self.signing.authenticate_as_coordinator(client)
                    accepted = True
                except ConnectionLost:
                    raise
                except ConstellationError:  # refused: the peer pinned another cluster's key, or none
                    accepted = False
            return membership_without_pcrs(state, accepted)
        pcr15 = pcrs.get(PCR_INDEX_CLUSTER_ID)
        if not isinstance(pcr15, bytes):
            raise AttestationError("the node's attestation does not cover PCR %d" % PCR_INDEX_CLUSTER_ID)
        if pcr15 == bytes(len(pcr15)):
            return "fresh"
        if hmac.compare_digest(pcr15, expected_pcr15(self.context.stored_node().cluster_id)):
            return "ours"
        return "other"

    # -- vpnapi
    def is_known_peer_ip(self, ip: str) -> bool:
        # From memory (peer_cache.py): the vpnapi asks this for every connection.
        return self.context.peer_registry.is_known_peer_ip(ip)

    def get_update(self, resource_version: Any) -> Dict[str, Any]:
        self.context.require_coordinator("GetUpdate")
        if not isinstance(resource_version, int) or isinstance(resource_version, bool):
            raise InputError("resource_version", "an integer", type(resource_version).__name__)
        registry = self.context.peer_registry.current()  # from memory: no store access per poll
        if registry is None:
            raise StateError("GetUpdate: this Coordinator has no peer registry")
        if resource_version > registry.peers.version:
            registry = self._continue_above(resource_version, registry.peers.version)
        pod_range = str(registry.pod_cidrs.cidr) if registry.pod_cidrs is not None else None
        return self.signing.signed_update(registry.peers, resource_version, pod_range)  # core/signing.py

    def _continue_above(self, resource_version: int, version: int) -> Any:
        """A Node holds a newer peer set than this Coordinator: a Coordinator restored from an older backup, or
        (several Coordinators) a registry this process has not read again yet. Nodes refuse an older set
        (core/node.py), so the stored set continues at ``resource_version + 1`` with the same peers; when the
        store already holds that version (this process had not read it again), nothing changes. The registry as
        committed."""
        committed = []

        def step(registry):
            before = registry.peers.version
            after = registry.peers.continue_above(resource_version) if resource_version > before else before
            committed[:] = [before, after]
            return registry

        registry = self.context.peer_registry.update(step)
        if committed[1] != committed[0]:
            self.context.log("peer_version_continued", level="warning", resource_version=committed[1],
                             previous_resource_version=version, node_resource_version=resource_version)
        return registry

    def peer_version(self) -> Optional[int]:
        """The peer set's version now (from memory), None without a registry."""
        registry = self.context.peer_registry.current()
        return registry.peers.version if registry is not None else None

    def wait_for_update(self, resource_version: int, timeout: float) -> None:
        """A long poll's wait (vpnapi GetUpdate ``wait``): returns once the peer set's version is not
        ``resource_version`` (a change, an eviction), or after ``timeout`` seconds."""
        self.context.peer_registry.wait_for_change(resource_version, timeout)
