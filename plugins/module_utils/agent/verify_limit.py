# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The verification service's budget (agent/verify_service.py): requests per source, counted for its gRPC and
HTTP sides together before any quote, and for all sources (rpc/rate_limit.py ``RateLimit``). Past it a request is
refused, gRPC RESOURCE_EXHAUSTED or HTTP 429, naming the limit; other sources are still served."""

from __future__ import annotations

from typing import Any, Optional
from urllib.parse import unquote

from ansible_collections.constellation.cluster.plugins.module_utils.errors import RateLimited

# Requests per source (burst, then per second), counted for both transports together before any quote, and for
# all sources: a client asks once per check; a flood from one source is refused and the others are still served.
VERIFY_PER_SOURCE = (8.0, 1.0)
VERIFY_TOTAL = (32.0, 8.0)


def rate_limit() -> Any:
    """The requests' budget per source and for all (rpc/rate_limit.py ``RateLimit``); the client never loads it."""
    from ansible_collections.constellation.cluster.plugins.module_utils.rpc.rate_limit import RateLimit  # pylint: disable=import-outside-toplevel

    return RateLimit("GetAttestation", VERIFY_PER_SOURCE, VERIFY_TOTAL)


def source_ip(peer: str) -> str:
    """The address of a source: an IP, or gRPC's ``context.peer()`` (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``, ``ipv6:%5B::1%5D:5``)."""
    text = unquote(peer.split(":", 1)[1] if peer.startswith(("ipv4:", "ipv6:")) else peer)
    host = text.rsplit(":", 1)[0] if text.count(":") == 1 or text.startswith("[") else text
    host = host.strip("[]")
    return host[7:] if host.lower().startswith("::ffff:") and "." in host else host


def limited(limit: Any, source: str) -> Optional[str]:
    """None if ``source`` may have a quote now, else why not (``errors.RateLimited``)."""
    try:
        limit.take(source)
    except RateLimited as err:
        return str(err)
    return None
