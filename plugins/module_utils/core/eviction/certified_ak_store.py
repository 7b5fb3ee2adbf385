# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The AKs this agent certified (qemu-vtpm-ek, attestation/ek.py ``CertifiedAKs``), kept in its own sealed store
(the agent's local store, encrypted with the storage key: core/at_rest.py), so that a restarted Coordinator
re-attests its peers without enrolling every AK again (docs/agent.md, "Re-attestation and eviction").

A record holds no secret (the AK's public area, the EK certificate and the intermediates the TPM offered), but it
vouches that the AK lives in that TPM, which only the credential activation proved: it is kept where nobody without
the storage key can write it. At start every stored record is checked again against the EK roots configured now
(as a new one is); one that no longer chains is dropped from the store. At most as many records as the registry
keeps (``CertifiedAKs.max_records``; the oldest certified go first), one store key each (``certifiedAK`` + the
SHA-256 of the AK's public area)."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, Callable, List, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.core.records.state_store import KEY_CERTIFIED_AK_PREFIX
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils.store import StoreError, Txn
MAX_REASON = 300


def _key(ak_pub: bytes) -> str:
    return KEY_CERTIFIED_AK_PREFIX + hashlib.sha256(ak_pub).hexdigest()


def load_certified_aks(store) -> List[Tuple[str, dict]]:
    """The stored records, oldest first: (store key, record dict with ``ts``). A value that is not JSON is
    returned as an empty dict (the caller drops it)."""
    out = []
    for key, value in store.items(KEY_CERTIFIED_AK_PREFIX):
        try:
            data = json.loads(value)
        except ValueError:
            data = {}
        out.append((key, data if isinstance(data, dict) else {}))
    out.sort(key=lambda item: item[1].get("ts") if isinstance(item[1].get("ts"), (int, float)) else 0)
    return out


def save_certified_ak(store, ak_pub: bytes, record: dict, limit: int,
                      clock: Callable[[], float] = time.time) -> None:
    """Writes one record (with when it was certified); beyond ``limit`` the oldest go, in the same transaction."""
    key = _key(ak_pub)
    value = json.dumps(dict(record, ts=round(clock(), 3)), sort_keys=True, separators=(",", ":")).encode("utf-8")

    def write(tx: Txn) -> None:
        tx.put(key, value)
        stored = tx.items(KEY_CERTIFIED_AK_PREFIX)
        if len(stored) + (0 if any(k == key for k, _v in stored) else 1) <= limit:
            return

        def age(item):
            try:
                return float(json.loads(item[1]).get("ts", 0))
            except (ValueError, TypeError, AttributeError):
                return 0.0
        others = sorted((item for item in stored if item[0] != key), key=age)
        for old_key, _value in others[:len(others) + 1 - limit]:
            tx.delete(old_key)

    store.update(write)


def keep_certified_aks(certified_aks: Any, store, log: Optional[Callable[..., None]] = None) -> int:
    """Loads the stored records into ``certified_aks`` (an ``ek.CertifiedAKs``; None: a variant that certifies
    no AKs, nothing to do), each checked again against the EK roots (``CertifiedAKs.restore``); a record that
    does not hold is dropped from the store and logged. Then every new certification is written through
    (``on_add``; a failed write is logged: the AK is enrolled again after a restart). Returns how many were
    loaded."""
    log = log or (lambda event, **fields: None)
    if certified_aks is None or not hasattr(certified_aks, "restore"):
        return 0
    loaded = 0
    for key, data in load_certified_aks(store)[-certified_aks.max_records:]:
        try:
            certified_aks.restore({k: v for k, v in data.items() if k != "ts"})
            loaded += 1
        except ConstellationError as err:
            log("certified_ak_dropped", level="warning", key=key, reason=str(err)[:MAX_REASON])
            store.update(lambda tx, k=key: tx.delete(k))

    def write_through(record) -> None:
        try:
            save_certified_ak(store, record.ak_pub, record.to_dict(), certified_aks.max_records)
        except StoreError as err:
            log("certified_ak_unsaved", level="warning", error=str(err)[:MAX_REASON])

    certified_aks.on_add = write_through
    log("certified_aks_loaded", count=loaded)
    return loaded
