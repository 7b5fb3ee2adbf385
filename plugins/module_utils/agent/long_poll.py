# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A Node's long poll of its Coordinator (docs/agent.md, "Peer updates (long poll)"): one kept, PeerAuth'd vpnapi
connection on which GetUpdate is sent with ``wait`` = ``update_interval``; the Coordinator answers at once when
the peers or the measurements version change, else after the wait, and the Node asks again at once. Nothing
here decides which Coordinator to ask or what happens on failure: ``get_update`` returns None when there is no
long poll (the Coordinator answered at once, as an older one does; the kept connection failed), and the
agent then polls as before, which finds the Coordinator that answers (the failover)."""

from __future__ import annotations

import contextlib
import random
import socket
import threading
from typing import Any, Callable, Dict, Optional, Set, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import FAILOVER_CONNECT_TIMEOUT, AgentClient

MARGIN = 5.0  # the held request's read timeout beyond its wait
# Each held request asks for a wait drawn in [(1 - JITTER) x wait, wait]: after a change every Node holds again at
# once, and without it all their requests would fall due in the same instant (the repository's bench coordinator_capacity.py: a
# held request answered ~1 s late at p99 with 1,000 Nodes).
JITTER = 0.25


def keepalive(sock: socket.socket, wait: float) -> None:
    """TCP keepalive on the kept connection: a Coordinator gone silently (its host down) is noticed within
    about ``wait`` / 2 + 3 s, not only at the read timeout."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", max(1, int(wait / 2))), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


class LongPoll:
    """``authenticate(client)``: PeerAuth on a new connection (the agent's NodePeerAuth with its node state).
    ``wait``: seconds the Coordinator may hold a GetUpdate (the agent's ``update_interval``, at most 60), less a
    random share of up to JITTER per request; ``draw``: the random source (``random.random``).
    ``connect(endpoint, timeout)``: a new plain connection (default: AgentClient.connect_plain, its connect
    bounded by FAILOVER_CONNECT_TIMEOUT)."""

    def __init__(self, port: int, wait: float, authenticate: Callable[[AgentClient], Any],
                 connect: Optional[Callable[[str, float], AgentClient]] = None,
                 draw: Callable[[], float] = random.random):
        self.port = port
        self.wait = wait
        self.draw = draw
        self.authenticate = authenticate
        self.connect = connect or (lambda endpoint, timeout: AgentClient.connect_plain(
            endpoint, timeout=timeout, connect_timeout=FAILOVER_CONNECT_TIMEOUT))
        self._held: Optional[Tuple[str, AgentClient]] = None
        self._lock = threading.Lock()
        self.refused: Set[str] = set()  # Coordinators that answered a long poll at once (older versions)

    def get_update(self, coordinator_vpn_ip: str, resource_version: int) -> Optional[Dict[str, Any]]:
        """GetUpdate held by the Coordinator at ``coordinator_vpn_ip``; None: no long poll now (see above)."""
        if coordinator_vpn_ip in self.refused:
            return None
        held = self._held
        if held is not None and held[0] != coordinator_vpn_ip:
            self.close()
            held = None
        if held is None:
            held = self._open(coordinator_vpn_ip)
            if held is None:
                return None
        try:
            answer = held[1].get_update(resource_version, wait=self.wait * (1.0 - JITTER * self.draw()))
        except (OSError, ConstellationError):
            self.close()
            return None
        if not answer.get("long_poll"):  # answered at once: an older Coordinator
            self.refused.add(coordinator_vpn_ip)
            self.close()
        return answer

    def _open(self, ip: str) -> Optional[Tuple[str, AgentClient]]:
        client = None
        try:
            client = self.connect("%s:%d" % (ip, self.port), self.wait + MARGIN)
            keepalive(client.sock, self.wait)
            self.authenticate(client)
        except (OSError, ConstellationError):
            if client is not None:
                client.close()
            return None
        with self._lock:
            self._held = (ip, client)
        return self._held

    def close(self) -> None:
        """Closes the kept connection (from any thread: a held GetUpdate ends at once)."""
        with self._lock:
            held, self._held = self._held, None
        if held is not None:
            with contextlib.suppress(OSError):
                held[1].sock.shutdown(socket.SHUT_RDWR)
            held[1].close()
