# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Small parsers every layer shares, written once: base64 fields and endpoints.

Errors are ``InputError`` naming the field and what was expected. They never echo the value of a
base64 field (it may be a key): only its type or length.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Optional, Tuple, Union

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError

MAX_B64_BYTES = 1 << 20


def b64encode(data: bytes) -> str:
    """Standard base64 with padding, as text (every binary value inside JSON)."""
    return base64.b64encode(bytes(data)).decode("ascii")


def b64decode(value: Any, field: str, size: Optional[int] = None, max_size: int = MAX_B64_BYTES,
              strip: bool = False) -> bytes:
    """Strict standard base64 (with padding) of ``field``, of exactly ``size`` bytes if given.

    The length is checked before decoding, so a hostile value costs nothing to refuse."""
    expected = "standard base64 of %d bytes" % size if size is not None else "standard base64 with padding"
    if not isinstance(value, str):
        raise InputError(field, expected, type(value).__name__)
    if strip:
        value = value.strip()
    limit = size if size is not None else max_size
    if len(value) > 4 * ((limit + 2) // 3):
        raise InputError(field, expected, "%d characters" % len(value))
    try:
        raw = base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise InputError(field, expected, "text that is not base64") from None
    if size is not None and len(raw) != size:
        raise InputError(field, expected, "%d bytes" % len(raw))
    return raw


def parse_endpoint(endpoint: Union[str, Tuple[str, int]], field: str = "endpoint") -> Tuple[str, int]:
    """``host:port``, ``[v6]:port`` or a (host, port) tuple -> (host, port)."""
    if isinstance(endpoint, tuple) and len(endpoint) == 2:
        host, port = endpoint
    elif isinstance(endpoint, str):
        host, sep, port = endpoint.rpartition(":")
        if not sep or not host:
            raise InputError(field, "host:port", endpoint)
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
    else:
        raise InputError(field, "host:port", endpoint)
    try:
        port = int(port)
    except (TypeError, ValueError):
        raise InputError(field, "host:port with a numeric port", endpoint) from None
    if not 0 < port < 65536 or not host:
        raise InputError(field, "host:port with a port in 1-65535", endpoint)
    return str(host), port


def format_endpoint(host: str, port: int) -> str:
    """The inverse of parse_endpoint (IPv6 hosts in brackets)."""
    return "[%s]:%d" % (host, port) if ":" in host else "%s:%d" % (host, port)
