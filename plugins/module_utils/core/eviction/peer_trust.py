# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Trust that stays true after activation, the Coordinator's side (docs/agent.md, "Re-attestation
and eviction", "Rejoin after a reboot"):

* re-attestation: every ``reattest_interval`` the Coordinator (with several, the leader) connects to each
  peer over aTLS, the Nodes and the other Coordinators (not itself), with a fresh nonce per connection
  and its policy without PCR 15, checks PCR 15 = our cluster ID and that the peer still is the one it
  recorded (VPN IP and WireGuard key from its attested GetState);
* eviction: a Node that fails attestation (a verdict: wrong PCRs, a bad signature, another identity) is
  evicted at once; a Node that cannot be reached is not: after ``unreachable_limit`` consecutive unreachable
  rounds it is **unverified** (shared state with the evictions, GetState ``unverified``, the log
  ``peer_unverified``): it keeps what it has but gets no new secret (``Evictions.require_verified``), and it
  is evicted only once it has been unreachable for ``unverified_eviction_after`` seconds with no re-attestation
  passing (denial of service is never eviction: a flood or an on-path attacker can make a healthy Node
  unreachable, not make it fail); a re-attestation that passes, or a rejoin (a fresh attestation of its own),
  clears it (``peer_verified``); an evicted Node is removed from the peer set (a new version, so every other peer drops it on its next
  update), its eviction is recorded (store, GetState ``evicted``, the log ``peer_evicted``), and the
  vpnapi refuses it; it comes back only through ActivateAdditionalNodes (add_nodes.yml) after it
  passes attestation again, with the VPN IP and key it had; the Kubernetes Node object of an evicted
  Node is deleted (``KubeadmProvider.delete_node``) where this Coordinator manages Kubernetes;
* a Coordinator that fails is evicted too (``_evict_coordinator``, etcd member first; held without a live
  majority); evictions are shared state (core/eviction/evictions.py): every Coordinator refuses an evicted peer;
* rejoin tickets (IssueRejoinTicket): a rebooted Node (PCR 15 reset) attests itself in-band and gets
  only its disk key, the measurement secret and its peers; the KMS URI never leaves the Coordinator.

The transports come in as ports (``connect_peer``, a ``JoinChannel``); nothing here opens a socket. The
Coordinator's registry and join service, its signatures, the evictions and the Kubernetes Node objects come
in through the Protocols of core/eviction/trust_ports.py (``PeerTrust``'s collaborators).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Collection, Dict, List, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils import kms as kms_mod
from ansible_collections.constellation.cluster.plugins.module_utils.core.records import node_records
from ansible_collections.constellation.cluster.plugins.module_utils.core.eviction.certified_ak_store import keep_certified_aks
from ansible_collections.constellation.cluster.plugins.module_utils.core.eviction.evictions import (
    MEMBER_KEPT, MEMBER_REMOVED, remove_coordinator_member)
from ansible_collections.constellation.cluster.plugins.module_utils.core.inputs import normalize_disk_uuid
from ansible_collections.constellation.cluster.plugins.module_utils.core.removal import require_not_removed
from ansible_collections.constellation.cluster.plugins.module_utils.core.ports import AttestationValidator, JoinChannel
from ansible_collections.constellation.cluster.plugins.module_utils.core.records.tickets import RejoinTicket
from ansible_collections.constellation.cluster.plugins.module_utils.core.eviction.trust_ports import (
    EvictionRecords, InBandAttestation, KubernetesNodes, Registry, TrustSigning)
from ansible_collections.constellation.cluster.plugins.module_utils.core.state import ROLE_COORDINATOR, State
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    AccessDenied,
    AttestationError,
    ConstellationError,
)

if TYPE_CHECKING:  # pragma: no cover
    from ansible_collections.constellation.cluster.plugins.module_utils.core.context import PeerContext

# Re-attestation outcomes (one per peer and round).
PASSED = "passed"
UNREACHABLE = "unreachable"
UNVERIFIED = "unverified"  # unreachable for ``unreachable_limit`` rounds or more: no new secret, not evicted yet
EVICTED = "evicted"
HELD = "eviction_held"  # a failed Coordinator whose etcd member must stay (no live majority without it)
MAX_REASON = 300
# Seconds a Node may stay unreachable (no re-attestation passing) before it is evicted: agent config
# ``unverified_eviction_after`` (docs/security.md argues the default).
UNVERIFIED_EVICTION_AFTER = 3600.0


class PeerTrust:
    """Re-attestation, eviction and rejoin tickets over the peer's ``PeerContext``."""

    def __init__(self, context: PeerContext, registry: Registry, join: InBandAttestation, signing: TrustSigning,
                 evictions: EvictionRecords, kubernetes: KubernetesNodes,
                 record_measurement_set: Optional[Callable[[str, Optional[str]], None]] = None,
                 record_agent: Optional[Callable[[str, Optional[Tuple[str, bytes]]], None]] = None):
        self.context = context
        self.registry = registry
        self.join = join
        self.signing = signing
        self.evictions = evictions
        self.kubernetes = kubernetes
        # consecutive unreachable rounds by VPN IP, and when the first of them was (``clock``)
        self._unreachable: Dict[str, Tuple[int, float]] = {}
        # Wall clock seconds: an unverified peer's ``since`` is compared across restarts and Coordinators.
        self.clock: Callable[[], float] = time.time
        # (vpn_ip, set name): which accepted measurement set a peer matched (core/accepted_measurements.py)
        self.record_measurement_set = record_measurement_set or (lambda vpn_ip, name: None)
        # (vpn_ip, (agent name, PCR 13 value)): which accepted agent it runs (core/accepted_measurements.py)
        self.record_agent = record_agent or (lambda vpn_ip, agent: None)

    @property
    def state(self) -> State:
        """The peer's state: ``ReattestLoop`` runs rounds only on an activated Coordinator."""
        return self.context.state

    def keep_certified_aks(self, certified_aks: Any) -> int:
        """The AKs this agent certified (qemu-vtpm-ek) are kept in its own sealed store: loaded now (each checked
        against the EK roots again), every new one written through (core/eviction/certified_ak_store.py). A restarted
        Coordinator re-attests its peers without enrolling them again. Returns how many were loaded."""
        return keep_certified_aks(certified_aks, self.context.local_store, self.context.log)

    # -- re-attestation
    def _reattested(self) -> list:
        """The peers re-attestation covers: every peer of the peer set with a public IP but this Coordinator."""
        registry = self.context.peer_registry.current()
        own = self.context.vpn_ip
        return [p for p in (registry.peers.peers.values() if registry is not None else ())
                if p.role in ("node", ROLE_COORDINATOR) and p.public_ip and p.vpn_ip != own]

    def reattest_targets(self) -> List[str]:
        """The VPN IPs of the peers a round re-attests (core/eviction/reattest_loop.py spreads them over the interval)."""
        self.context.require_coordinator("re-attestation")
        return [p.vpn_ip for p in self._reattested()]

    def reattest_peers(self, connect_peer: Callable[[str], Any], workers: int = 4,
                       unreachable_limit: int = 3, only: Optional[Collection[str]] = None,
                       unverified_eviction_after: float = UNVERIFIED_EVICTION_AFTER) -> List[Dict[str, Any]]:
        """One round: re-attests every peer of the peer set but this Coordinator (the Nodes and the other
        Coordinators), ``workers`` at a time; evicts those that fail, marks unverified the Nodes unreachable
        for ``unreachable_limit`` rounds and evicts those unreachable for ``unverified_eviction_after``
        seconds. ``connect_peer(public_ip)`` opens an aTLS connection validated with the policy without
        PCR 15 (a fresh nonce each time). ``only``: the VPN IPs of the peers to re-attest now (the loop's
        share of this moment; a peer gone meanwhile is skipped); None: all. One row per peer: vpn_ip,
        public_ip, role, outcome (passed, unreachable, unverified, evicted, eviction_held), error."""
        self.context.require_coordinator("re-attestation")
        peers = self._reattested()
        if only is not None:
            wanted = set(only)
            peers = [p for p in peers if p.vpn_ip in wanted]
        if not peers:
            return []
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(peers))), thread_name_prefix="reattest") as pool:
            return list(pool.map(lambda p: self._reattest_one(p, connect_peer, unreachable_limit,
                                                              unverified_eviction_after), peers))

    def _reattest_one(self, peer, connect_peer, unreachable_limit: int,
                      unverified_eviction_after: float) -> Dict[str, Any]:
        row: Dict[str, Any] = {"vpn_ip": peer.vpn_ip, "public_ip": peer.public_ip, "role": peer.role,
                               "outcome": PASSED, "error": None}
        try:
            with connect_peer(peer.public_ip) as client:
                membership = self.registry.membership(client)
                if membership == "fresh":
                    # PCR 15 reset: the Node rebooted and has not rejoined yet. Not a proof of tampering:
                    # counted like an unreachable round (it rejoins by itself within them).
                    raise ConnectionError("PCR 15 is reset (rebooted, not rejoined yet)")
                if membership != "ours":
                    raise AttestationError("PCR 15 does not hold this cluster's ID")
                self.signing.authenticate_as_coordinator(client)  # GetState's details are for the Coordinators only
                state = client.get_state()
                if peer.role == ROLE_COORDINATOR and state.get("state") == State.ACCEPTING_INIT.wire_name:
                    # Recorded, locked to us, its activation as Coordinator still under way (no VPN IP yet).
                    raise ConnectionError("its activation as Coordinator is not finished yet")
                if state.get("vpn_ip") != peer.vpn_ip or state.get("vpn_pub_key") != peer.vpn_pub_key:
                    raise AttestationError("the attested peer at %s is not the one recorded at %s (another VPN IP or "
                                           "WireGuard key)" % (peer.public_ip, peer.vpn_ip))
                row["measurement_set"] = getattr(client, "measurement_set", None)
                self.record_measurement_set(peer.vpn_ip, row["measurement_set"])
                agent = getattr(client, "agent", None)
                row["agent"] = agent[0] if agent else None
                self.record_agent(peer.vpn_ip, agent)
        except AttestationError as err:
            row.update(outcome=EVICTED, error="attestation failed: %s" % err)
        except (ConstellationError, OSError) as err:
            now = self.clock()
            with self.context.mutex:
                count, since = self._unreachable.get(peer.vpn_ip, (0, now))
                count += 1
                self._unreachable[peer.vpn_ip] = (count, since)
            error = str(err) or type(err).__name__
            row.update(outcome=UNREACHABLE, error=error)
            self.context.log("reattest_unreachable", level="warning", vpn_ip=peer.vpn_ip, public_ip=peer.public_ip,
                             failures=count, limit=unreachable_limit, error=error[:MAX_REASON])
            # A Coordinator is evicted only for a failed attestation (a dead one: remove_coordinator.yml).
            if peer.role != ROLE_COORDINATOR and (count >= unreachable_limit or peer.vpn_ip in self.evictions.unverified):
                row.update(self._unverified(peer, count, since, now, error, unverified_eviction_after))
        else:
            with self.context.mutex:
                self._unreachable.pop(peer.vpn_ip, None)
            if self.evictions.clear_unverified(peer.vpn_ip):
                self.context.log("peer_verified", vpn_ip=peer.vpn_ip, public_ip=peer.public_ip, by="reattestation")
        if row["outcome"] == EVICTED:
            if self.evict_peer(peer.vpn_ip, row["error"]) is None and peer.role == ROLE_COORDINATOR:
                row["outcome"] = HELD
        return row

    def _unverified(self, peer, count: int, since: float, now: float, error: str,
                    eviction_after: float) -> Dict[str, Any]:
        """A Node unreachable for the limit's rounds: unverified (recorded once, with when its unreachable
        rounds began), evicted once that is ``eviction_after`` seconds ago. The row's outcome and error."""
        record = self.evictions.unverified.get(peer.vpn_ip)
        if record is None:
            record = {"vpn_ip": peer.vpn_ip, "vpn_pub_key": peer.vpn_pub_key, "public_ip": peer.public_ip,
                      "role": peer.role, "since": since, "error": error[:MAX_REASON]}
            self.evictions.mark_unverified(peer.vpn_ip, record)
            self.context.log("peer_unverified", level="warning", vpn_ip=peer.vpn_ip, public_ip=peer.public_ip,
                             failures=count, evicted_after=eviction_after, error=error[:MAX_REASON])
        try:
            since = float(record.get("since", since))
        except (TypeError, ValueError):
            pass
        if now - since >= eviction_after:
            return {"outcome": EVICTED, "error": "unreachable and unverified for %d s (unverified_eviction_after: %d s): %s"
                    % (now - since, eviction_after, error)}
        return {"outcome": UNVERIFIED, "error": error}

    def evict_peer(self, vpn_ip: str, reason: str) -> Optional[int]:
        """Removes a peer from the peer set (new version; its VPN IP stays reserved for it) and records
        why; a Node's Kubernetes Node object goes too, a Coordinator's etcd member first
        (``_evict_coordinator``). Returns the new resource version (None if it was no peer, this
        Coordinator itself, or a Coordinator whose eviction is held)."""
        self.context.require_coordinator("evict peer")
        registry = self.context.peer_registry.current()
        record = registry.peers.get(vpn_ip) if registry is not None else None
        if record is None or record.vpn_ip == self.context.vpn_ip:
            return None  # the leader never evicts itself
        eviction = {"vpn_ip": record.vpn_ip, "vpn_pub_key": record.vpn_pub_key, "public_ip": record.public_ip,
                    "role": record.role, "reason": str(reason)[:MAX_REASON], "ts": round(time.time(), 3)}
        if record.role == ROLE_COORDINATOR:
            return self._evict_coordinator(record, eviction)
        # Recorded first: a crash before the removal leaves a peer that every Coordinator already refuses.
        self.evictions.record(vpn_ip, eviction)
        with self.context.mutex:
            self._unreachable.pop(vpn_ip, None)
        version = self._remove_evicted(vpn_ip)
        self.context.log("peer_evicted", level="warning", vpn_ip=vpn_ip, public_ip=record.public_ip, role=record.role,
                         reason=eviction["reason"], resource_version=version)
        self.kubernetes.delete_kubernetes_node(vpn_ip)
        return version

    def _remove_evicted(self, vpn_ip: str) -> int:
        def remove(reg):
            # The peer goes, its address and pod CIDR stay allocated: re-admission gives them back.
            reg.withdraw(vpn_ip)
            return reg.peers.version

        version = self.context.peer_registry.update(remove)
        self.registry.apply_registry_peers()
        return version

    def _evict_coordinator(self, record, eviction: Dict[str, Any]) -> Optional[int]:
        """A Coordinator that failed: its etcd member leaves first, then its registry entry. Held when the
        members that remain would not hold a live majority (``coordinator_removal.evict_member``) or the
        removal fails: recorded with ``etcd_member: kept`` (every Coordinator refuses it), the member and
        the entry stay (cutting its tunnel would make it a dead member that still votes), an error is
        logged and the next round tries again."""
        vpn_ip = record.vpn_ip
        try:
            held = remove_coordinator_member(self.context, vpn_ip)
        except ConstellationError as err:
            held = "removing its etcd member failed: %s" % err
        if held:
            eviction.update(etcd_member=MEMBER_KEPT, held=str(held)[:MAX_REASON])
            self.evictions.record(vpn_ip, eviction)
            self.context.log("coordinator_eviction_held", level="error", vpn_ip=vpn_ip, public_ip=record.public_ip,
                             reason=eviction["reason"], held=eviction["held"])
            return None
        eviction["etcd_member"] = MEMBER_REMOVED
        self.evictions.record(vpn_ip, eviction)
        with self.context.mutex:
            self._unreachable.pop(vpn_ip, None)
        version = self._remove_evicted(vpn_ip)
        self.context.log("peer_evicted", level="warning", vpn_ip=vpn_ip, public_ip=record.public_ip, role=ROLE_COORDINATOR,
                         reason=eviction["reason"], resource_version=version)
        return version

    # -- rejoin tickets (IssueRejoinTicket)
    def serve_rejoin(self, vpn_ip: str, node_vpn_pub_key: str, disk_uuid: Any, channel: JoinChannel,
                     validator: AttestationValidator) -> Dict[str, Any]:
        """A rebooted Node asks to rejoin: it must be a recorded, non-evicted peer (VPN IP, WireGuard key,
        disk UUID as recorded at its activation) and attest itself on this connection (PCR 15 reset);
        then it gets a ``RejoinTicket``."""
        method = "IssueRejoinTicket"
        kms = self.context.require_coordinator(method)
        self.evictions.require_not_evicted(vpn_ip, method)
        require_not_removed(self.context.store, node_vpn_pub_key, vpn_ip, method)  # core/removal.py
        normalized_uuid = normalize_disk_uuid(disk_uuid)
        registry = self.context.peer_registry.current()
        record = registry.peers.get(vpn_ip) if registry is not None else None
        recorded_uuid = node_records.load_node_disk_uuid(self.context.store, vpn_ip)
        if record is None or record.role != "node" or record.vpn_pub_key != node_vpn_pub_key \
                or recorded_uuid != normalized_uuid:
            self.context.log("rejoin_refused", peer=channel.peer_ip, vpn_ip=vpn_ip, reason="not a recorded node")
            raise AccessDenied("%s: %s is not a recorded Node of this cluster with this WireGuard key and disk"
                               % (method, vpn_ip))
        binding = channel.user_data(vpn_ip, node_vpn_pub_key, normalized_uuid)
        self.join.attest_over(channel, validator, method, binding, "rejoin_refused", vpn_ip=vpn_ip)
        # A fresh attestation of the Node itself: it is verified again (a rebooted Node was unreachable meanwhile).
        if self.evictions.clear_unverified(vpn_ip):
            self.context.log("peer_verified", vpn_ip=vpn_ip, public_ip=channel.peer_ip, by="rejoin")
        registry = self.context.peer_registry.current()
        ticket = RejoinTicket(kms_mod.state_disk_key(kms, normalized_uuid), kms_mod.measurement_secret(kms),
                              tuple(registry.peers.peers.values()), registry.peers.version)
        # Signed, bound to this request and connection: the Node checks it with the key it pinned at activation.
        channel.deliver(self.signing.signed_rejoin_ticket(ticket, binding))
        self.context.log("node_rejoined", peer=channel.peer_ip, node_vpn_ip=vpn_ip)
        return {"resource_version": ticket.resource_version}
