# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which Coordinator runs the cluster-wide duties: one at a time, elected through the store.

With an etcd store shared by several Coordinators, the leader holds a key under an etcd lease
(``store.lead``) and renews it with every ``step()``; when it dies or loses the store, the lease runs
out and the next Coordinator's step takes the key. A Coordinator acts as leader only while it is
sure nobody else can be: until ``ttl`` seconds after the start of its last successful step (the
lease cannot have run out before then). A store that one Coordinator alone uses (file, memory) has
no rival: its holder always leads.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError

LEADER_KEY = "coordinatorLeader"
DEFAULT_TTL = 5


class Leadership:
    """``step()`` every ``ttl / 3`` seconds or so; ``leads()`` says whether to run the duties now."""

    def __init__(self, store, holder: str, ttl: int = DEFAULT_TTL, key: str = LEADER_KEY,
                 clock: Callable[[], float] = time.monotonic):
        if not isinstance(holder, str) or not holder:
            raise InputError("holder", "a non-empty name of this Coordinator", holder)
        if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 1:
            raise InputError("ttl", "a whole number of seconds >= 1", ttl)
        self.store = store
        self.holder = holder
        self.ttl = ttl
        self.key = key
        self._clock = clock
        self._lease: Optional[int] = None
        self._sure_until = float("-inf")
        self.current: str = ""  # the holder seen by the last successful step ("" before one)
        self.last_error: str = ""

    def step(self) -> bool:
        """Renews or takes the leadership; True if this Coordinator leads now. A store error is kept
        in ``last_error`` (not raised): the leadership then lapses when its lease could have."""
        started = self._clock()
        try:
            self.current, self._lease = self.store.lead(self.key, self.holder, self.ttl, self._lease)
        except StateError as err:
            self.last_error = str(err)
            return self.leads()
        self.last_error = ""
        self._sure_until = started + self.ttl if self.current == self.holder else float("-inf")
        return self.leads()

    def leads(self) -> bool:
        return self._clock() < self._sure_until

    def resign(self) -> None:
        """Hands the leadership over at once (the next Coordinator's step takes it)."""
        self._sure_until = float("-inf")
        lease, self._lease = self._lease, None
        try:
            self.store.resign(self.key, self.holder, lease)
        except StateError as err:
            self.last_error = str(err)
