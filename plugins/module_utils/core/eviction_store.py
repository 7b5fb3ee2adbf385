# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The evicted peers in the store (docs/agent.md, "Re-attestation and eviction"): one record per peer and
a version every Coordinator sharing the store compares with its own (core/evictions.py ``EvictionCache``).
The store's other records: core/state_store.py."""

from __future__ import annotations

import ipaddress
import json
from typing import Mapping, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.store import StoreError, Txn

# Peers evicted after a failed re-attestation, by VPN IP (core/trust.py): JSON {vpn_ip, vpn_pub_key,
# public_ip, reason, ts}; public values only.
KEY_EVICTED_PREFIX = "evictedPeer"
# Bumped in the same transaction as every change of the evictions: every Coordinator sharing the store
# compares it with the version it holds and reloads the evictions only when it differs (core/trust.py).
# Not under KEY_EVICTED_PREFIX (a prefix scan of the evictions must not see it).
KEY_EVICTIONS_VERSION = "evictionsVersion"


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
