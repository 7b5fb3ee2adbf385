# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent's re-attestation thread (docs/agent.md, "Re-attestation and eviction"): every peer is re-attested
once per ``reattest_interval`` (core/eviction/peer_trust.py ``PeerTrust.reattest_peers``), on the leader only where several
Coordinators share the duties (core/leadership.py).

Spread over the interval, not all at once: each peer has a stable offset in the interval (from a hash
of its VPN IP, ``spread_offset``), and a cycle re-attests, every ``tick``, the peers whose offset has come
(``due``). A Coordinator with 5,000 Nodes does ~83 re-attestations a second, not 5,000 in a burst that
would delay the polls behind it. A peer added during a cycle is first re-attested in the next (within one
interval, as before); a cycle that overruns its interval (a slow round) starts the next at once. The
unreachable count and the eviction after ``unreachable_limit`` (core/eviction/peer_trust.py) are per peer and unchanged:
one re-attestation of each peer per cycle.
"""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any, Callable, Collection, Dict, List, Optional, Protocol, Sequence, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.core.state import State
from ansible_collections.constellation.cluster.plugins.module_utils.core.eviction.peer_trust import (
    EVICTED, MAX_REASON, UNVERIFIED, UNVERIFIED_EVICTION_AFTER)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError

MAX_TICK = 1.0  # seconds between the batches of a cycle, at most (interval / 10 when shorter)


class Reattester(Protocol):
    """What the loop drives (core/eviction/peer_trust.py ``PeerTrust``)."""

    @property
    def state(self) -> State:
        """The peer's state."""

    def reattest_targets(self) -> List[str]:
        """The VPN IPs of the peers to re-attest."""

    def reattest_peers(self, connect_peer: Callable[[str], Any], workers: int = 4,
                       unreachable_limit: int = 3, only: Optional[Collection[str]] = None,
                       unverified_eviction_after: float = UNVERIFIED_EVICTION_AFTER) -> List[Dict[str, Any]]:
        """Re-attests ``only`` these peers (None: all); one row per peer."""


def spread_offset(vpn_ip: str, interval: float) -> float:
    """The peer's stable offset in [0, interval): the same each cycle and after a restart, spread evenly."""
    digest = hashlib.sha256(vpn_ip.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64 * interval


def due(schedule: Sequence[Tuple[float, str]], elapsed: float, tick: float) -> Tuple[List[str], int]:
    """Of ``schedule`` (sorted (offset, vpn_ip)), the peers due ``elapsed`` seconds into the cycle: every offset
    before ``elapsed + tick`` (at most one tick early, so a batch is one tick's share). Returns (their VPN IPs,
    how many of the schedule they are from its start)."""
    count = 0
    while count < len(schedule) and schedule[count][0] < elapsed + tick:
        count += 1
    return [ip for _offset, ip in schedule[:count]], count


class ReattestLoop:
    """The agent's re-attestation thread: each peer once per ``interval`` seconds, at its offset, while the
    peer is an activated Coordinator (``core`` is a ``PeerTrust``, or anything with ``state``,
    ``reattest_targets`` and ``reattest_peers``). ``clock``: monotonic seconds (a test's fake clock, whose
    ``stop.wait`` advances it)."""

    def __init__(self, core: Reattester, connect_peer, interval: float, workers: int, unreachable_limit: int,
                 stop: threading.Event, log=None, leadership=None, clock: Callable[[], float] = time.monotonic,
                 unverified_eviction_after: float = UNVERIFIED_EVICTION_AFTER):
        self.core = core
        # core/leadership.py: with several Coordinators only the leader runs the rounds (None: always).
        self.leadership = leadership
        self.connect_peer = connect_peer
        self.interval = interval
        self.tick = min(MAX_TICK, interval / 10.0)
        self.workers = workers
        self.unreachable_limit = unreachable_limit
        self.unverified_eviction_after = unverified_eviction_after
        self.stop = stop
        self.clock = clock
        self._log = log or (lambda event, **fields: None)
        self._leading: Optional[bool] = None

    def run(self) -> None:
        """The first cycle one interval after the start (as the rounds before), then one cycle per interval."""
        if self.stop.wait(self.interval):
            return
        self.run_cycles()

    def run_cycles(self) -> None:
        while not self.stop.is_set():
            start = self.clock()
            self.cycle(start)
            left = start + self.interval - self.clock()
            if left > 0 and self.stop.wait(left):
                return

    def _may_run(self) -> bool:
        if self.core.state != State.ACTIVATING_NODES:
            return False
        if self.leadership is not None:
            leads = self.leadership.step()
            if leads != self._leading:  # a hand-over (or the first cycle): say who runs the duties
                self._leading = leads
                self._log("leadership", leads=leads, leader=self.leadership.current,
                          error=self.leadership.last_error[:MAX_REASON] or None)
            if not leads:
                return False
        return True

    def cycle(self, start: float) -> None:
        """One interval from ``start``: every peer re-attested once, at ``start`` + its offset (batched per tick)."""
        if not self._may_run():
            return
        try:
            targets = self.core.reattest_targets()
        except (ConstellationError, OSError) as err:
            self._log("reattest_error", level="warning", error=str(err)[:MAX_REASON])
            return
        schedule = sorted((spread_offset(ip, self.interval), ip) for ip in targets)
        while schedule:
            batch, count = due(schedule, self.clock() - start, self.tick)
            if not batch:
                # Until the next peer's offset; then its batch takes the tick's share after it.
                if self.stop.wait(max(0.0, start + schedule[0][0] - self.clock())):
                    return
                continue
            schedule = schedule[count:]
            self._round(batch)
            if self.stop.is_set():
                return

    def _round(self, batch: List[str]) -> None:
        try:
            rows = self.core.reattest_peers(self.connect_peer, self.workers, self.unreachable_limit, only=batch,
                                            unverified_eviction_after=self.unverified_eviction_after)
        except (ConstellationError, OSError) as err:
            self._log("reattest_error", level="warning", error=str(err)[:MAX_REASON])
            return
        except Exception as err:  # pylint: disable=broad-except
            # Never let the thread die silently: the next batch tries again.
            self._log("reattest_crashed", level="error", error=type(err).__name__)
            return
        evicted = [r["vpn_ip"] for r in rows if r["outcome"] == EVICTED]
        unverified = [r["vpn_ip"] for r in rows if r["outcome"] == UNVERIFIED]
        if evicted or unverified:
            self._log("reattest_round", peers=len(rows), evicted=",".join(evicted), unverified=",".join(unverified))
