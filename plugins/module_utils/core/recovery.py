# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A peer that comes back (``Recovery``): start-up (``load``: restore a persisted state after an agent
restart, or AcceptingInit on a fresh node), and recovery of a peer whose TPM was reset (reboot) while its
store holds a cluster's state:

* the Coordinator proves, with the KMS URI from the admin (``Recover``, recover.yml), that the cluster
  is its own, takes the node lock again and resumes;
* a Node never gets the KMS URI: it pulls a rejoin ticket from its Coordinator (``IssueRejoinTicket``
  over aTLS: it verifies the Coordinator, the Coordinator attests it in-band and checks its recorded
  identity) holding only its disk key, the measurement secret and its peers (``rejoin``).

Its collaborators come in through the Protocols below: the etcd member (core/shared_store.py), the
evictions (core/eviction/evictions.py) and GetState's answer (core/status.py)."""

from __future__ import annotations

import hmac
import ipaddress
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Protocol

from ansible_collections.constellation.cluster.plugins.module_utils import kms as kms_mod
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import expected_pcr15
from ansible_collections.constellation.cluster.plugins.module_utils.core.records import state_store
from ansible_collections.constellation.cluster.plugins.module_utils.core import signing
from ansible_collections.constellation.cluster.plugins.module_utils.core.inputs import open_kms
from ansible_collections.constellation.cluster.plugins.module_utils.core.records.node_state import NodeState
from ansible_collections.constellation.cluster.plugins.module_utils.core.records.tickets import RejoinTicket
from ansible_collections.constellation.cluster.plugins.module_utils.core.state import ROLE_COORDINATOR, ROLE_NODE, State
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    REASON_NOT_WAITING_FOR_RECOVERY,
    AccessDenied,
    InputError,
    StateError,
)
from ansible_collections.constellation.cluster.plugins.module_utils.store import StoreError

if TYPE_CHECKING:  # pragma: no cover
    from ansible_collections.constellation.cluster.plugins.module_utils.core.context import PeerContext

# Requests a rejoin ticket: (vpn_ip, vpn_pub_key, disk_uuid, on_ticket) -> the Coordinator's END result;
# ``on_ticket(ticket, binding)``: the ticket as received and the user data our attestation was bound to.
RejoinRequest = Callable[[str, str, str, Callable[[Mapping[str, Any]], None]], Dict[str, Any]]


class MemberReopen(Protocol):
    """A restarted Coordinator's etcd member (core/shared_store.py ``SharedStore``)."""

    def reopen(self, node: NodeState) -> None:
        """Rejoins the etcd cluster from the member's data; nothing without a member."""


class EvictionReload(Protocol):
    """The evicted peers (core/eviction/evictions.py ``Evictions``)."""

    def reload(self) -> None:
        """Reads them from the store."""


class StateReport(Protocol):
    """GetState's detailed answer (core/status.py ``Status``)."""

    def get_state(self) -> Dict[str, Any]:
        """State, role and the peer's details."""


class Recovery:
    """Start-up and recovery over the peer's ``PeerContext``."""

    def __init__(self, context: PeerContext, shared_store: MemberReopen, evictions: EvictionReload, status: StateReport):
        self.context = context
        self.shared_store = shared_store
        self.evictions = evictions
        self.status = status

    # -- start-up
    def load(self) -> State:
        """Restores a persisted state (agent restart) or enters AcceptingInit (fresh node)."""
        ctx = self.context
        raw = state_store.load_node_state(ctx.local_store)
        pcr15 = ctx.tpm.pcr15()
        if raw is None:
            if pcr15 != bytes(32):
                ctx.lock.mark_taken()
                ctx.failure = "PCR 15 is set but no node state is stored: this node must be reset"
                ctx.advance(State.FAILED)
                return ctx.state
            ctx.advance(State.ACCEPTING_INIT)
            return ctx.state
        try:
            node = NodeState.from_dict(raw)
        except InputError as err:
            raise StoreError("the stored node state is invalid: %s" % err) from None
        with ctx.mutex:
            ctx.node = node
            ctx.set_role(node.role)
        if pcr15 == bytes(32) and node.stored_state == State.NODE_WAITING_FOR_CLUSTER_JOIN:
            # The node persisted its activation, then died (or the TPM was reset) before or after the
            # extension; no disk key was ever given to it. Take the lock for the stored cluster again.
            ctx.lock.try_lock_once(node.cluster_id)
            ctx.log("node_lock", role=node.role, pcr=15, via="restart")
            self._resume()
        elif pcr15 == expected_pcr15(node.cluster_id):
            ctx.lock.mark_taken()
            self._resume()
        elif pcr15 == bytes(32):
            # A reboot reset the TPM: wait for Recover (the KMS URI proves who asks).
            ctx.recovery_pending = True
            ctx.advance(State.ACCEPTING_INIT)
        else:
            ctx.lock.mark_taken()
            ctx.failure = "PCR 15 holds another cluster's ID than the stored state"
            ctx.advance(State.FAILED)
        return ctx.state

    def resume(self) -> None:
        """Resumes the stored state now in the store (a restore, core/backup.py): KMS, VPN, registry."""
        self._resume()

    def _resume(self) -> None:
        ctx = self.context
        node = ctx.stored_node()
        if node.role == ROLE_COORDINATOR:
            kms_data = state_store.load_kms_data(ctx.local_store)
            if kms_data is None:
                raise StateError("the store holds a Coordinator state without KMS settings")
            ctx.kms = kms_mod.open_kms(kms_data["kms_uri"])
            ctx.init_secret = state_store.load_init_secret(ctx.local_store)
        ctx.vpn.setup(node.vpn_ip, node.vpn_priv_key, node.cluster_pod_cidr)
        if node.role == ROLE_COORDINATOR:
            self.shared_store.reopen(node)
            self.evictions.reload()
            registry = ctx.peer_registry.reload()
            if registry is not None:
                ctx.vpn.set_peers(list(registry.peers.peers.values()), ctx.vpn_pub_key)
        else:
            ctx.vpn.set_peers(list(node.peers or ()), ctx.vpn_pub_key)
        stored = node.stored_state
        if stored == State.NODE_WAITING_FOR_CLUSTER_JOIN:
            # Locked, but the disk key never came: the agent fetches it from the Coordinator over the VPN
            # (docs/agent.md, "Resumable activation").
            ctx.log("activation_pending", coordinator_vpn_ip=node.coordinator_vpn_ip)
        ctx.advance(stored)

    # -- recovery after a TPM reset
    def _recovering_node(self, method: str, role: str, refusal: str):
        """The stored node record, for ``method`` on a node that waits for recovery in ``role`` (StateError
        otherwise; ``refusal`` tells another role what it does instead)."""
        ctx = self.context
        if not ctx.recovery_pending:
            raise StateError("%s is allowed only on a node whose stored state waits for recovery (PCR 15 reset); "
                             "this node is %s" % (method, ctx.state.wire_name)).with_reason(
                                 REASON_NOT_WAITING_FOR_RECOVERY)
        node = ctx.stored_node()
        if node.role != role:
            raise StateError("%s: %s" % (method, refusal))
        return node

    def recover(self, kms_uri: str) -> Dict[str, Any]:
        ctx = self.context
        method = "Recover"
        # Least secret: only the Coordinator ever holds the KMS URI (docs/agent.md, "Rejoin after a reboot").
        node = self._recovering_node(method, ROLE_COORDINATOR, "a Node does not take the KMS URI; it rejoins with a "
                                                               "ticket from its Coordinator (IssueRejoinTicket), by itself")
        kms = open_kms(kms_uri)
        cluster_id = kms_mod.cluster_id(kms, node.measurement_salt)
        if not hmac.compare_digest(cluster_id, node.cluster_id):
            raise StateError("%s: the KMS URI does not derive this node's cluster ID" % method)
        ctx.take_lock(cluster_id, method)
        try:
            ctx.recovery_pending = False
            self._resume()
        except BaseException as err:
            ctx.fail(method, err)
            raise
        return self.status.get_state()

    def coordinator_public_ip(self) -> Optional[str]:
        """Where a rebooted Node finds its Coordinator: the public IP of the stored peer at its
        ``coordinator_vpn_ip``."""
        ctx = self.context
        node = ctx.node
        if node is None:
            return None
        found = next((p for p in node.peers or () if p.vpn_ip == node.coordinator_vpn_ip), None)
        return found.public_ip if found is not None else None

    def coordinator_public_ips(self) -> List[str]:
        """Where a rebooted Node asks for a rejoin ticket, in turn: its own Coordinator's public IP, then
        those of the other Coordinators it knows (several Coordinators on one etcd cluster)."""
        ctx = self.context
        node = ctx.node
        if node is None:
            return []
        own = self.coordinator_public_ip()
        others = [p.public_ip for p in sorted(node.peers or (), key=lambda p: int(ipaddress.ip_address(p.vpn_ip)))
                  if p.role == ROLE_COORDINATOR and p.public_ip]
        return list(dict.fromkeys(([own] if own else []) + others))

    def coordinator_vpn_ips(self) -> List[str]:
        """Where a Node asks for updates, in turn: its own Coordinator first, then every other peer with
        the Coordinator role it knows from its updates (several Coordinators on one etcd cluster)."""
        ctx = self.context
        node = ctx.node
        if node is None or not node.coordinator_vpn_ip:
            return []
        others = sorted((p.vpn_ip for p in node.peers or ()
                         if p.role == ROLE_COORDINATOR and p.vpn_ip != node.coordinator_vpn_ip),
                        key=lambda a: int(ipaddress.ip_address(a)))
        return [node.coordinator_vpn_ip] + others

    def rejoin(self, request_ticket: RejoinRequest) -> Dict[str, Any]:
        """A rebooted Node: ``request_ticket`` reaches its (verified) Coordinator, which attests us and
        hands over a ``RejoinTicket``; we check it (the measurement secret derives our stored cluster ID,
        the disk key is the one we hold, if we hold one), take the node lock again and resume."""
        ctx = self.context
        method = "Rejoin"
        node = self._recovering_node(method, ROLE_NODE, "only a Node rejoins with a ticket; a Coordinator recovers with "
                                                        "the KMS URI (recover.yml)")
        outcome: Dict[str, Any] = {}

        def on_ticket(data: Mapping[str, Any], binding: Optional[bytes] = None) -> None:
            ticket = RejoinTicket.from_dict(data)
            # The measurement secret is every Node's: only the Coordinators' signature, with the key pinned at
            # our activation and bound to this request and connection, says a Coordinator sent these peers.
            try:
                if binding is None:
                    raise AccessDenied("%s: the ticket is not bound to this connection: refused" % method)
                signing.verify(node.coordinator_pub_key, signing.CONTEXT_REJOIN_TICKET,
                               signing.ticket_payload(ticket.to_dict(), binding), ticket.signature, method + " ticket")
            except AccessDenied as err:
                ctx.log("rejoin_ticket_refused", level="warning", reason=str(err)[:300])
                raise
            derived = kms_mod.derive_cluster_id(ticket.measurement_secret, node.measurement_salt)
            if not hmac.compare_digest(derived, node.cluster_id):
                raise StateError("%s: the ticket's measurement secret does not derive this node's cluster ID" % method)
            held = ctx.read_disk_key()
            if held is not None and not hmac.compare_digest(held, ticket.state_disk_key):
                raise StateError("%s: the ticket's disk key is not this node's" % method)
            ctx.take_lock(node.cluster_id, method)
            try:
                ctx.recovery_pending = False
                if held is None:
                    ctx.keep_disk_key(ticket.state_disk_key, first=False)
                ctx.save_node(peers=tuple(ticket.peers), resource_version=ticket.resource_version)
                self._resume()
            except BaseException as err:
                ctx.fail(method, err)
                raise
            ctx.log("node_rejoined", node_vpn_ip=node.vpn_ip, resource_version=ticket.resource_version)
            outcome.update(self.status.get_state())

        result = request_ticket(node.vpn_ip, ctx.vpn_pub_key, node.disk_uuid or ctx.disk_uuid, on_ticket)
        outcome["resource_version"] = result.get("resource_version")
        return outcome
