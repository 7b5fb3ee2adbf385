"""Sockets in another network namespace, from this process.

A socket keeps the namespace it was created in, so a thread that has entered a namespace with
``setns`` can create sockets there and hand them to any other thread. Tests (root namespace)
reach the lab's admin machine (the bridge namespace, 10.42.0.1) this way without a subprocess.
"""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional, Tuple, TypeVar

from ansible_collections.constellation.cluster.plugins.module_utils import netns

_T = TypeVar("_T")


class NetNS:
    """A dedicated thread living in network namespace ``name`` (``/run/netns/<name>``)."""

    def __init__(self, name: str):
        self.name = name
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="netns-%s" % name)
        self._pool.submit(netns.enter, name).result(timeout=10)

    def run(self, func: Callable[..., _T], *args, timeout: float = 30.0) -> _T:
        """Runs func(*args) inside the namespace; returns its result."""
        return self._pool.submit(func, *args).result(timeout=timeout)

    def connect(self, endpoint: Tuple[str, int], timeout: float = 10.0,
                source: Optional[Tuple[str, int]] = None) -> socket.socket:
        """A TCP socket connected from inside the namespace (usable from any thread)."""
        return self.run(socket.create_connection, endpoint, timeout, source, timeout=timeout + 5)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self) -> "NetNS":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
