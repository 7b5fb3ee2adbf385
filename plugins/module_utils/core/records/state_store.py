# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A peer's persisted state, as typed records on top of a store (``store.py``), in the
Coordinator's key layout (docs/store.md, "Typed records"): the peer registry, the node state, the KMS settings and the init
secret; what the Coordinator records about the nodes it activates is core/records/node_records.py, the evictions
core/eviction/eviction_store.py. (Named ``peerstore.py`` before 0.2.0; it always held more than peers.)

* Peer state (``peer_set.PeerRegistry.to_dict()``): the peers, their resource version, the change log
  and the VPN IP allocator are written and read in ONE transaction, so a reader never sees a peer
  without its version or an allocator that has not yet counted a peer's IP. Only keys whose value
  changes are written (one new peer = a handful of operations, whatever the cluster's size).
* Node state (``nodeState``): ``{role, vpn_ip, vpn_priv_key (b64), owner_id (b64), cluster_id (b64), ...}``.
* KMS settings (``KMSData``): Go JSON ``{"KmsUri", "StorageUri", "KeyEncryptionKeyID"}``.

Key layout (values): ``peerPrefix<vpnIP>`` (Go JSON of the peer), ``peersResourceVersion`` (decimal),
``peersChangeLog`` (JSON: max_log_changes, log_floor, log), ``vpnCIDR`` (text),
``highestAvailableCoordinatorIP`` / ``highestAvailableNodeIP`` (the next unused address, 4 raw bytes),
``freeCoordinatorVPNIPs<ip>`` / ``freeNodeVPNIPs<ip>`` (empty values), ``podCIDRAllocator`` (JSON of the pod CIDR
allocator and its reservations; absent without the pod network).
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
from typing import Any, Callable, Dict, Mapping, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_set import PeerRegistry
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_record import (
    ROLES,
    STORE_PEER_PREFIX,
    STORE_RESOURCE_VERSION,
    PeerRecord,
)
from ansible_collections.constellation.cluster.plugins.module_utils.store import StoreError, Txn

KEY_PEER_PREFIX = STORE_PEER_PREFIX
KEY_RESOURCE_VERSION = STORE_RESOURCE_VERSION
KEY_CHANGE_LOG = "peersChangeLog"
KEY_VPN_CIDR = "vpnCIDR"
KEY_NEXT_IP = {"coordinator": "highestAvailableCoordinatorIP", "node": "highestAvailableNodeIP"}
KEY_FREE_PREFIX = {"coordinator": "freeCoordinatorVPNIPs", "node": "freeNodeVPNIPs"}
KEY_POD_CIDRS = "podCIDRAllocator"
KEY_NODE_STATE = "nodeState"
KEY_KMS_DATA = "KMSData"
KEY_MASTER_SECRET = "masterSecret"
KEY_CLUSTER_ID = "clusterID"
KEY_KEK_ID = "kekID"
KEY_KUBECONFIG = "kubeConfig"
KEY_STATE = "state"
# The cluster's init secret (init_secret.py), kept by the Coordinator to prove itself to the nodes it
# activates; like KMSData it must live on the encrypted state disk.
KEY_INIT_SECRET = "initSecret"
# What a peer keeps for itself (its local store) when its Coordinators share the cluster's state in an
# etcd cluster (docs/store.md): its own node state, and the KMS settings and init secret it needs to
# start its etcd member after a restart (every Coordinator holds the same ones). Everything else is the
# cluster's.
LOCAL_KEYS = frozenset((KEY_NODE_STATE, KEY_KMS_DATA, KEY_INIT_SECRET))
# The AKs this agent certified (core/eviction/certified_ak_store.py): its own too, one key per AK under this prefix.
KEY_CERTIFIED_AK_PREFIX = "certifiedAK"
LOCAL_PREFIXES = (KEY_CERTIFIED_AK_PREFIX,)

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
    if "pod_cidrs" in state:
        out[KEY_POD_CIDRS] = json.dumps(state["pod_cidrs"], sort_keys=True, separators=(",", ":")).encode("utf-8")
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
    for key in (KEY_RESOURCE_VERSION, KEY_CHANGE_LOG, KEY_VPN_CIDR, KEY_POD_CIDRS) + tuple(KEY_NEXT_IP.values()):
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
        pod_cidrs = tx.get_default(KEY_POD_CIDRS)
        if pod_cidrs is not None:
            state["pod_cidrs"] = json.loads(pod_cidrs)
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


# --------------------------------------------------------------------------- init secret


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


# --------------------------------------------------------------------------- local and cluster keys


def move_cluster_keys(local, cluster) -> int:
    """Moves every key but ``LOCAL_KEYS`` (and ``LOCAL_PREFIXES``) from the ``local`` store to ``cluster`` (docs/store.md, "Typed records": the first
    Coordinator's state goes to etcd when its member starts): written to ``cluster`` in one transaction,
    then deleted from ``local`` in one. A crash in between leaves stale copies in ``local`` that nothing
    reads: a Coordinator whose member has data reads the cluster's keys from etcd only. Returns how many
    keys moved."""
    entries = [(key, value) for key, value in local.items("") if key not in LOCAL_KEYS and not key.startswith(LOCAL_PREFIXES)]

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
