# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Token buckets for a costly unauthenticated request (EnrollAK: agent/pubapi.py declares its budgets; an aTLS
handshake: rpc/server.py; the verification service: agent/verify_limit.py), per source and for all sources,
with an optional budget of its own for named sources (a Node's Coordinators)."""

from __future__ import annotations

import threading
import time
from typing import Callable, Collection, Dict, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils import errors


class RateLimit:
    """Token buckets for one costly unauthenticated request: one per source IP holding
    ``per_source`` = (burst, refill per second) and one for all sources holding ``total`` (None: no
    such bucket). ``take``
    consumes a token from both or from neither, and raises ``errors.RateLimited`` naming the limit.
    At most ``max_sources`` source buckets are kept (the fullest go first: they carry no debt).

    ``reserved`` = (budget, sources): a bucket of its own, holding ``budget``, for the sources that
    ``sources()`` names now (a Node's Coordinators); their requests take from it alone, so that no
    other source can drain it, and never from the others' buckets."""

    def __init__(self, what: str, per_source: Tuple[float, float], total: Optional[Tuple[float, float]],
                 max_sources: int = 4096, clock: Callable[[], float] = time.monotonic,
                 reserved: Optional[Tuple[Tuple[float, float], Callable[[], Collection[str]]]] = None):
        self.what = what
        self.per_source = (float(per_source[0]), float(per_source[1]))
        self.total = (float(total[0]), float(total[1])) if total is not None else None
        self.max_sources = max_sources
        self._clock = clock
        self._lock = threading.Lock()
        now = clock()
        self._total_bucket = [self.total[0], now] if self.total is not None else None
        self._buckets: Dict[str, list] = {}
        self.reserved = (float(reserved[0][0]), float(reserved[0][1])) if reserved is not None else None
        self._reserved_sources = reserved[1] if reserved is not None else None
        self._reserved_bucket = [self.reserved[0], now] if self.reserved is not None else None

    @staticmethod
    def _refill(bucket: list, limit: Tuple[float, float], now: float) -> float:
        bucket[0] = min(limit[0], bucket[0] + (now - bucket[1]) * limit[1])
        bucket[1] = now
        return bucket[0]

    def take(self, source: str) -> None:
        if self._reserved_sources is not None and source in self._reserved_sources():
            with self._lock:
                if self._refill(self._reserved_bucket, self.reserved, self._clock()) < 1:
                    raise errors.RateLimited("%s: rate limited for %s (its own budget: a burst of %g, then %g per "
                                             "second); try again later" % (self.what, source, *self.reserved))
                self._reserved_bucket[0] -= 1
            return
        with self._lock:
            now = self._clock()
            bucket = self._buckets.get(source)
            if bucket is None:
                if len(self._buckets) >= self.max_sources:
                    def fullest(k):
                        return -self._refill(self._buckets[k], self.per_source, now)

                    for key in sorted(self._buckets, key=fullest)[:self.max_sources // 4 or 1]:
                        del self._buckets[key]
                bucket = self._buckets[source] = [self.per_source[0], now]
            if self._refill(bucket, self.per_source, now) < 1:
                raise errors.RateLimited("%s: rate limited for %s (a burst of %g, then %g per second from one "
                                         "source); try again later" % (self.what, source, self.per_source[0],
                                                                       self.per_source[1]))
            if self._total_bucket is not None and self._refill(self._total_bucket, self.total, now) < 1:
                raise errors.RateLimited("%s: rate limited (a burst of %g, then %g per second from all sources); "
                                         "try again later" % (self.what, self.total[0], self.total[1]))
            bucket[0] -= 1
            if self._total_bucket is not None:
                self._total_bucket[0] -= 1
