# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The quotes of one aTLS server context (atls.py ``AttestedServerContext.quotes``, docs/atls.md "What a
ClientHello may cost"): one at a time, the Coordinators' first, and never one for a connection that has ended."""

from __future__ import annotations

import heapq
import itertools
import select
import socket
import threading
import time
from typing import Callable, List, Optional, Tuple, TypeVar

from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError

LOOK_EVERY = 0.1  # seconds: a handshake waiting for its quote looks this often whether its connection is gone

_T = TypeVar("_T")

_GONE_EVENTS = (getattr(select, "POLLRDHUP", 0) | getattr(select, "POLLHUP", 0) | getattr(select, "POLLERR", 0)
                | getattr(select, "POLLNVAL", 0))


def connection_gone(sock: socket.socket) -> bool:
    """True when the connection has ended: the client closed or reset it, or the server shut it down (a
    replaced or timed-out connection, rpc/server.py). Never blocks; reads nothing."""
    try:
        fd = sock.fileno()
    except (OSError, ValueError):
        return True
    if fd < 0:
        return True
    if not hasattr(select, "poll"):
        return False
    poller = select.poll()
    poller.register(fd, _GONE_EVENTS)
    try:
        return any(events & _GONE_EVENTS for _fd, events in poller.poll(0))
    except OSError:
        return True


class QuoteCancelled(AttestationError):
    """The connection a quote was queued for ended before its turn: no quote was made."""


class QuoteQueue:
    """The quotes of one server context, one at a time, in order; a quote marked ``priority`` (a connection
    from one of the Coordinators) goes before every other waiting one. A waiting quote whose connection is
    gone (``gone()``) leaves the queue and is never made, so closed connections cost the TPM nothing."""

    def __init__(self):
        self._cond = threading.Condition()
        self._waiting: List[Tuple[int, int]] = []  # heap of (0 priority / 1 other, arrival)
        self._busy = False
        self._arrivals = itertools.count()
        self.cancelled = 0  # quotes left out: their connection ended while they waited

    def run(self, func: Callable[[float], _T], timeout: float, priority: bool = False,
            gone: Optional[Callable[[], bool]] = None) -> _T:
        """``func(seconds left)`` when it is this quote's turn, within ``timeout`` seconds in all."""
        deadline = time.monotonic() + timeout
        entry = (0 if priority else 1, next(self._arrivals))
        with self._cond:
            heapq.heappush(self._waiting, entry)
            try:
                while self._busy or self._waiting[0] != entry:
                    if gone is not None and gone():
                        self.cancelled += 1
                        raise QuoteCancelled("the connection ended while its quote waited: no quote made")
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise AttestationError("attestation timed out after %.1f s waiting for the TPM" % timeout)
                    self._cond.wait(min(left, LOOK_EVERY))
                if gone is not None and gone():
                    self.cancelled += 1
                    raise QuoteCancelled("the connection ended while its quote waited: no quote made")
                self._busy = True
            finally:
                self._waiting.remove(entry)
                heapq.heapify(self._waiting)
                self._cond.notify_all()
        try:
            return func(max(0.1, deadline - time.monotonic()))
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()
