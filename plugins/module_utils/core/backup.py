# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Coordinator's state out and back in (``Backup``; backup.yml and restore.yml, docs/site.md):

* ``export_state``: every key of an activated Coordinator's store (node state with its WireGuard key, KMS
  settings, init secret, peer registry, disk UUIDs, evictions...), for the admin channel's ``ExportState``
  (admin-authenticated; the handler checks that), with the peer set's version (``peer_resource_version``, the
  backup's counter). The controller encrypts it; nothing here is written.
* ``restore``: a fresh peer (AcceptingInit, no stored state, PCR 15 zeros) takes such an export in
  ``ActivateAsCoordinator`` (``restore_state``), authenticated as an activation is (the init secret's proof),
  with the KMS URI. Everything is checked before the node lock: the export's format, its node state (a
  Coordinator's), its peer registry and KMS settings, and that the KMS URI derives the export's cluster ID
  (a backup of another cluster is refused) and that the admin key is the one the export pinned. Then the
  lock (PCR 15 <- cluster ID), the keys go into the store, the peer resumes as after ``Recover`` (same VPN
  IP, WireGuard key, registry, KMS URI) and derives the disk key of its own (new) disk UUID. Given the highest
  peer set version the Nodes applied (``peer_version_floor``, restore.yml asks them), the restored set continues
  above it: a Node refuses an older set (core/node.py), and another set at its own version would never reach it.

Restoring Coordinators that shared their state in etcd members is not supported (refused, naming why).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Protocol

from ansible_collections.constellation.cluster.plugins.module_utils import kms as kms_mod
from ansible_collections.constellation.cluster.plugins.module_utils.core.records import state_store
from ansible_collections.constellation.cluster.plugins.module_utils.core.inputs import b64, open_kms, parse_admin_pub_key
from ansible_collections.constellation.cluster.plugins.module_utils.core.records.node_state import NodeState
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_set import MAX_RESOURCE_VERSION
from ansible_collections.constellation.cluster.plugins.module_utils.core.records.tickets import CoordinatorActivation
from ansible_collections.constellation.cluster.plugins.module_utils.core.state import ROLE_COORDINATOR, State
from ansible_collections.constellation.cluster.plugins.module_utils.encoding import b64decode
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.kms.init_secret import (
    check_node_proof,
    node_init_secret,
    parse_init_secret,
)
from ansible_collections.constellation.cluster.plugins.module_utils.store import StoreError
from ansible_collections.constellation.cluster.plugins.module_utils.store.base import MemoryStore

if TYPE_CHECKING:  # pragma: no cover
    from ansible_collections.constellation.cluster.plugins.module_utils.core.context import PeerContext

EXPORT_FORMAT = "constellation.cluster/coordinator-state/v1"
MAX_EXPORT_KEYS = 100000


class Resume(Protocol):
    """Resuming a stored state (core/recovery.py ``Recovery``)."""

    def resume(self) -> None:
        """Sets up the VPN and registry from the stored state and advances to its state."""


class DiskClaim(Protocol):
    """Who owns a disk UUID (core/registry/peer_access.py ``PeerAccess``)."""

    def claim_disk_uuid(self, disk_uuid: str, vpn_ip: str, vpn_pub_key: str, method: str) -> None:
        """Records the owner, or AccessDenied if another peer holds it."""


class PeerPut(Protocol):
    """The registry (core/coordinator.py ``Coordinator``)."""

    def add_node_peer(self, vpn_ip: str, vpn_pub_key: str, public_ip: str, role: str = "node") -> int:
        """Records (or updates) a peer."""


class Backup:
    """Export and restore over the peer's ``PeerContext``."""

    def __init__(self, context: PeerContext, recovery: Resume, peer_access: DiskClaim, coordinator: PeerPut):
        self.context = context
        self.recovery = recovery
        self.peer_access = peer_access
        self.coordinator = coordinator

    # -- out
    def export_state(self) -> Dict[str, Any]:
        """The activated Coordinator's store, every key (values base64). ``cluster_items``: the keys its etcd
        members share, when it runs one (several Coordinators)."""
        ctx = self.context
        ctx.require_coordinator("ExportState")
        node = ctx.stored_node()
        out: Dict[str, Any] = {"format": EXPORT_FORMAT, "cluster_id": b64(node.cluster_id), "vpn_ip": node.vpn_ip,
                               "items": {key: b64(value) for key, value in ctx.local_store.items("")}}
        if ctx.store is not ctx.local_store:
            out["cluster_items"] = {key: b64(value) for key, value in ctx.store.items("")}
        # The backup's counter: every change of the peers raises it (restore.yml compares it with the Nodes').
        registry = ctx.peer_registry.current()
        out["peer_resource_version"] = registry.peers.version if registry is not None else None
        ctx.log("state_exported", keys=len(out["items"]) + len(out.get("cluster_items") or ()))
        return out

    # -- back in
    def restore(self, kms_uri: str, admin_pub_key: str, exported: Any, init_secret: Optional[bytes] = None,
                measurement_salt: Optional[bytes] = None, peer_version_floor: Optional[int] = None) -> CoordinatorActivation:
        method = "ActivateAsCoordinator (restore)"
        ctx = self.context
        ctx.require_state(method, State.ACCEPTING_INIT)
        if ctx.recovery_pending:
            raise StateError("%s: this node holds a cluster's state and waits for Recover (recover.yml), not a restore"
                             % method)
        # The same proof as an activation: nobody but the admin makes a fresh node a Coordinator.
        secret = parse_init_secret(init_secret) if init_secret is not None else None
        check_node_proof(node_init_secret(secret, ctx.public_ip) if secret is not None else None,
                         ctx.init_secret_hash, method)
        if ctx.etcd_member is not None:
            raise StateError("%s: this agent runs an etcd member (several Coordinators); restoring Coordinators that "
                             "share their state in etcd is not supported" % method)
        items = parse_export(exported)
        node = check_export(items)
        if peer_version_floor is not None and (not isinstance(peer_version_floor, int) or isinstance(peer_version_floor, bool)
                                               or not 0 <= peer_version_floor < MAX_RESOURCE_VERSION):
            raise InputError("peer_resource_version_floor", "an integer in [0, %d)" % MAX_RESOURCE_VERSION,
                             peer_version_floor)
        if measurement_salt is not None and bytes(measurement_salt) != node.measurement_salt:
            raise InputError("measurement_salt", "the measurement salt of the backup's cluster")
        kms = open_kms(kms_uri)
        cluster_id = kms_mod.cluster_id(kms, node.measurement_salt)
        if cluster_id != node.cluster_id:
            raise StateError("%s: the KMS URI does not derive the backup's cluster ID (a backup of another cluster?)"
                             % method)
        parse_admin_pub_key(admin_pub_key)
        if (admin_pub_key or "").strip() != (node.admin_pub_key or "").strip():
            raise InputError("admin_pub_key", "the admin key the backup's Coordinator pinned")
        vpn_cidr = getattr(ctx.vpn, "vpn_cidr", None)
        stored_cidr = items.get(state_store.KEY_VPN_CIDR)
        if vpn_cidr and stored_cidr is not None and stored_cidr.decode("utf-8", "replace") != vpn_cidr:
            raise InputError("restore_state", "a backup of a cluster with the agent's VPN CIDR %s" % vpn_cidr,
                             stored_cidr.decode("utf-8", "replace")[:64])
        ctx.take_lock(cluster_id, method)
        ctx.log("node_lock", role=ROLE_COORDINATOR, pcr=15, via="restore")
        try:
            restored = node.replace(disk_uuid=ctx.disk_uuid, state=int(State.ACTIVATING_NODES))
            with ctx.local_store.transaction() as tx:
                for key, value in sorted(items.items()):
                    tx.put(key, value)
            ctx.save_node(restored)  # this host's disk UUID
            kms_data = dict(state_store.load_kms_data(ctx.local_store) or {})
            kms_data["kms_uri"] = kms_uri  # the admin's (it derives the same cluster ID)
            state_store.save_kms_data(ctx.local_store, kms_data)
            ctx.set_role(ROLE_COORDINATOR)
            self.recovery.resume()  # KMS, init secret, VPN with the same key and IP, registry, evictions
            pub_key = ctx.vpn_pub_key
            self.peer_access.claim_disk_uuid(ctx.disk_uuid, restored.vpn_ip, pub_key, method)  # this host's disk
            ctx.keep_disk_key(kms_mod.state_disk_key(kms, ctx.disk_uuid))
            if peer_version_floor is not None:  # the Nodes refuse an older set: continue above what they applied
                ctx.peer_registry.update(lambda r: r.peers.continue_above(peer_version_floor))
            registry = ctx.peer_registry.current()
            own = registry.peers.get(restored.vpn_ip) if registry is not None else None
            if own is None or own.public_ip != ctx.public_ip:  # restored onto a host with another address
                self.coordinator.add_node_peer(restored.vpn_ip, pub_key, ctx.public_ip, ROLE_COORDINATOR)
        except BaseException as err:
            ctx.fail(method, err)
            raise
        ctx.log("coordinator_restored", vpn_ip=restored.vpn_ip, keys=len(items))
        return CoordinatorActivation(cluster_id, restored.vpn_ip, pub_key, ctx.state.wire_name)


def parse_export(exported: Any) -> Dict[str, bytes]:
    """The keys of an ``export_state`` answer; InputError naming the field (never a value)."""
    if not isinstance(exported, Mapping):
        raise InputError("restore_state", "a Coordinator's exported state (a JSON object)", type(exported).__name__)
    if exported.get("format") != EXPORT_FORMAT:
        raise InputError("restore_state.format", EXPORT_FORMAT, str(exported.get("format"))[:80])
    if exported.get("cluster_items"):
        raise InputError("restore_state.cluster_items", "none: restoring Coordinators that shared their state in etcd "
                         "members is not supported")
    raw = exported.get("items")
    if not isinstance(raw, Mapping) or not raw or len(raw) > MAX_EXPORT_KEYS:
        raise InputError("restore_state.items", "an object of 1 to %d store keys" % MAX_EXPORT_KEYS)
    items = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not key:
            raise InputError("restore_state.items", "non-empty string keys")
        items[key] = b64decode(value, "restore_state.items[%s]" % key[:64], None)
    return items


def check_export(items: Mapping[str, bytes]) -> NodeState:
    """Reads the export as the agent would read its store (node state, KMS settings, registry) before
    anything is kept: a Coordinator's node state, or InputError naming what is wrong."""
    probe = MemoryStore(items)
    try:
        raw = state_store.load_node_state(probe)
        if raw is None:
            raise InputError("restore_state.items", "a node state (%s)" % state_store.KEY_NODE_STATE)
        node = NodeState.from_dict(raw)
        if node.role != ROLE_COORDINATOR:
            raise InputError("restore_state", "a Coordinator's state", "a %s's" % node.role)
        if state_store.load_kms_data(probe) is None:
            raise InputError("restore_state.items", "the Coordinator's KMS settings (%s)" % state_store.KEY_KMS_DATA)
        registry = state_store.load_peer_registry(probe)
        if registry is None or registry.peers.get(node.vpn_ip) is None:
            raise InputError("restore_state.items", "a peer registry that holds the Coordinator (%s)" % node.vpn_ip)
    except StoreError as err:
        raise InputError("restore_state.items", "a readable Coordinator store", str(err)[:200]) from None
    return node
