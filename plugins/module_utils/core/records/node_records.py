# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the Coordinator records about the nodes it activates (core/activation.py, core/registry/peer_access.py), in
its store: the disk UUID each node reported, who owns a disk UUID, and the admin's control-plane
designations. The store's other records: core/records/state_store.py."""

from __future__ import annotations

import ipaddress
import json
from typing import Optional

from ansible_collections.constellation.cluster.plugins.module_utils.store import StoreError, Txn

# The state disk UUID each activated node reported, by its VPN IP: recorded before the Coordinator
# sends the node its disk key, so an interrupted activation can be finished over the VPN (core/).
KEY_NODE_DISK_UUID_PREFIX = "nodeDiskUUID"
# Which peer a state disk UUID belongs to, by UUID: JSON {vpn_ip, vpn_pub_key} of the first peer recorded
# with it (claim_disk_uuid); a join, rejoin or activation naming it for another peer gets nothing.
KEY_DISK_UUID_OWNER_PREFIX = "diskUUIDOwner"
# Nodes the admin designated control planes at their activation, by VPN IP: the node's WireGuard public
# key (a VPN IP given to another peer later inherits nothing). Coordinators are control planes anyway.
KEY_CONTROL_PLANE_PREFIX = "controlPlane"


def save_node_disk_uuid(store, vpn_ip: str, disk_uuid: str) -> None:
    """Records which state disk the node at ``vpn_ip`` reported (before its disk key is sent)."""
    store.put(KEY_NODE_DISK_UUID_PREFIX + str(ipaddress.ip_address(vpn_ip)), disk_uuid.encode("ascii"))


def load_node_disk_uuid(store, vpn_ip: str) -> Optional[str]:
    raw = store.get_default(KEY_NODE_DISK_UUID_PREFIX + str(ipaddress.ip_address(vpn_ip)))
    if raw is None:
        return None
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        raise StoreError("the stored disk UUID of %s is invalid" % vpn_ip) from None


def _read_owner(raw: Optional[bytes], disk_uuid: str) -> Optional[dict]:
    if raw is None:
        return None
    try:
        owner = json.loads(raw)
        if not isinstance(owner, dict) or not isinstance(owner.get("vpn_pub_key"), str):
            raise ValueError("not an owner record")
        return owner
    except ValueError:
        raise StoreError("the stored owner of disk UUID %s is invalid" % disk_uuid) from None


def disk_uuid_owner(store, disk_uuid: str) -> Optional[dict]:
    """``{vpn_ip, vpn_pub_key}`` of the peer ``disk_uuid`` belongs to, or None (not claimed yet)."""
    return _read_owner(store.get_default(KEY_DISK_UUID_OWNER_PREFIX + disk_uuid), disk_uuid)


def claim_disk_uuid(store, disk_uuid: str, vpn_ip: str, vpn_pub_key: str) -> Optional[str]:
    """Records, in ONE transaction, that ``disk_uuid`` belongs to the peer with WireGuard key
    ``vpn_pub_key`` (at ``vpn_ip``) and which disk the node at ``vpn_ip`` reported (``save_node_disk_uuid``'s
    record). A UUID already owned by another key is refused: nothing is written and the owner's VPN IP is
    returned. A UUID recorded only by an older version (no owner record, a ``nodeDiskUUID`` of another
    VPN IP) counts as that node's. None: the UUID is this peer's (now or already)."""
    ip = str(ipaddress.ip_address(vpn_ip))
    owner_key = KEY_DISK_UUID_OWNER_PREFIX + disk_uuid

    def claim(tx: Txn) -> Optional[str]:
        owner = _read_owner(tx.get_default(owner_key), disk_uuid)
        if owner is not None and owner["vpn_pub_key"] != vpn_pub_key:
            return str(owner.get("vpn_ip"))
        if owner is None:
            for key, value in tx.items(KEY_NODE_DISK_UUID_PREFIX):
                if value == disk_uuid.encode("ascii") and key[len(KEY_NODE_DISK_UUID_PREFIX):] != ip:
                    return key[len(KEY_NODE_DISK_UUID_PREFIX):]
        record = json.dumps({"vpn_ip": ip, "vpn_pub_key": vpn_pub_key}, sort_keys=True,
                            separators=(",", ":")).encode("utf-8")
        if tx.get_default(owner_key) != record:
            tx.put(owner_key, record)
        if tx.get_default(KEY_NODE_DISK_UUID_PREFIX + ip) != disk_uuid.encode("ascii"):
            tx.put(KEY_NODE_DISK_UUID_PREFIX + ip, disk_uuid.encode("ascii"))
        return None

    return store.update(claim)


def save_control_plane(store, vpn_ip: str, vpn_pub_key: str) -> None:
    """The admin designated the node at ``vpn_ip`` (WireGuard key ``vpn_pub_key``) a control plane."""
    store.put(KEY_CONTROL_PLANE_PREFIX + str(ipaddress.ip_address(vpn_ip)), vpn_pub_key.encode("ascii"))


def load_control_plane(store, vpn_ip: str) -> Optional[str]:
    """The WireGuard key of the node at ``vpn_ip`` if the admin designated it a control plane, else None."""
    raw = store.get_default(KEY_CONTROL_PLANE_PREFIX + str(ipaddress.ip_address(vpn_ip)))
    try:
        return raw.decode("ascii") if raw is not None else None
    except UnicodeDecodeError:
        raise StoreError("the stored control-plane designation of %s is invalid" % vpn_ip) from None
