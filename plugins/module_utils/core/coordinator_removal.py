# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Taking a Coordinator out of the cluster (docs/store.md, "Replacing a dead Coordinator").

A Coordinator is two things in the cluster's shared state: a voting member of the etcd cluster (its
peer URL on the Coordinator's VPN IP) and a peer entry with the role coordinator in the registry. A dead
one still counts in etcd's majority (three members with one dead keep writing; a second loss stops
them) and stays in every peer's WireGuard mesh and in the Nodes' list of Coordinators to poll.

``remove_coordinator(store, vpn_ip)``, on an ``EtcdStore`` of one live Coordinator's member:

* removes the etcd member first (the majority is then counted among the living), then the peer entry
  in one registry transaction (``PeerRegistry.remove`` also releases the VPN IP, so the next Coordinator
  activated gets it again); the agents follow the registry's version, so the other Coordinators drop
  its WireGuard peer and the Nodes learn the removal with their next update;
* refuses the member the store talks to, the last member, a peer that is not a Coordinator, and a member
  that still answers unless ``force``: a member counts as dead only when none of its client URLs takes
  a TCP connection within ``timeout``; one that takes it but fails etcd's status request is alive enough
  to count (a Coordinator that runs must not be cut off by a bad TLS setting);
* is idempotent: a second run finds nothing and changes nothing; a run interrupted between the two
  steps (member gone, entry left) is finished by the next.

``evict_member(store, vpn_ip, own_vpn_ip)`` is the leader's side of evicting a Coordinator that failed
re-attestation (core/eviction/peer_trust.py): the same removal of the member, but refused (held, with the reason) when
the members that remain would not hold a live majority: a tampered member still votes, and removing it
while another member is down would stop the cluster.

``store/etcd_members.py``'s ``open_local_member(state_dir)`` opens the store on this host's own member, as the agent configured it
(``etcd_member``: data in ``<data_dir>/data``, TLS files in ``<data_dir>/tls``).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.core.records import state_store
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_record import ROLE_COORDINATOR
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.store.base import StoreError
from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd import EtcdStore
from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd_members import (
    EVICT_PROBE_TIMEOUT,
    PROBE_TIMEOUT,
    TRANSIENT,
    check_vpn_ip,
    member_id_hex,
    member_reachable,
    member_view,
    probe_member,
    remove_member,
    retried,
    url_host,
    url_key,
)

# Evicting (the leader, during re-attestation) waits less for etcd than an operator's removal.
EVICT_RECONFIG_WAIT = 10.0


def remove_coordinator(store: EtcdStore, vpn_ip: str, check: bool = False, force: bool = False,
                       tls: Optional[Mapping[str, str]] = None, timeout: float = PROBE_TIMEOUT) -> Dict[str, Any]:
    """Removes (``check``: only reports) the etcd member whose peer URL is on ``vpn_ip`` and the
    registry's Coordinator entry at ``vpn_ip``. ``tls``: the files to ask the member's status with.
    Returns ``{"changed", "vpn_ip", "member", "peer", "health", "members"}``: what was (or would be)
    removed (None: nothing), how the member answered, and the members that remain."""
    ip = check_vpn_ip(vpn_ip)
    endpoints = list(getattr(store, "endpoints", None) or [])
    if len(endpoints) != 1:
        raise InputError("store", "an EtcdStore on one member (open_local_member)", endpoints)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 60:
        raise InputError("timeout", "seconds, more than 0 and at most 60", timeout)
    members = store.member_list()
    target = [m for m in members if any(url_host(url) == ip for url in m["peer_urls"])]
    if len(target) > 1:
        raise StateError("vpn_ip: %d etcd members have a peer URL on %s (%s): remove them by hand"
                         % (len(target), ip, ", ".join(member_id_hex(m["id"]) for m in target)))
    member = target[0] if target else None
    registry = state_store.load_peer_registry(store)
    peer = registry.peers.get(ip) if registry is not None else None
    if peer is not None and peer.role != ROLE_COORDINATOR:
        raise InputError("vpn_ip", "the VPN IP of a Coordinator", "%s (a peer with the role %s)" % (ip, peer.role))
    own = url_key(endpoints[0])
    if ip == url_host(endpoints[0]) or (member is not None and own in {url_key(u) for u in member["client_urls"]}):
        raise InputError("vpn_ip", "another Coordinator than this one (its etcd member serves this store)", ip)
    health = None
    if member is not None:
        if len(members) <= 1:
            raise StateError("vpn_ip: %s is the etcd cluster's last member; it cannot be removed" % ip)
        health = probe_member(member, tls, timeout)
        if health["reachable"] and not force:
            raise StateError("vpn_ip: the etcd member %s on %s still answers (%s): a running Coordinator is removed "
                             "only with force" % (member["name"] or member_id_hex(member["id"]), ip, health["detail"]))
    remaining = [m for m in members if member is None or m["id"] != member["id"]]
    result = {"changed": member is not None or peer is not None, "vpn_ip": ip, "member": member_view(member),
              "peer": peer.to_dict() if peer is not None else None, "health": health,
              "members": [member_view(m) for m in remaining]}
    if check or not result["changed"]:
        return result
    if member is not None:
        remove_member(store, member)
    if peer is not None:
        removed, result["peer_version"] = retried(lambda: state_store.update_peer_registry(store, _remove_entry(ip)))
        result["peer"] = removed or result["peer"]
    return result


def evict_member(store: EtcdStore, vpn_ip: str, own_vpn_ip: Optional[str], timeout: float = EVICT_PROBE_TIMEOUT,
                 wait: float = EVICT_RECONFIG_WAIT) -> Dict[str, Any]:
    """Removes the etcd member whose peer URL is on ``vpn_ip`` (a Coordinator evicted by the leader at
    ``own_vpn_ip``), unless the members that remain would not hold a live majority: a member counts as live
    when it is the leader's own or takes a TCP connection on a client URL within ``timeout``. Returns
    ``{"removed": member view or None, "held": None or why not, "members": remaining count, "live": count}``.
    A failed removal raises StoreError (the caller holds the eviction and tries again)."""
    ip = check_vpn_ip(vpn_ip)
    if own_vpn_ip is not None and ip == check_vpn_ip(own_vpn_ip):
        raise InputError("vpn_ip", "another Coordinator than the leader itself", ip)
    members = store.member_list()
    target = [m for m in members if any(url_host(url) == ip for url in m["peer_urls"])]
    if not target:
        return {"removed": None, "held": None, "members": len(members), "live": None}
    remaining = [m for m in members if all(m["id"] != t["id"] for t in target)]
    if not remaining:
        return {"removed": None, "held": "it is the etcd cluster's last member", "members": 0, "live": 0}
    live = 0
    for member in remaining:
        own = own_vpn_ip is not None and any(url_host(url) == own_vpn_ip for url in member["peer_urls"])
        if own or member_reachable(member, timeout):
            live += 1
    needed = len(remaining) // 2 + 1
    if live < needed:
        return {"removed": None, "members": len(remaining), "live": live,
                "held": "only %d of the %d etcd members that would remain answer (a majority needs %d): removing it "
                        "would stop the cluster's writes; remove the dead members first (remove_coordinator.yml)"
                        % (live, len(remaining), needed)}
    for member in target:
        try:
            EtcdStore.retry(lambda m=member: store.member_remove(m["id"], wait=wait), TRANSIENT, wait)
        except StoreError as err:
            # A removed leader steps down: the answer may time out in the election although the removal
            # was committed (as in remove_member): only a member still listed is a failure.
            if "member not found" not in str(err) and any(
                    m["id"] == member["id"] for m in EtcdStore.retry(store.member_list, TRANSIENT, wait)):
                raise StoreError("removing the etcd member %s (%s) failed: %s" % (
                    member["name"] or "unnamed", member_id_hex(member["id"]), err)) from None
    return {"removed": member_view(target[0]), "held": None, "members": len(remaining), "live": live}


def _remove_entry(ip: str):
    def remove(registry) -> Tuple[Optional[Dict[str, Any]], int]:
        record = registry.peers.get(ip)
        if record is None:
            return None, registry.peers.version
        if record.role != ROLE_COORDINATOR:  # changed since it was read: checked again in the transaction
            raise InputError("vpn_ip", "the VPN IP of a Coordinator", "%s (a peer with the role %s)" % (ip, record.role))
        registry.remove(ip)
        return record.to_dict(), registry.peers.version

    return remove
