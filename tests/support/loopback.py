# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A TCP server on loopback for tests and benchmarks, the one accept loop they share."""

from __future__ import annotations

import socket
import threading


class LoopbackServer:
    """Listens on 127.0.0.1 (a free port: ``address``, ``endpoint``) and hands each accepted connection to
    ``serve(sock)`` in its accept thread, until ``close()``; a subclass that serves connections at once starts
    a thread per connection there. Bounded: the loop looks every 0.2 s whether it was closed. A subclass sets
    its own attributes before it calls ``__init__``, which starts accepting."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.address = self._listener.getsockname()[:2]
        self.endpoint = "%s:%d" % self.address
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    def serve(self, sock: socket.socket) -> None:
        raise NotImplementedError

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _addr = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:  # closed
                return
            self.serve(sock)

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        self._thread.join(timeout=2)
