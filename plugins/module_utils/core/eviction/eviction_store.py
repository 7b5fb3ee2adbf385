# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The evicted peers in the store (docs/agent.md, "Re-attestation and eviction"): one record per peer and
a version every Coordinator sharing the store compares with its own (core/eviction/evictions.py ``EvictionCache``).
The store's other records: core/records/state_store.py."""

from __future__ import annotations

import ipaddress
import json
from typing import Mapping, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.store import StoreError, Txn

# Peers evicted after a failed re-attestation, by VPN IP (core/eviction/peer_trust.py): JSON {vpn_ip, vpn_pub_key,
# public_ip, reason, ts}; public values only.
KEY_EVICTED_PREFIX = "evictedPeer"
# Peers that could not be re-attested for ``reattest_unreachable_limit`` rounds (core/eviction/peer_trust.py): JSON {vpn_ip,
# vpn_pub_key, public_ip, role, since, error}; ``since``: when their unreachable rounds began (wall clock). They
# get no new secret until a re-attestation passes; evicted after ``unverified_eviction_after`` seconds.
KEY_UNVERIFIED_PREFIX = "unverifiedPeer"
# Bumped in the same transaction as every change of the evictions (and of the unverified peers): every Coordinator sharing the store
# compares it with the version it holds and reloads the evictions only when it differs (core/eviction/peer_trust.py).
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
    return _save(store, KEY_EVICTED_PREFIX + str(ipaddress.ip_address(vpn_ip)), record)


def save_unverified(store, vpn_ip: str, record: Mapping) -> int:
    """Records one unverified peer and bumps ``KEY_EVICTIONS_VERSION`` (one transaction); the new version."""
    return _save(store, KEY_UNVERIFIED_PREFIX + str(ipaddress.ip_address(vpn_ip)), record)


def _save(store, key: str, record: Mapping) -> int:
    """Puts ``record`` (JSON) at ``key`` and bumps ``KEY_EVICTIONS_VERSION`` in one transaction; the new version."""
    value = json.dumps(dict(record), sort_keys=True, separators=(",", ":")).encode("utf-8")

    def write(tx: Txn) -> int:
        tx.put(key, value)
        return _bump_evictions_version(tx)

    return store.update(write)


def delete_unverified(store, vpn_ip: str) -> Optional[int]:
    """Forgets one unverified peer (it passed re-attestation, or was evicted); the new version, or None."""
    return _forget(store, KEY_UNVERIFIED_PREFIX + str(ipaddress.ip_address(vpn_ip)))


def delete_eviction(store, vpn_ip: str) -> Optional[int]:
    """Forgets one eviction (re-admission); the new evictions version, or None if there was none."""
    return _forget(store, KEY_EVICTED_PREFIX + str(ipaddress.ip_address(vpn_ip)))


def _forget(store, key: str) -> Optional[int]:
    """Deletes ``key`` and bumps ``KEY_EVICTIONS_VERSION`` (one transaction); the new version, or None if absent."""

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


def _records(tx: Txn, prefix: str, what: str) -> dict:
    out = {}
    for key, value in tx.items(prefix):
        try:
            out[key[len(prefix):]] = dict(json.loads(value))
        except (ValueError, TypeError) as err:
            raise StoreError("the stored %s of %s is invalid: %s" % (what, key[len(prefix):], err)) from None
    return out


def load_evictions(store, with_version: bool = False, with_unverified: bool = False):
    """The evictions by VPN IP (``with_version``: and the evictions version they belong to;
    ``with_unverified``: and the unverified peers; one transaction)."""
    def read(tx: Txn):
        out = _records(tx, KEY_EVICTED_PREFIX, "eviction")
        if with_unverified:
            out = (out, _records(tx, KEY_UNVERIFIED_PREFIX, "unverified peer"))
        if not with_version:
            return out
        raw = tx.get_default(KEY_EVICTIONS_VERSION)
        try:
            if with_unverified:
                return out[0], out[1], int(raw) if raw else None
            return out, int(raw) if raw else None
        except ValueError:
            raise StoreError("the stored evictions version is invalid") from None

    return store.update(read)
