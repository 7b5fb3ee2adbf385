# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a peer says about itself (``Status``): GetState's answers and the Coordinators' key it trusts.
Composed explicitly from who knows each part: the ``PeerContext`` (state, role, VPN identity, disk, agent
measurement, secrets at rest), the etcd member (core/shared_store.py: ``etcd_member``) and the evictions
(core/eviction/evictions.py: ``evicted``, on an activated Coordinator)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional, Protocol

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import deployment
from ansible_collections.constellation.cluster.plugins.module_utils.core.removal import removed_peers
from ansible_collections.constellation.cluster.plugins.module_utils.core.state import ROLE_COORDINATOR, State
from ansible_collections.constellation.cluster.plugins.module_utils.disk.state_disk import NOT_ENCRYPTED
from ansible_collections.constellation.cluster.plugins.module_utils.store import StoreError

if TYPE_CHECKING:  # pragma: no cover
    from ansible_collections.constellation.cluster.plugins.module_utils.core.context import PeerContext


class MemberState(Protocol):
    """The etcd member's GetState field (core/shared_store.py ``SharedStore``)."""

    def state_fields(self) -> Dict[str, Any]:
        """``{"etcd_member": ...}`` for a Coordinator that shares the state in etcd, else ``{}``."""


class EvictedPeers(Protocol):
    """The evicted peers (core/eviction/evictions.py ``Evictions``)."""

    @property
    def evicted(self) -> Dict[str, dict]:
        """The evictions by VPN IP."""


class CoordinatorKey(Protocol):
    """The Coordinators' key from this Coordinator's KMS (core/signing.py ``Signing``)."""

    def coordinator_pub_key(self) -> str:
        """The key Nodes pin."""


class JoinConsent(Protocol):
    """How this Coordinator consents to joins (core/admissions.py ``Admissions``)."""

    def state_fields(self) -> Dict[str, Any]:
        """``{join_admission}``."""


class Status:
    """GetState over the peer's ``PeerContext``."""

    def __init__(self, context: PeerContext, shared_store: MemberState, evictions: EvictedPeers, signing: CoordinatorKey,
                 admissions: Optional[JoinConsent] = None):
        self.context = context
        self.admissions = admissions
        self.shared_store = shared_store
        self.evictions = evictions
        self.signing = signing

    def public_state(self) -> Dict[str, Any]:
        """What GetState tells anyone: state and role only (least disclosure). The details (``get_state``)
        go only to an authenticated admin or Coordinator (agent/admin.py AdminAuth)."""
        return self.context.public_state()

    def get_state(self) -> Dict[str, Any]:
        """State and role, plus the peer's VPN IP and WireGuard public key once it has them, and its disk
        UUID: for the admin and the Coordinators only (the pubapi answers others ``public_state``)."""
        ctx = self.context
        answer = ctx.public_state()
        node = ctx.node
        active = ctx.state in (State.ACTIVATING_NODES, State.NODE_WAITING_FOR_CLUSTER_JOIN, State.IS_NODE)
        answer["vpn_ip"] = node.vpn_ip if active and node is not None else None
        answer["vpn_pub_key"] = ctx.vpn_pub_key if active and node is not None and node.vpn_priv_key else None
        # The disk UUID reported at activation (what the Coordinator derives this node's disk key for).
        answer["state_disk_uuid"] = (node.disk_uuid or ctx.disk_uuid) if active and node is not None else None
        # The pod network (docs/wireguard.md, "Pod CIDRs"): this peer's own pod CIDR and the range routed into wg0.
        answer["node_pod_cidr"] = node.pod_cidr if active and node is not None else None
        answer["cluster_pod_cidr"] = node.cluster_pod_cidr if active and node is not None else None
        answer["state_disk"] = ctx.state_disk.status() if ctx.state_disk is not None else dict(NOT_ENCRYPTED)
        # What this peer runs (PCR 13's two events, replayable) and whether its secrets at rest are sealed.
        answer["agent_measurement"] = ctx.agent_measurement
        # What the TPM proves against the host's root here (attestation/deployment.py).
        answer["deployment_mode"] = ctx.deployment_mode
        answer["host_root_trusted"] = deployment.host_root_trusted(ctx.deployment_mode)
        # sets: the accepted measurement sets the storage key is sealed to ahead (a host may reboot into any of them).
        answer["secrets_at_rest"] = {"sealed": ctx.at_rest.sealed, "pcrs": list(ctx.at_rest.pcrs),
                                     "sets": list(ctx.at_rest.sealed_sets)}
        answer.update(self.shared_store.state_fields())
        # The peer set's version this Node applied (its floor: it refuses an older one) or this Coordinator holds:
        # restore.yml does not take an older backup than the cluster reached without being told to.
        if ctx.state == State.IS_NODE:
            answer["peer_resource_version"] = ctx.resource_version
        elif ctx.role == ROLE_COORDINATOR and ctx.state == State.ACTIVATING_NODES:
            registry = ctx.peer_registry.current()
            answer["peer_resource_version"] = registry.peers.version if registry is not None else None
        if ctx.role == ROLE_COORDINATOR and ctx.state == State.ACTIVATING_NODES:
            answer["evicted"] = [dict(record) for _ip, record in sorted(self.evictions.evicted.items())]
            # Nodes not re-attested for a while (core/eviction/peer_trust.py): no new secret; evicted after unverified_eviction_after.
            answer["unverified"] = [dict(record) for _ip, record in sorted(self.evictions.unverified.items())]
            if self.admissions is not None:  # how joins are consented to (core/admissions.py)
                answer.update(self.admissions.state_fields())
            # The Nodes the admin removed (core/removal.py): add_nodes.yml refuses them, naming the way back.
            # Read from the store: without its majority (etcd) GetState still answers, without this list.
            try:
                answer["removed"] = [dict(record) for _key, record in sorted(removed_peers(ctx.store).items())]
            except StoreError as err:
                ctx.log("removed_peers_unread", level="warning", error=str(err)[:200])
        return answer

    def pinned_coordinator_pub_key(self) -> Optional[str]:
        """The Coordinators' key this peer trusts: a Node's, pinned at activation (or from its agent config
        when it joined); an activated Coordinator's own, derived from its KMS. None before activation."""
        node = self.context.node
        if node is None:
            return None
        if node.role == ROLE_COORDINATOR:
            return self.signing.coordinator_pub_key() if self.context.kms is not None else None
        return node.coordinator_pub_key
