# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Node's side (``Node``): activation as Node (two steps), joining with a ticket, and applying the
Coordinator's peer updates. The transport of a join comes in as a port (``ports.TicketRequest``)."""

from __future__ import annotations

import base64
import hmac
import ipaddress
import threading
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional

from ansible_collections.constellation.cluster.plugins.module_utils import kms as kms_mod
from ansible_collections.constellation.cluster.plugins.module_utils.core import signing
from ansible_collections.constellation.cluster.plugins.module_utils.kms.init_secret import check_node_proof
from ansible_collections.constellation.cluster.plugins.module_utils.core.records.node_state import NodeState
from ansible_collections.constellation.cluster.plugins.module_utils.core.ports import TicketRequest
from ansible_collections.constellation.cluster.plugins.module_utils.core.records.tickets import (
    JoinTicket,
    NodeActivationRequest,
    NodeActivationStep,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.state import ROLE_NODE, State
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    AccessDenied,
    ConnectionLost,
    ConstellationError,
    InputError,
    StateError,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_set import PeerUpdate
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import (
    generate_priv_key,
    parse_pod_cidr,
    pub_key_from_priv_key,
)

if TYPE_CHECKING:  # pragma: no cover
    from ansible_collections.constellation.cluster.plugins.module_utils.core.context import PeerContext


class Node:
    """The Node's side over the peer's ``PeerContext``."""

    def __init__(self, context: PeerContext):
        self.context = context
        # The WireGuard key a joining node announces: one per Core, generated on first use.
        self._join_key_lock = threading.Lock()
        self._join_priv_key_value: Optional[str] = None

    # -- activation as Node (two steps)
    def activate_as_node_begin(self, params: Mapping[str, Any]) -> NodeActivationStep:
        ctx = self.context
        method = "ActivateAsNode"
        ctx.require_state(method, State.ACCEPTING_INIT)
        if ctx.recovery_pending:
            raise StateError("%s: this node holds a cluster's state and waits for Recover" % method)
        request = NodeActivationRequest.from_dict(params)
        # No hijacking a fresh node: the caller proves this node's init secret before the lock is taken.
        check_node_proof(request.init_proof, ctx.init_secret_hash, method)
        if request.coordinator_pub_key is None:
            # Pinned now (the request is the Coordinator's: it proved our init secret); without it the Node
            # could not tell a Coordinator's rejoin ticket or peer update from another Node's.
            raise InputError("coordinator_pub_key", "the Coordinators' signing key (a Coordinator sends it)")
        request = request.without_proof()
        priv_key = generate_priv_key()
        waiting = self._new_node_state(request, priv_key, State.NODE_WAITING_FOR_CLUSTER_JOIN)
        # Persisted by the lock's winner before PCR 15 is extended: a crash after the extension finds it
        # and resumes (base.load); no secret has reached this node yet.
        ctx.take_lock(request.cluster_id, method, before_extend=lambda: ctx.save_node(waiting))
        ctx.log("node_lock", role=ROLE_NODE, pcr=15)
        try:
            ctx.set_role(ROLE_NODE)
            ctx.vpn.setup(request.node_vpn_ip, priv_key, request.cluster_pod_cidr)
            ctx.vpn.set_peers(list(request.peers), pub_key_from_priv_key(priv_key))
            ctx.advance(State.NODE_WAITING_FOR_CLUSTER_JOIN)
        except BaseException as err:
            ctx.fail(method, err)
            raise
        return NodeActivationStep(ctx.disk_uuid, pub_key_from_priv_key(priv_key))

    def activate_as_node_finish(self, state_disk_key: bytes) -> Dict[str, Any]:
        """The second step: the disk key, from the Coordinator's ActivateAsNode exchange or, after an
        interruption, from its vpnapi (GetStateDiskKey). Whichever comes first finishes; a later one
        finds the node active and changes nothing."""
        ctx = self.context
        method = "ActivateAsNode"
        if not isinstance(state_disk_key, bytes) or len(state_disk_key) != kms_mod.STATE_DISK_KEY_LENGTH:
            raise InputError("state_disk_key", "%d bytes" % kms_mod.STATE_DISK_KEY_LENGTH)
        with ctx.mutex:
            if ctx.state == State.IS_NODE and ctx.read_disk_key() == state_disk_key:
                return {"state": ctx.state.wire_name, "node_vpn_ip": ctx.vpn_ip}
            ctx.require_state(method + " (second step)", State.NODE_WAITING_FOR_CLUSTER_JOIN)
            try:
                ctx.keep_disk_key(state_disk_key)
                ctx.save_node(state=int(State.IS_NODE))
                ctx.advance(State.IS_NODE)
            except BaseException as err:
                ctx.fail(method, err)
                raise
        return {"state": ctx.state.wire_name, "node_vpn_ip": ctx.vpn_ip}

    def abort_node_activation(self, reason: str) -> None:
        """The Coordinator went away between the two steps. The node keeps the lock and its state
        (NodeWaitingForClusterJoin, persisted) and fetches its disk key from the Coordinator over the
        VPN (``finish_activation``); nothing else can take it over: PCR 15 holds our cluster ID."""
        ctx = self.context
        if ctx.state == State.NODE_WAITING_FOR_CLUSTER_JOIN:
            ctx.log("activation_interrupted", reason=reason[:300])

    def finish_activation(self, fetch_disk_key) -> Dict[str, Any]:
        """An interrupted activation: ``fetch_disk_key()`` asks the Coordinator at our
        ``coordinator_vpn_ip`` through the WireGuard tunnel (which authenticates it by the key the
        activation gave us) for our disk key; then the second step as usual."""
        ctx = self.context
        ctx.require_state("finish activation", State.NODE_WAITING_FOR_CLUSTER_JOIN)
        result = self.activate_as_node_finish(fetch_disk_key())
        ctx.log("activation_finished", via="vpnapi", node_vpn_ip=ctx.vpn_ip)
        return result

    def _new_node_state(self, request: NodeActivationRequest, priv_key: str, state: State) -> NodeState:
        ctx = self.context
        coordinator = next((p for p in request.peers if p.vpn_ip == request.coordinator_vpn_ip), None)
        return NodeState(role=ROLE_NODE, vpn_ip=request.node_vpn_ip, vpn_priv_key=priv_key,
                         cluster_id=request.cluster_id, measurement_salt=request.measurement_salt,
                         admin_pub_key=request.admin_pub_key, coordinator_vpn_ip=request.coordinator_vpn_ip,
                         coordinator_vpn_pub_key=coordinator.vpn_pub_key if coordinator else None,
                         peers=tuple(request.peers), resource_version=-1, disk_uuid=ctx.disk_uuid, state=int(state),
                         coordinator_pub_key=request.coordinator_pub_key, cluster_pod_cidr=request.cluster_pod_cidr,
                         pod_cidr=request.node_pod_cidr)

    def _pod_network(self, node: NodeState, peers: Mapping[str, Any], pod_range: Any) -> Dict[str, Any]:
        """A Node activated before its cluster had pod CIDRs learns them from a signed peer set: its own block (its
        record in the set) and the cluster's range (signed with the set), which it routes into wg0 at once. The
        node state changes to save (none when it has them already)."""
        own = peers.get(node.vpn_ip)
        pod_cidr = own.pod_cidr if own is not None and own.pod_cidr else node.pod_cidr
        cluster = parse_pod_cidr(pod_range, "cluster_pod_cidr") if pod_range else node.cluster_pod_cidr
        if (pod_cidr, cluster) == (node.pod_cidr, node.cluster_pod_cidr):
            return {}
        if cluster != node.cluster_pod_cidr:
            self.context.vpn.setup(node.vpn_ip, node.vpn_priv_key, cluster)
        self.context.log("pod_cidr_learnt", pod_cidr=pod_cidr, cluster_pod_cidr=cluster)
        return {"pod_cidr": pod_cidr, "cluster_pod_cidr": cluster}

    # -- join
    def join(self, ticket: JoinTicket, binding: Optional[bytes] = None) -> Dict[str, Any]:
        """A node takes a join ticket: check the Coordinators' signature (bound to ``binding``: the user data
        of our attestation on this connection), the cluster ID, node lock, then use the secrets."""
        ctx = self.context
        method = "IssueJoinTicket"
        ctx.require_state(method, State.ACCEPTING_INIT)
        if ctx.recovery_pending:
            raise StateError("%s: this node holds a cluster's state and waits for Recover" % method)
        # Any Node of our cluster, and a Coordinator of another cluster on the same image, passes the policy we
        # check the join service with (no PCR 15): only the Coordinators' key, pinned in our agent config, tells
        # our Coordinators' ticket from theirs. (A ticket carries no init proof: a proof derived from where the
        # request came from would hand one node's proof to whoever joins from its address.)
        pinned = ctx.join_coordinator_pub_key
        try:
            if binding is None:
                raise AccessDenied("%s: the ticket is not bound to this connection: refused" % method)
            signing.verify(pinned, signing.CONTEXT_JOIN_TICKET, signing.ticket_payload(ticket.to_dict(), binding),
                           ticket.signature, method + " ticket")
        except AccessDenied as err:
            ctx.log("join_ticket_refused", level="warning", reason=str(err)[:300])
            raise
        derived = kms_mod.derive_cluster_id(ticket.measurement_secret, ticket.measurement_salt)
        if not hmac.compare_digest(derived, ticket.cluster_id):
            raise StateError("%s: the ticket's cluster ID does not follow from its measurement secret and salt"
                             % method)
        ctx.take_lock(ticket.cluster_id, method)
        ctx.log("node_lock", role=ROLE_NODE, pcr=15, via="join")
        try:
            priv_key = self._join_priv_key
            ctx.set_role(ROLE_NODE)
            ctx.vpn.setup(ticket.node_vpn_ip, priv_key, ticket.cluster_pod_cidr)
            ctx.vpn.set_peers(list(ticket.peers), pub_key_from_priv_key(priv_key))
            ctx.keep_disk_key(ticket.state_disk_key)
            ctx.save_node(self._new_node_state(ticket.activation_request(), priv_key, State.IS_NODE).replace(
                coordinator_pub_key=pinned))
            ctx.advance(State.NODE_WAITING_FOR_CLUSTER_JOIN)
            ctx.advance(State.IS_NODE)
        except BaseException as err:
            ctx.fail(method, err)
            raise
        return {"state": ctx.state.wire_name, "node_vpn_ip": ctx.vpn_ip}

    def join_cluster(self, request_ticket: TicketRequest) -> Dict[str, Any]:
        """The joining node's side of IssueJoinTicket: ``request_ticket`` reaches a verified Coordinator
        and hands us the ticket, which we take (``join``); returns the Coordinator's answer and ours."""
        ctx = self.context
        outcome: Dict[str, Any] = {}

        def on_ticket(ticket: Mapping[str, Any], binding: Optional[bytes] = None) -> None:
            outcome.update(self.join(JoinTicket.from_dict(ticket), binding))

        try:
            result = request_ticket(ctx.disk_uuid, self.join_vpn_pub_key(), on_ticket)
        except ConnectionLost:
            if ctx.state == State.IS_NODE:
                # We are locked and configured; the Coordinator missed our confirmation.
                raise ConstellationError("joined, but the Coordinator did not confirm; it may not list us yet")
            raise
        outcome.update(result)
        return outcome

    @property
    def _join_priv_key(self) -> str:
        """The WireGuard key a joining node announces; generated once per Core (agent life)."""
        with self._join_key_lock:
            if self._join_priv_key_value is None:
                self._join_priv_key_value = generate_priv_key()
            return self._join_priv_key_value

    def join_vpn_pub_key(self) -> bytes:
        return base64.b64decode(pub_key_from_priv_key(self._join_priv_key))

    # -- updates from the Coordinator
    def apply_update(self, update: Mapping[str, Any]) -> bool:
        """Applies a GetUpdate answer; returns True if the peers changed."""
        ctx = self.context
        ctx.require_state("apply update", State.IS_NODE)
        parsed = PeerUpdate.from_dict(update)
        with ctx.mutex:
            node = ctx.stored_node()
            current = {p.vpn_ip: p for p in node.peers or ()}
            version = node.resource_version if node.resource_version is not None else -1
        if parsed.resource_version == version and not parsed:
            return False
        new = parsed.apply_to(current)
        # The floor: a peer set is never older than the one applied. A replayed, validly signed older set
        # (one that still lists an evicted peer) is refused, and so is another set at the same version; a
        # Coordinator restored from a backup continues above the version its Nodes ask with (core/coordinator.py).
        if parsed.resource_version < version or (parsed.resource_version == version and new != current):
            what = "is older than" if parsed.resource_version < version else "differs from"
            reason = ("GetUpdate: the peer set at version %d %s the one this Node applied (version %d): refused, "
                      "the peers stay" % (parsed.resource_version, what, version))
            ctx.log("update_refused", level="warning", resource_version=parsed.resource_version,
                    applied_resource_version=version, reason=reason)
            raise StateError(reason)
        # Whoever answers at the Coordinator's VPN address, the peers are taken only if the Coordinators
        # signed this peer set at this version (core/signing.py), with the cluster's pod range when it has one.
        pod_range = update.get("cluster_pod_cidr")
        try:
            signing.verify(node.coordinator_pub_key, signing.CONTEXT_PEERS,
                           signing.peers_payload(parsed.resource_version, new.values(), pod_range), update.get("signature"),
                           "GetUpdate")
        except AccessDenied as err:
            ctx.log("update_refused", level="warning", resource_version=parsed.resource_version,
                    reason=str(err)[:300])
            raise
        pods = self._pod_network(node, new, pod_range)
        ctx.vpn.set_peers(list(new.values()), ctx.vpn_pub_key)
        ctx.save_node(peers=tuple(new[ip] for ip in sorted(new, key=lambda a: int(ipaddress.ip_address(a)))),
                      resource_version=parsed.resource_version, **pods)
        changed = new != current
        if changed:
            ctx.log("peers_updated", resource_version=parsed.resource_version, peers=len(new))
        return changed
