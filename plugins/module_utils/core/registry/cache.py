# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Coordinator's peer registry in memory: the source of truth for reads, written through the store.

Every Node polls ``GetUpdate`` and every vpnapi connection asks whether its source is a peer; loading
and validating the whole registry from the store for each (what the Coordinator did before 0.3.0)
costs O(peers) per poll (46 ms at 1,000 peers on etcd). Here:

* reads (``current()``) return the registry as last committed, without touching the store; the store
  is read once, on the first read or by ``reload()`` (a restart);
* writes (``update(fn)``) run ``state_store.update_peer_registry`` unchanged (load, ``fn``, write, one
  transaction, retried on conflict) and publish the registry of the committed attempt only after the
  transaction returned: nothing is visible that the store does not hold;
* writers are serialised by a lock, so registries are published in commit order; readers take no
  lock: they read one reference to a registry that is never changed after it is published (each
  transaction attempt builds its own from the store), so a reader never sees a half-applied change.

With one Coordinator per store, this process is the only writer of the peer keys and reads never
touch the store. With several Coordinators on one etcd cluster (``shared``: the store lists more than
one etcd endpoint, docs/store.md), another Coordinator may have written: a read first compares the
store's ``peersResourceVersion`` (one key, read from the Coordinator's own etcd member; at most once per
``FOLLOW_INTERVAL``, so a burst of polls shares one read) with the version in memory and reloads when they
differ, so every Coordinator answers the same version with the same peer set. If the store cannot be read then
(no quorum), the registry in memory is served: Nodes keep their mesh while writes stop.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.core.records import state_store
from ansible_collections.constellation.cluster.plugins.module_utils.errors import StateError
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_set import PeerRegistry


def shared_by_coordinators(store: Any) -> bool:
    """Whether other Coordinators may write ``store`` too: an etcd store with more than one endpoint."""
    return len(getattr(store, "endpoints", None) or ()) > 1


# With several Coordinators: how long a version check of the shared store holds (seconds). Polls closer
# together than this share one read; another Coordinator's commit is seen at most this much later.
FOLLOW_INTERVAL = 0.1


class PeerRegistryCache:
    def __init__(self, store: Any, shared: Optional[bool] = None, follow_interval: float = FOLLOW_INTERVAL,
                 clock: Callable[[], float] = time.monotonic):
        self._store = store
        self.shared = shared_by_coordinators(store) if shared is None else shared
        self.follow_interval = follow_interval
        self._clock = clock
        self._checked_at = float("-inf")
        self._write_lock = threading.Lock()
        self._current: Optional[PeerRegistry] = None
        self._loaded = False
        # Long polls (vpnapi GetUpdate ``wait``) sleep on this until a new registry is published here.
        self._changed = threading.Condition()
        self._generation = 0

    def current(self) -> Optional[PeerRegistry]:
        """The committed registry (None if none was ever saved). Do not change it: it is shared."""
        if not self._loaded:
            with self._write_lock:
                if not self._loaded:
                    self._load()
        elif self.shared:
            self._follow()
        return self._current

    def _follow(self) -> None:
        """Reloads if another Coordinator committed a version this process has not seen (checked at most
        once per ``follow_interval``)."""
        now = self._clock()
        if now - self._checked_at < self.follow_interval:
            return
        self._checked_at = now
        try:
            # The member's own copy (no majority needed, a little behind at worst: the next poll catches up);
            # a linearizable read would block every poll for the store's timeout while a majority is lost.
            raw = self._store.peek(state_store.KEY_RESOURCE_VERSION)
            stored = int(raw) if raw else None
        except (StateError, ValueError):
            return  # the store cannot say: serve what is in memory
        held = self._current.peers.version if self._current is not None else None
        if stored != held:
            with self._write_lock:
                try:
                    self._load()
                except StateError:
                    pass

    def reload(self) -> Optional[PeerRegistry]:
        """Reads the registry from the store again (start-up, restart, recovery)."""
        with self._write_lock:
            self._load()
            return self._current

    def _load(self) -> None:
        self._current = state_store.load_peer_registry(self._store)
        self._loaded = True
        self._publish()

    def _publish(self) -> None:
        """Wakes the waiters of ``wait_for_change`` (called with ``_write_lock`` held: that, then ``_changed``)."""
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    def wait_for_change(self, version: Optional[int], timeout: float) -> None:
        """Returns when the current registry's version is not ``version`` (at once if it already is not), or
        after ``timeout`` seconds. With several Coordinators another one's commit is seen here only once this
        process reads the registry again (``current``): a waiter should look again now and then."""
        with self._changed:
            generation = self._generation
        registry = self.current()  # never called holding _changed (it may take _write_lock)
        if (registry.peers.version if registry is not None else None) != version:
            return
        with self._changed:
            if self._generation == generation:
                self._changed.wait(timeout)

    def update(self, fn: Callable[[PeerRegistry], Any], vpn_cidr: Optional[str] = None) -> Any:
        """``state_store.update_peer_registry(store, fn, vpn_cidr)``, then the committed registry becomes
        current. ``fn`` may run more than once (conflicts); only the committed run's registry is kept."""
        committed = []

        def step(registry: PeerRegistry) -> Any:
            result = fn(registry)
            committed[:] = [registry]
            return result

        with self._write_lock:
            result = state_store.update_peer_registry(self._store, step, vpn_cidr)
            # Reached only once the transaction committed; a failed one raised and published nothing.
            self._current = committed[0]
            self._loaded = True
            self._publish()
        return result

    def is_known_peer_ip(self, vpn_ip: str) -> bool:
        registry = self.current()
        return registry is not None and registry.peers.get(vpn_ip) is not None
