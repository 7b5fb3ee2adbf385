# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""TCP connections opened inside another network namespace (lab only).

A socket keeps the network namespace it was created in, so a short-lived thread that entered
``/run/netns/<name>`` with ``setns`` creates it and hands it back; the caller's own namespace is
never changed. A real controller reaches its nodes directly and passes ``netns=None``.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any, Dict, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError

CLONE_NEWNET = 0x40000000


def check_netns_name(netns: Any, field: str = "netns") -> Optional[str]:
    """None or the name of a namespace under /run/netns (no path)."""
    if netns is None or netns == "":
        return None
    if not isinstance(netns, str) or "/" in netns or netns in (".", ".."):
        raise InputError(field, "the name of a network namespace in /run/netns", netns)
    return netns


def enter(netns: str) -> None:
    """Moves the CALLING THREAD into network namespace ``netns`` (sockets it creates stay there)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open("/run/netns/%s" % netns, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, "setns %s: %s" % (netns, os.strerror(err)))
    finally:
        os.close(fd)


def create_connection(address: Tuple[str, int], timeout: float, netns: Optional[str] = None) -> socket.socket:
    """``socket.create_connection`` in namespace ``netns`` (None: this process's own)."""
    netns = check_netns_name(netns)
    if netns is None:
        return socket.create_connection(address, timeout=timeout)
    box: Dict[str, Any] = {}

    def make() -> None:
        try:
            enter(netns)
            box["sock"] = socket.create_connection(address, timeout=timeout)
        except OSError as err:
            box["error"] = err

    worker = threading.Thread(target=make, name="netns-%s" % netns, daemon=True)
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["sock"]
