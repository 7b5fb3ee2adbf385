# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent's re-attestation thread (docs/agent.md, "Re-attestation and eviction"): a round of
core/trust.py ``PeerTrust.reattest_peers`` every ``reattest_interval``, on the leader only where several
Coordinators share the duties (core/leadership.py)."""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional, Protocol

from ansible_collections.constellation.cluster.plugins.module_utils.core.state import State
from ansible_collections.constellation.cluster.plugins.module_utils.core.trust import EVICTED, MAX_REASON
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError


class Reattester(Protocol):
    """What the loop drives (core/trust.py ``PeerTrust``)."""

    @property
    def state(self) -> State:
        """The peer's state."""

    def reattest_peers(self, connect_peer: Callable[[str], Any], workers: int = 4,
                       unreachable_limit: int = 3) -> List[Dict[str, Any]]:
        """One round; one row per peer."""


class ReattestLoop:
    """The agent's re-attestation thread: ``trust.reattest_peers`` every ``interval`` seconds while the
    peer is an activated Coordinator (``core`` is a ``PeerTrust``, or anything with ``state`` and
    ``reattest_peers``)."""

    def __init__(self, core: Reattester, connect_peer, interval: float, workers: int, unreachable_limit: int,
                 stop: threading.Event, log=None, leadership=None):
        self.core = core
        # core/leadership.py: with several Coordinators only the leader runs the rounds (None: always).
        self.leadership = leadership
        self.connect_peer = connect_peer
        self.interval = interval
        self.workers = workers
        self.unreachable_limit = unreachable_limit
        self.stop = stop
        self._log = log or (lambda event, **fields: None)
        self._leading: Optional[bool] = None

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            if self.core.state != State.ACTIVATING_NODES:
                continue
            if self.leadership is not None:
                leads = self.leadership.step()
                if leads != self._leading:  # a hand-over (or the first round): say who runs the duties
                    self._leading = leads
                    self._log("leadership", leads=leads, leader=self.leadership.current,
                              error=self.leadership.last_error[:MAX_REASON] or None)
                if not leads:
                    continue
            try:
                rows = self.core.reattest_peers(self.connect_peer, self.workers, self.unreachable_limit)
            except (ConstellationError, OSError) as err:
                self._log("reattest_error", level="warning", error=str(err)[:MAX_REASON])
                continue
            except Exception as err:  # pylint: disable=broad-except
                # Never let the thread die silently: the next round tries again.
                self._log("reattest_crashed", level="error", error=type(err).__name__)
                continue
            evicted = [r["vpn_ip"] for r in rows if r["outcome"] == EVICTED]
            if evicted:
                self._log("reattest_round", peers=len(rows), evicted=",".join(evicted))
