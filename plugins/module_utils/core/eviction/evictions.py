# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Evictions as the cluster's shared state (docs/agent.md, "Re-attestation and eviction"; docs/store.md,
"Several Coordinators"): the evicted peers every Coordinator refuses (``EvictionCache``; ``Evictions``, the
service that answers ``is_evicted``, ``require_not_evicted``, ``check_readmission`` and ``clear_eviction`` for
the vpnapi, the Kubernetes join, node activation and re-attestation), and the etcd side of evicting a
Coordinator (``remove_coordinator_member``)."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.core.eviction import eviction_store
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.cache import FOLLOW_INTERVAL
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    REASON_EVICTED,
    REASON_UNVERIFIED,
    AccessDenied,
    ConstellationError,
    StateError,
)

if TYPE_CHECKING:  # pragma: no cover
    from ansible_collections.constellation.cluster.plugins.module_utils.core.context import PeerContext

# An evicted Coordinator's etcd member: removed, or kept (no live majority would remain without it);
# the ``etcd_member`` field of its eviction (GetState ``evicted``).
MEMBER_KEPT = "kept"
MEMBER_REMOVED = "removed"


def remove_coordinator_member(context: PeerContext, vpn_ip: str) -> Optional[str]:
    """The leader evicts the Coordinator at ``vpn_ip``: its etcd member leaves the cluster
    (``coordinator_removal.evict_member``). None when it left (or there was none: a Coordinator without a
    shared store); why not when the members that remain would not hold a live majority."""
    if not context.shares_state():
        return None
    from ansible_collections.constellation.cluster.plugins.module_utils.core.coordinator_removal import evict_member

    result = evict_member(context.store, vpn_ip, context.vpn_ip)
    if result["removed"] is not None:
        context.log("coordinator_member_removed", coordinator_vpn_ip=vpn_ip, member=result["removed"]["name"],
                    members=result["members"])
    return result["held"]


class EvictionCache:
    """The evicted peers in memory, written through the store (``eviction_store.save_eviction``): reads take
    no lock and one reference to a dict that is never changed after it is published. With several
    Coordinators on one store (``shared``), a read first compares the store's evictions version (one key,
    ``Store.peek``: the member's own copy, no majority needed) with the one in memory, at most once per
    ``follow_interval`` (a burst of requests shares one read), and reloads the evictions when they
    differ; if the store cannot answer, the evictions in memory are served. ``peeks`` and ``reloads``
    count the store reads (for the cost measurement in docs/store.md)."""

    def __init__(self, store: Any, shared: bool, follow_interval: float = FOLLOW_INTERVAL,
                 clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.shared = shared
        self.follow_interval = follow_interval
        self._clock = clock
        self._checked_at = float("-inf")
        self._lock = threading.Lock()
        self._current: Dict[str, dict] = {}
        self._unverified: Dict[str, dict] = {}
        self._version: Optional[int] = None
        self._loaded = False
        self.peeks = 0
        self.reloads = 0

    def current(self) -> Dict[str, dict]:
        """The evictions by VPN IP. Do not change the dict: it is shared."""
        if not self._loaded:
            with self._lock:
                if not self._loaded:
                    self._load()
        elif self.shared:
            self._follow()
        return self._current

    def unverified(self) -> Dict[str, dict]:
        """The unverified peers by VPN IP (followed as the evictions are). Do not change the dict: it is shared."""
        self.current()
        return self._unverified

    def _load(self) -> None:
        self._current, self._unverified, self._version = eviction_store.load_evictions(
            self.store, with_version=True, with_unverified=True)
        self._loaded = True
        self.reloads += 1

    def reload(self) -> Dict[str, dict]:
        with self._lock:
            self._load()
            return self._current

    def _follow(self) -> None:
        now = self._clock()
        if now - self._checked_at < self.follow_interval:
            return
        self._checked_at = now
        try:
            self.peeks += 1
            stored = eviction_store.peek_evictions_version(self.store)
        except ConstellationError:
            return  # the store cannot say: serve what is in memory
        if stored != self._version:
            with self._lock:
                try:
                    self._load()
                except ConstellationError:
                    pass

    def record(self, vpn_ip: str, eviction: Mapping[str, Any]) -> None:
        """Writes one eviction, then publishes the evictions as the store holds them (another Coordinator
        may have written since our last read); if that read fails, ours is added to what we had."""
        self._write("_current", lambda: eviction_store.save_eviction(self.store, vpn_ip, eviction), vpn_ip, eviction)

    def forget(self, vpn_ip: str) -> None:
        self._write("_current", lambda: eviction_store.delete_eviction(self.store, vpn_ip), vpn_ip, None)

    def record_unverified(self, vpn_ip: str, record: Mapping[str, Any]) -> None:
        """Writes one unverified peer, then publishes what the store holds (as ``record``)."""
        self._write("_unverified", lambda: eviction_store.save_unverified(self.store, vpn_ip, record), vpn_ip, record)

    def forget_unverified(self, vpn_ip: str) -> None:
        self._write("_unverified", lambda: eviction_store.delete_unverified(self.store, vpn_ip), vpn_ip, None)

    def _write(self, attr: str, write: Callable[[], None], vpn_ip: str, record: Optional[Mapping[str, Any]]) -> None:
        """``write`` (one store transaction), then the evictions and unverified peers as the store holds them;
        if that read fails, the change alone is applied to the dict in ``attr`` (``record`` None: removed), and
        the next read in a shared store reloads."""
        with self._lock:
            write()
            try:
                self._load()
            except ConstellationError:
                changed = dict(getattr(self, attr))
                if record is None:
                    changed.pop(vpn_ip, None)
                else:
                    changed[vpn_ip] = dict(record)
                setattr(self, attr, changed)
                self._version = None


class Evictions:
    """The evicted peers of the store the peer uses now (a new cache when it moved its state to etcd)."""

    def __init__(self, context: PeerContext):
        self.context = context
        self._cache: Optional[EvictionCache] = None

    def cache(self) -> EvictionCache:
        cache = self._cache
        store = self.context.store
        if cache is None or cache.store is not store:
            # The cluster's store is shared once it is not this peer's own (etcd).
            cache = EvictionCache(store, shared=store is not self.context.local_store or bool(self.context.peer_registry.shared))
            self._cache = cache
        return cache

    def reload(self) -> None:
        self.cache().reload()

    @property
    def evicted(self) -> Dict[str, dict]:
        return dict(self.cache().current())

    def is_evicted(self, vpn_ip: str) -> bool:
        """O(1) from memory (with several Coordinators, plus one version read of the shared store at most
        every ``FOLLOW_INTERVAL``): the vpnapi and the pubapi ask this for every request."""
        return vpn_ip in self.cache().current()

    def require_not_evicted(self, vpn_ip: str, method: str) -> None:
        if self.is_evicted(vpn_ip):
            raise AccessDenied("%s: %s was evicted from this cluster (it failed re-attestation); it is re-admitted "
                               "only through add_nodes.yml after it passes again" % (method, vpn_ip)).with_reason(
                                   REASON_EVICTED)

    def record(self, vpn_ip: str, eviction: Mapping[str, Any]) -> None:
        self.cache().record(vpn_ip, eviction)
        if vpn_ip in self.cache().unverified():  # evicted: no longer merely unverified
            self.cache().forget_unverified(vpn_ip)

    # -- unverified peers (core/eviction/peer_trust.py): not re-attested for a while, not evicted (yet)
    @property
    def unverified(self) -> Dict[str, dict]:
        return dict(self.cache().unverified())

    def is_unverified(self, vpn_ip: str) -> bool:
        return vpn_ip in self.cache().unverified()

    def mark_unverified(self, vpn_ip: str, record: Mapping[str, Any]) -> None:
        self.cache().record_unverified(vpn_ip, record)

    def clear_unverified(self, vpn_ip: str) -> bool:
        """The peer passed a fresh attestation (re-attestation or a rejoin). True if it was unverified."""
        if vpn_ip not in self.cache().unverified():
            return False
        self.cache().forget_unverified(vpn_ip)
        return True

    def require_verified(self, vpn_ip: str, method: str) -> None:
        """Before a new secret goes to a peer (a data key, its disk key, Kubernetes join material or a
        kubelet certificate): AccessDenied for an evicted peer and for an unverified one."""
        self.require_not_evicted(vpn_ip, method)
        if self.is_unverified(vpn_ip):
            raise AccessDenied("%s: %s could not be re-attested for a while (unverified): it gets no new secret "
                               "until a re-attestation passes again" % (method, vpn_ip)).with_reason(REASON_UNVERIFIED)

    def check_readmission(self, vpn_ip: str, vpn_pub_key: str) -> bool:
        """Before an evicted Node is recorded again (ActivateAdditionalNodes): it must come back with the
        key it was evicted with. True if ``vpn_ip`` is evicted."""
        eviction = self.evicted.get(vpn_ip)
        if eviction is None:
            return False
        if eviction.get("vpn_pub_key") != vpn_pub_key:
            raise StateError("%s was evicted with another WireGuard key: it is not re-admitted" % vpn_ip)
        return True

    def clear_eviction(self, vpn_ip: str) -> None:
        """The Node passed attestation again and is a peer again (ActivateAdditionalNodes)."""
        self.cache().forget(vpn_ip)
        self.context.log("peer_readmitted", vpn_ip=vpn_ip)
