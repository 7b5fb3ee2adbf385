# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A peer's persisted state, as typed records on top of a store (``store.py``), in the
Coordinator's key layout (SPEC §6.8): the peer registry, the node state and the KMS settings.
(Named ``peerstore.py`` before 0.2.0; it always held more than peers.)

* Peer state (``peers.PeerRegistry.to_dict()``): the peers, their resource version, the change log
  and the VPN IP allocator are written and read in ONE transaction, so a reader never sees a peer
  without its version or an allocator that has not yet counted a peer's IP. Only keys whose value
  changes are written (one new peer = a handful of operations, whatever the cluster's size).
* Node state (``nodeState``): ``{role, vpn_ip, vpn_priv_key (b64), owner_id (b64), cluster_id (b64), ...}``.
* KMS settings (``KMSData``): Go JSON ``{"KmsUri", "StorageUri", "KeyEncryptionKeyID"}``.

Key layout (values): ``peerPrefix<vpnIP>`` (Go JSON of the peer), ``peersResourceVersion`` (decimal),
``peersChangeLog`` (JSON: max_log_changes, log_floor, log), ``vpnCIDR`` (text),
``highestAvailableCoordinatorIP`` / ``highestAvailableNodeIP`` (the next unused address, 4 raw bytes),
``freeCoordinatorVPNIPs<ip>`` / ``freeNodeVPNIPs<ip>`` (empty values).
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
from typing import Any, Callable, Dict, Mapping, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.core.peers import (
    ROLES,
    STORE_PEER_PREFIX,
    STORE_RESOURCE_VERSION,
    PeerRecord,
    PeerRegistry,
)
from ansible_collections.constellation.cluster.plugins.module_utils.store import StoreError, Txn

KEY_PEER_PREFIX = STORE_PEER_PREFIX
KEY_RESOURCE_VERSION = STORE_RESOURCE_VERSION
KEY_CHANGE_LOG = "peersChangeLog"
KEY_VPN_CIDR = "vpnCIDR"
KEY_NEXT_IP = {"coordinator": "highestAvailableCoordinatorIP", "node": "highestAvailableNodeIP"}
KEY_FREE_PREFIX = {"coordinator": "freeCoordinatorVPNIPs", "node": "freeNodeVPNIPs"}
KEY_NODE_STATE = "nodeState"
KEY_KMS_DATA = "KMSData"
KEY_MASTER_SECRET = "masterSecret"
KEY_CLUSTER_ID = "clusterID"
KEY_KEK_ID = "kekID"
KEY_KUBECONFIG = "kubeConfig"
KEY_STATE = "state"
# The state disk UUID each activated node reported, by its VPN IP: recorded before the Coordinator
# sends the node its disk key, so an interrupted activation can be finished over the VPN (core/).
KEY_NODE_DISK_UUID_PREFIX = "nodeDiskUUID"
# Which peer a state disk UUID belongs to, by UUID: JSON {vpn_ip, vpn_pub_key} of the first peer recorded
# with it (claim_disk_uuid); a join, rejoin or activation naming it for another peer gets nothing.
KEY_DISK_UUID_OWNER_PREFIX = "diskUUIDOwner"
# Nodes the admin designated control planes at their activation, by VPN IP: the node's WireGuard public
# key (a VPN IP given to another peer later inherits nothing). Coordinators are control planes anyway.
KEY_CONTROL_PLANE_PREFIX = "controlPlane"
# The cluster's init secret (init_secret.py), kept by the Coordinator to prove itself to the nodes it
# activates; like KMSData it must live on the encrypted state disk.
KEY_INIT_SECRET = "initSecret"
# Peers evicted after a failed re-attestation, by VPN IP (core/trust.py): JSON {vpn_ip, vpn_pub_key,
# public_ip, reason, ts}; public values only.
KEY_EVICTED_PREFIX = "evictedPeer"
# Bumped in the same transaction as every change of the evictions: every Coordinator sharing the store
# compares it with the version it holds and reloads the evictions only when it differs (core/trust.py).
# Not under KEY_EVICTED_PREFIX (a prefix scan of the evictions must not see it).
KEY_EVICTIONS_VERSION = "evictionsVersion"

# What a peer keeps for itself (its local store) when its Coordinators share the cluster's state in an
# etcd cluster (docs/store.md): its own node state, and the KMS settings and init secret it needs to
# start its etcd member after a restart (every Coordinator holds the same ones). Everything else is the
# cluster's.
LOCAL_KEYS = frozenset((KEY_NODE_STATE, KEY_KMS_DATA, KEY_INIT_SECRET))

_KMS_FIELDS = (("kms_uri", "KmsUri"), ("storage_uri", "StorageUri"), ("key_encryption_key_id", "KeyEncryptionKeyID"))
_NODE_B64_FIELDS = {"vpn_priv_key": 32, "owner_id": 32, "cluster_id": 32}


# --------------------------------------------------------------------------- peer state


def _peer_keys(registry: PeerRegistry) -> Dict[str, bytes]:
    """Every key (and value) that represents ``registry`` in the store."""
    state = registry.to_dict()
    peers, alloc = state["peers"], state["allocator"]
    out: Dict[str, bytes] = {}
    for record in registry.peers.peers.values():
        out[KEY_PEER_PREFIX + record.vpn_ip] = record.to_store_value()
    out[KEY_RESOURCE_VERSION] = str(peers["resource_version"]).encode("ascii")
    out[KEY_CHANGE_LOG] = json.dumps({k: peers[k] for k in ("max_log_changes", "log_floor", "log")},
                                     sort_keys=True, separators=(",", ":")).encode("utf-8")
    out[KEY_VPN_CIDR] = alloc["vpn_cidr"].encode("ascii")
    for kind in ("coordinator", "node"):
        out[KEY_NEXT_IP[kind]] = ipaddress.IPv4Address(alloc["next_%s_ip" % kind]).packed
        for ip in alloc["free_%s_ips" % kind]:
            out[KEY_FREE_PREFIX[kind] + ip] = b""
    return out


def _owned_prefixes():
    return (KEY_PEER_PREFIX, KEY_FREE_PREFIX["coordinator"], KEY_FREE_PREFIX["node"])


def write_peer_state(tx: Txn, state: Any) -> None:
    """Writes a peer state inside the caller's transaction ``tx`` (only what differs)."""
    registry = _registry(state)
    wanted = _peer_keys(registry)
    current: Dict[str, bytes] = {}
    for prefix in _owned_prefixes():
        current.update(tx.items(prefix))
    for key in (KEY_RESOURCE_VERSION, KEY_CHANGE_LOG, KEY_VPN_CIDR) + tuple(KEY_NEXT_IP.values()):
        value = tx.get_default(key)
        if value is not None:
            current[key] = value
    for key in sorted(set(current) - set(wanted)):
        tx.delete(key)
    for key, value in sorted(wanted.items()):
        if current.get(key) != value:
            tx.put(key, value)


def read_peer_state(tx: Txn) -> Optional[dict]:
    """The peer state (``PeerRegistry.to_dict()`` form) as of ``tx``, or None if none was saved."""
    version = tx.get_default(KEY_RESOURCE_VERSION)
    if version is None:
        return None
    try:
        log = json.loads(tx.get(KEY_CHANGE_LOG))
        peers = [PeerRecord.from_store_value(v).to_dict() for _k, v in tx.items(KEY_PEER_PREFIX)]
        alloc: Dict[str, Any] = {"vpn_cidr": tx.get(KEY_VPN_CIDR).decode("ascii")}
        for kind in ("coordinator", "node"):
            alloc["next_%s_ip" % kind] = str(ipaddress.IPv4Address(tx.get(KEY_NEXT_IP[kind])))
            prefix = KEY_FREE_PREFIX[kind]
            alloc["free_%s_ips" % kind] = sorted((k[len(prefix):] for k, _v in tx.items(prefix)),
                                                 key=lambda a: int(ipaddress.ip_address(a)))
        state = {"allocator": alloc,
                 "peers": {"resource_version": int(version.decode("ascii")), "max_log_changes": log["max_log_changes"],
                           "log_floor": log["log_floor"], "peers": peers, "log": log["log"]}}
        # Validates the whole (every peer's IP allocated, log consistent) and normalises the order.
        return PeerRegistry.from_dict(state).to_dict()
    except (InputError, KeyError, ValueError, TypeError, ipaddress.AddressValueError, UnicodeDecodeError) as err:
        raise StoreError("the stored peer state is inconsistent: %s" % err) from None


def save_peer_state(store, state: Any) -> None:
    """Persists a peer state (a ``PeerRegistry`` or its ``to_dict()``) in one transaction."""
    _registry(state)  # refuse bad input before touching the store
    store.update(lambda tx: write_peer_state(tx, state))


def load_peer_state(store) -> Optional[dict]:
    """The saved peer state (``PeerRegistry.to_dict()`` form), read in one transaction; None if none."""
    return store.update(read_peer_state)


def update_peer_registry(store, fn: Callable[[PeerRegistry], Any], vpn_cidr: Optional[str] = None) -> Any:
    """Read-modify-write of the peer set without lost updates: loads the registry (a new one over
    ``vpn_cidr`` if none is saved), calls ``fn(registry)``, writes the result, all in one transaction
    (re-run on a conflict, so ``fn`` must have no other side effects). Returns what ``fn`` returns."""

    def step(tx: Txn) -> Any:
        state = read_peer_state(tx)
        if state is not None:
            registry = PeerRegistry.from_dict(state)
        else:
            registry = PeerRegistry(vpn_cidr) if vpn_cidr else PeerRegistry()
        result = fn(registry)
        write_peer_state(tx, registry)
        return result

    return store.update(step)


def load_peer_registry(store) -> Optional[PeerRegistry]:
    state = load_peer_state(store)
    return None if state is None else PeerRegistry.from_dict(state)


def _registry(state: Any) -> PeerRegistry:
    if isinstance(state, PeerRegistry):
        return state
    if not isinstance(state, Mapping):
        raise InputError("peer_state", "a PeerRegistry or its to_dict()", type(state).__name__)
    try:
        return PeerRegistry.from_dict(state)
    except InputError:
        raise
    except (KeyError, ValueError, TypeError) as err:
        raise InputError("peer_state", "a PeerRegistry.to_dict() mapping", "%s: %s" % (type(err).__name__, err)) from None


# --------------------------------------------------------------------------- node state


def check_node_state(state: Any) -> dict:
    """A node state with its fields checked: role, vpn_ip, vpn_priv_key (b64 of 32 bytes) and, if
    present, owner_id / cluster_id (b64 of 32 bytes). Other JSON-serialisable fields are kept."""
    if not isinstance(state, Mapping):
        raise InputError("node_state", "a mapping", type(state).__name__)
    out = dict(state)
    for key in out:
        if not isinstance(key, str):
            raise InputError("node_state", "string field names", key)
    if out.get("role") not in ROLES:
        raise InputError("node_state.role", "one of %s" % ", ".join(ROLES), out.get("role"))
    try:
        out["vpn_ip"] = str(ipaddress.ip_address(out.get("vpn_ip")))
    except ValueError:
        raise InputError("node_state.vpn_ip", "an IP address", out.get("vpn_ip")) from None
    for field, size in _NODE_B64_FIELDS.items():
        if field not in out and field != "vpn_priv_key":
            continue
        value = out.get(field)
        try:
            ok = isinstance(value, str) and len(base64.b64decode(value.encode("ascii"), validate=True)) == size
        except (binascii.Error, UnicodeEncodeError):
            ok = False
        if not ok:
            # Never echo key material back.
            raise InputError("node_state." + field, "std-base64 of %d bytes" % size)
    try:
        json.dumps(out)
    except (TypeError, ValueError):
        raise InputError("node_state", "JSON-serialisable values") from None
    return out


def save_node_state(store, state: Mapping) -> None:
    checked = check_node_state(state)
    store.put(KEY_NODE_STATE, json.dumps(checked, sort_keys=True, separators=(",", ":")).encode("utf-8"))


def load_node_state(store) -> Optional[dict]:
    raw = store.get_default(KEY_NODE_STATE)
    if raw is None:
        return None
    try:
        return check_node_state(json.loads(raw))
    except (ValueError, InputError) as err:
        raise StoreError("the stored node state is invalid: %s" % err) from None


# --------------------------------------------------------------------------- node activations


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


# --------------------------------------------------------------------------- KMS settings


def save_kms_data(store, kms: Mapping) -> None:
    """``{"kms_uri", "storage_uri", "key_encryption_key_id"}`` as the Coordinator's ``KMSData``."""
    if not isinstance(kms, Mapping):
        raise InputError("kms_data", "a mapping", type(kms).__name__)
    unknown = set(kms) - {f for f, _g in _KMS_FIELDS}
    if unknown:
        raise InputError("kms_data", "only kms_uri, storage_uri, key_encryption_key_id", sorted(unknown))
    doc = {}
    for field, go_name in _KMS_FIELDS:
        value = kms.get(field, "")
        if not isinstance(value, str):
            raise InputError("kms_data." + field, "a string", type(value).__name__)
        doc[go_name] = value
    if not doc["KmsUri"]:
        raise InputError("kms_data.kms_uri", "a KMS URI such as kms://cluster-kms")
    store.put(KEY_KMS_DATA, json.dumps(doc, separators=(",", ":")).encode("utf-8"))


def load_kms_data(store) -> Optional[dict]:
    raw = store.get_default(KEY_KMS_DATA)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
        return {field: str(doc.get(go_name, "")) for field, go_name in _KMS_FIELDS}
    except (ValueError, AttributeError) as err:
        raise StoreError("the stored KMS settings are invalid: %s" % err) from None


# --------------------------------------------------------------------------- init secret, evictions


def save_init_secret(store, init_secret: bytes) -> None:
    store.put(KEY_INIT_SECRET, base64.b64encode(bytes(init_secret)))


def load_init_secret(store) -> Optional[bytes]:
    raw = store.get_default(KEY_INIT_SECRET)
    if raw is None:
        return None
    try:
        return base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise StoreError("the stored init secret is invalid") from None


def _bump_evictions_version(tx: Txn) -> int:
    raw = tx.get_default(KEY_EVICTIONS_VERSION)
    try:
        version = int(raw) + 1 if raw else 1
    except ValueError:
        version = 1
    tx.put(KEY_EVICTIONS_VERSION, str(version).encode("ascii"))
    return version


def save_eviction(store, vpn_ip: str, record: Mapping) -> int:
    """Records one eviction and bumps ``KEY_EVICTIONS_VERSION`` in one transaction; returns the new version."""
    key = KEY_EVICTED_PREFIX + str(ipaddress.ip_address(vpn_ip))
    value = json.dumps(dict(record), sort_keys=True, separators=(",", ":")).encode("utf-8")

    def write(tx: Txn) -> int:
        tx.put(key, value)
        return _bump_evictions_version(tx)

    return store.update(write)


def delete_eviction(store, vpn_ip: str) -> Optional[int]:
    """Forgets one eviction (re-admission); the new evictions version, or None if there was none."""
    key = KEY_EVICTED_PREFIX + str(ipaddress.ip_address(vpn_ip))

    def forget(tx: Txn) -> Optional[int]:
        if tx.get_default(key) is None:
            return None
        tx.delete(key)
        return _bump_evictions_version(tx)

    return store.update(forget)


def peek_evictions_version(store) -> Optional[int]:
    """The evictions version as the store's nearest copy has it (``Store.peek``: no majority needed);
    None if no eviction was ever recorded. StoreError if the store cannot answer."""
    raw = store.peek(KEY_EVICTIONS_VERSION)
    try:
        return int(raw) if raw else None
    except ValueError:
        raise StoreError("the stored evictions version is invalid") from None


def load_evictions(store, with_version: bool = False):
    """The evictions by VPN IP (``with_version``: and the evictions version they belong to, one
    transaction)."""
    def read(tx: Txn):
        out = {}
        for key, value in tx.items(KEY_EVICTED_PREFIX):
            try:
                out[key[len(KEY_EVICTED_PREFIX):]] = dict(json.loads(value))
            except (ValueError, TypeError) as err:
                raise StoreError("the stored eviction of %s is invalid: %s" % (key[len(KEY_EVICTED_PREFIX):], err)) \
                    from None
        if not with_version:
            return out
        raw = tx.get_default(KEY_EVICTIONS_VERSION)
        try:
            return out, int(raw) if raw else None
        except ValueError:
            raise StoreError("the stored evictions version is invalid") from None

    return store.update(read)


# --------------------------------------------------------------------------- local and cluster keys


def move_cluster_keys(local, cluster) -> int:
    """Moves every key but ``LOCAL_KEYS`` from the ``local`` store to ``cluster`` (SPEC 6.8: the first
    Coordinator's state goes to etcd when its member starts): written to ``cluster`` in one transaction,
    then deleted from ``local`` in one. A crash in between leaves stale copies in ``local`` that nothing
    reads: a Coordinator whose member has data reads the cluster's keys from etcd only. Returns how many
    keys moved."""
    entries = [(key, value) for key, value in local.items("") if key not in LOCAL_KEYS]

    def copy(tx: Txn) -> None:
        for key, value in entries:
            tx.put(key, value)

    def forget(tx: Txn) -> None:
        for key, _value in entries:
            tx.delete(key)

    if entries:
        cluster.update(copy)
        local.update(forget)
    return len(entries)
