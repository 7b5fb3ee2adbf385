# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The admin removes a Node from the cluster (``Removal``: the ADMIN-channel method RemovePeer,
playbooks/remove_node.yml; docs/site.md, "Day-2 operations").

A removed Node loses, in this order (a crash between two steps leaves a Node every Coordinator already
refuses, and the next run finishes the rest):

1. its membership: a removal record (``removedPeer<WireGuard public key>``: its VPN IP, public IP, disk UUID,
   when) that every Coordinator of the store reads: its rejoin ticket is refused (core/eviction/peer_trust.py), its
   resumption by ActivateAdditionalNodes too (core/activation.py), and GetState lists it (``removed``), so
   add_nodes.yml refuses it naming the way back: reset.yml, a reboot (PCR 15), then add_nodes.yml as a new
   peer (new WireGuard key, new disk UUID);
2. its Kubernetes Node object, where this Coordinator manages Kubernetes (core/kubernetes.py; the playbook
   drains it first);
3. what it held that can be invalidated: its kubelet node-name bindings (the name may be certified for
   another node), its control-plane designation, its disk UUID record and ownership (a reused host may report
   the same disk), an eviction recorded for it;
4. its registry entry and VPN IP: the entry goes in a new version of the peer set (every peer drops it from
   WireGuard on its next update; the vpnapi's PeerAuth fails for it at once) and the address is freed (the next
   node activated gets it).

Refused: a Coordinator (the last one, the one that answers, or any other: a dead Coordinator is taken out with
remove_coordinator.yml; a live further Coordinator is not supported), and any caller but the admin on an
activated Coordinator (the handler, agent/admin.py). ``check``: only reports. Idempotent: a second run finds
nothing and changes nothing.
"""

from __future__ import annotations

import ipaddress
import json
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Protocol

from ansible_collections.constellation.cluster.plugins.module_utils.core.records import node_records
from ansible_collections.constellation.cluster.plugins.module_utils.core.admissions import forget_admission
from ansible_collections.constellation.cluster.plugins.module_utils.core.kubernetes import forget_node_names
from ansible_collections.constellation.cluster.plugins.module_utils.core.state import ROLE_COORDINATOR
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AccessDenied, InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.store import StoreError, Txn

if TYPE_CHECKING:  # pragma: no cover
    from ansible_collections.constellation.cluster.plugins.module_utils.core.context import PeerContext

# Removed peers by WireGuard public key: JSON {vpn_ip, vpn_pub_key, public_ip, role, disk_uuid, ts}; public values.
KEY_REMOVED_PREFIX = "removedPeer/"
WAY_BACK = "reset it (reset.yml), reboot it, then add it again with add_nodes.yml"


def removed_peers(store) -> Dict[str, dict]:
    """The removal records by WireGuard public key."""
    out = {}
    for key, value in store.items(KEY_REMOVED_PREFIX):
        try:
            out[key[len(KEY_REMOVED_PREFIX):]] = dict(json.loads(value))
        except (ValueError, TypeError) as err:
            raise StoreError("the stored removal of %s is invalid: %s" % (key[len(KEY_REMOVED_PREFIX):], err)) from None
    return out


def removed_peer(store, vpn_pub_key: Any) -> Optional[dict]:
    """The removal record of the peer with this WireGuard key, or None."""
    if not isinstance(vpn_pub_key, str) or not vpn_pub_key:
        return None
    raw = store.get_default(KEY_REMOVED_PREFIX + vpn_pub_key)
    if raw is None:
        return None
    try:
        return dict(json.loads(raw))
    except (ValueError, TypeError):
        raise StoreError("the stored removal of %s is invalid" % vpn_pub_key) from None


def require_not_removed(store, vpn_pub_key: Any, vpn_ip: Any, method: str) -> None:
    """AccessDenied for a peer the admin removed (its way back named)."""
    if removed_peer(store, vpn_pub_key) is not None:
        raise AccessDenied("%s: %s was removed from this cluster by the admin (remove_node.yml); to bring the host "
                           "back, %s" % (method, vpn_ip, WAY_BACK))


class Registry(Protocol):
    """The Coordinator's WireGuard peers follow the registry (core/coordinator.py ``Coordinator``)."""

    def apply_registry_peers(self) -> bool:
        """Our WireGuard peers become the registry's."""


class KubernetesNodes(Protocol):
    """A Node's Kubernetes Node object (core/kubernetes.py ``Kubernetes``)."""

    def kubernetes_node_names(self, vpn_ip: str) -> list:
        """The node names certified for the peer at ``vpn_ip``."""

    def delete_kubernetes_node(self, vpn_ip: str) -> None:
        """Deletes them where this Coordinator manages Kubernetes; failures are logged."""


class EvictionRecords(Protocol):
    """The evicted peers (core/eviction/evictions.py ``Evictions``)."""

    @property
    def evicted(self) -> Dict[str, dict]:
        """The evictions by VPN IP."""

    def clear_eviction(self, vpn_ip: str) -> None:
        """Forgets one eviction."""


class Removal:
    """RemovePeer over the peer's ``PeerContext``."""

    def __init__(self, context: PeerContext, registry: Registry, kubernetes: KubernetesNodes, evictions: EvictionRecords):
        self.context = context
        self.registry = registry
        self.kubernetes = kubernetes
        self.evictions = evictions

    @property
    def removed(self) -> List[dict]:
        """The removal records, sorted by VPN IP (GetState ``removed``)."""
        return sorted(removed_peers(self.context.store).values(),
                      key=lambda r: (int(ipaddress.ip_address(r.get("vpn_ip") or "0.0.0.0")), r.get("ts") or 0))

    def remove_node(self, public_ip: Any = None, vpn_ip: Any = None, check: bool = False) -> Dict[str, Any]:
        """Removes (``check``: only reports) the Node with this public IP or VPN IP (one of the two). Returns
        ``{"changed", "peer": {vpn_ip, vpn_pub_key, public_ip, role} or None, "kubernetes_node_names", "disk_uuid",
        "control_plane", "evicted", "msg"}``."""
        method = "RemovePeer"
        self.context.require_coordinator(method)
        if (public_ip is None) == (vpn_ip is None):
            raise InputError("node_public_ip", "either the Node's public IP or its VPN IP (node_vpn_ip), not both",
                             "both" if public_ip is not None else "neither")
        field = "node_public_ip" if public_ip is not None else "node_vpn_ip"
        wanted = public_ip if public_ip is not None else vpn_ip
        try:
            wanted = str(ipaddress.ip_address(wanted))
        except ValueError:
            raise InputError(field, "an IP address", wanted if isinstance(wanted, str) and len(wanted) <= 64 else None) \
                from None
        registry = self.context.peer_registry.current()
        peers = list(registry.peers.peers.values()) if registry is not None else []
        if field == "node_vpn_ip":
            matches = [p.to_dict() for p in peers if p.vpn_ip == wanted]
        else:
            matches = [p.to_dict() for p in peers if p.public_ip == wanted]
        in_registry = bool(matches)
        if not matches:  # an evicted Node is out of the peer set; its VPN IP stays reserved for it
            key = "vpn_ip" if field == "node_vpn_ip" else "public_ip"
            matches = [dict(e) for e in self.evictions.evicted.values() if e.get(key) == wanted]
        if len(matches) > 1:
            raise StateError("%s: %d peers have the %s %s (%s): remove them by VPN IP (node_vpn_ip)" % (
                method, len(matches), field, wanted, ", ".join(sorted(m["vpn_ip"] for m in matches))))
        if not matches:
            return {"changed": False, "peer": None, "kubernetes_node_names": [], "disk_uuid": None, "control_plane": False,
                    "evicted": False, "msg": "%s is no peer of this cluster (already removed, or never added)" % wanted}
        peer = matches[0]
        self._refuse_coordinator(peer, peers, method)
        ip = peer["vpn_ip"]
        disk_uuid = node_records.load_node_disk_uuid(self.context.store, ip)
        result = {"changed": True, "peer": {k: peer.get(k) for k in ("vpn_ip", "vpn_pub_key", "public_ip", "role")},
                  "kubernetes_node_names": self.kubernetes.kubernetes_node_names(ip), "disk_uuid": disk_uuid,
                  "control_plane": node_records.load_control_plane(self.context.store, ip) == peer["vpn_pub_key"],
                  "evicted": ip in self.evictions.evicted}
        result["msg"] = "%s %s (VPN IP %s)" % ("would remove" if check else "removed", peer.get("public_ip") or ip, ip)
        if check:
            return result
        # 1. Recorded first: from here every Coordinator refuses its rejoin and its resumption.
        record = dict(result["peer"], disk_uuid=disk_uuid, ts=round(time.time(), 3))
        self.context.store.put(KEY_REMOVED_PREFIX + peer["vpn_pub_key"],
                               json.dumps(record, sort_keys=True, separators=(",", ":")).encode("utf-8"))
        # 2. Its Kubernetes Node object (before its name bindings go: they name it).
        self.kubernetes.delete_kubernetes_node(ip)
        # 3. What it held.
        self.context.store.update(lambda tx: _forget_holdings(tx, ip, peer["vpn_pub_key"], disk_uuid))
        # 4. Its entry and its address (last: until then a second run finds it in the registry and finishes).
        version = self.context.peer_registry.update(lambda reg: _remove_and_free(reg, ip))
        self.registry.apply_registry_peers()
        if result["evicted"]:
            self.evictions.clear_eviction(ip)
        result["resource_version"] = version
        self.context.log("peer_removed", vpn_ip=ip, public_ip=peer.get("public_ip"), in_registry=in_registry,
                         kubernetes_node_names=result["kubernetes_node_names"], resource_version=version)
        return result

    def _refuse_coordinator(self, peer: Dict[str, Any], peers: list, method: str) -> None:
        if peer.get("role") == "node":
            return
        if peer.get("role") != ROLE_COORDINATOR:
            raise InputError("node_public_ip", "a Node", "%s (a peer with the role %s)" % (peer["vpn_ip"], peer.get("role")))
        coordinators = [p for p in peers if p.role == ROLE_COORDINATOR]
        if len(coordinators) <= 1:
            why = "it is the cluster's last Coordinator (removing it would end the cluster)"
        elif peer["vpn_ip"] == self.context.vpn_ip:
            why = "it is the Coordinator that answers this request"
        else:
            why = ("it is a Coordinator: a dead one is taken out with remove_coordinator.yml; removing a live further "
                   "Coordinator (its etcd member too) is not supported")
        raise StateError("%s: refused to remove %s (VPN IP %s): %s" % (method, peer.get("public_ip") or peer["vpn_ip"],
                                                                       peer["vpn_ip"], why))


def _forget_holdings(tx: Txn, vpn_ip: str, vpn_pub_key: str, disk_uuid: Optional[str]) -> None:
    """In one transaction: the node names of ``vpn_ip``, the admission its WireGuard key joined with (a removed
    node joins again only if the admin admits it again), its control-plane designation, its disk UUID record and
    the ownership of that UUID (when it is this peer's)."""
    forget_node_names(tx, vpn_ip)
    forget_admission(tx, vpn_pub_key)
    if tx.get_default(node_records.KEY_CONTROL_PLANE_PREFIX + vpn_ip) is not None:
        tx.delete(node_records.KEY_CONTROL_PLANE_PREFIX + vpn_ip)
    if tx.get_default(node_records.KEY_NODE_DISK_UUID_PREFIX + vpn_ip) is not None:
        tx.delete(node_records.KEY_NODE_DISK_UUID_PREFIX + vpn_ip)
    if disk_uuid:
        raw = tx.get_default(node_records.KEY_DISK_UUID_OWNER_PREFIX + disk_uuid)
        try:
            owner = json.loads(raw) if raw is not None else None
        except ValueError:
            owner = None
        if isinstance(owner, dict) and owner.get("vpn_pub_key") == vpn_pub_key:
            tx.delete(node_records.KEY_DISK_UUID_OWNER_PREFIX + disk_uuid)


def _remove_and_free(registry, vpn_ip: str) -> int:
    """The entry goes (a new version) and its address and pod CIDR are free again, also when it was evicted (out
    of the set, both kept for it)."""
    if registry.peers.get(vpn_ip) is not None:
        registry.remove(vpn_ip)
    elif registry.allocator.in_use(vpn_ip):
        registry.release_reserved(vpn_ip)
    return registry.peers.version
