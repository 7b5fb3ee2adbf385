# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``kms://`` and ``storage://`` URIs, parsed and formatted as Constellation's ``internal/kms/uri``.

Every parameter's rule (secret, free text, base64, a few allowed values) is read from the backend's row in
``registry.py``. Errors name the field and what was expected; they never echo a URI or a value that could
hold key material (``safe_name`` decides what may be shown).
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Dict, Mapping, Tuple
from urllib.parse import quote, unquote_plus

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.kms.derive import (
    SALT_LENGTH_MAX,
    URI_LENGTH_MAX,
    URI_VALUE_LENGTH_MAX,
    _preview,
)
from ansible_collections.constellation.cluster.plugins.module_utils.kms.registry import (
    KMS_SCHEME,
    STORAGE_SCHEME,
    TABLES,
    Backend,
    backend_of,
)

CLUSTER_KMS = "cluster-kms"
NO_STORE = "no-store"

_IDENTIFIER = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._:/@+-]*\Z")
_URLSAFE_B64 = re.compile(r"\A[A-Za-z0-9_-]*={0,2}\Z")
_STD_B64 = re.compile(r"\A[A-Za-z0-9+/]*={0,2}\Z")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_SAFE_NAME = re.compile(r"\A[A-Za-z][A-Za-z0-9_.-]{0,11}\Z")


def safe_name(value: object) -> object:
    """``value`` if it is a name of the tables (a scheme, backend or parameter name) or a short
    identifier (at most 12 characters: a typo), else None. A malformed URI may put key material
    where a name was expected, and errors never echo it (nor more than 12 characters of it)."""
    if not isinstance(value, str):
        return None
    if _SAFE_NAME.match(value) or value in TABLES:
        return value
    for backends in TABLES.values():
        if value in backends or any(value in row.params for row in backends.values()):
            return value
    return None


@dataclass(frozen=True)
class BackendURI:
    """A parsed ``kms://`` or ``storage://`` URI: scheme, backend and decoded parameters."""

    scheme: str
    backend: str
    params: Tuple[Tuple[str, str], ...] = ()

    def __repr__(self) -> str:
        # A backend no longer in the table shows no value at all.
        row = backend_of(self.scheme, self.backend)
        shown = ", ".join("%s=%s" % (k, "<secret>" if row is None or row.is_secret(k) else v) for k, v in self.params)
        return "BackendURI(%s://%s?%s)" % (self.scheme, self.backend, shown)

    def get(self, name: str) -> str:
        return dict(self.params)[name]

    def to_uri(self) -> str:
        return format_uri(self.scheme, self.backend, dict(self.params))


def _escape(value: str) -> str:
    # Constellation's parser unescapes every value twice (url.Values.Get, then QueryUnescape),
    # so '%' and '+' must be escaped twice to come back as themselves.
    return quote(value.replace("%", "%25").replace("+", "%2B"), safe="")


def format_uri(scheme: str, backend: str, params: Mapping[str, str], field: str = "uri") -> str:
    """Builds a URI in Constellation's parameter order; values are validated, then escaped."""
    backends = TABLES.get(scheme)
    if backends is None:
        raise InputError(field + " scheme", "one of kms, storage", safe_name(scheme))
    if backend not in backends:
        raise InputError(field + " backend", "one of " + ", ".join(backends), safe_name(backend))
    row = backends[backend]
    names = row.params
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise InputError(safe_name(unknown[0]) or field, "only the parameters of %s://%s (%s)"
                         % (scheme, backend, ", ".join(names)))
    for name in names:
        _check_value(row, name, params.get(name))
    if not names:
        return "%s://%s" % (scheme, backend)
    # Base64 values are written raw, as Constellation does (their alphabet is query-safe).
    query = "&".join("%s=%s" % (name, params[name] if name in row.base64_params else _escape(params[name]))
                     for name in names)
    return "%s://%s?%s" % (scheme, backend, query)


def format_kms_uri(backend: str, **params: str) -> str:
    return format_uri(KMS_SCHEME, backend, params, "kms_uri")


def format_storage_uri(backend: str, **params: str) -> str:
    return format_uri(STORAGE_SCHEME, backend, params, "storage_uri")


def parse_uri(uri: str, field: str = "uri") -> BackendURI:
    """Parses and validates a ``kms://`` or ``storage://`` URI strictly.

    Accepts every URI Constellation writes. Refuses what Constellation would silently
    misread: duplicate or unknown parameters (``key=a&key=b``), fragments, user info, paths,
    bad escapes, and parameter values that smuggle query syntax.
    """
    if not isinstance(uri, str):
        raise InputError(field, "a string", type(uri).__name__)
    if len(uri) > URI_LENGTH_MAX:
        raise InputError(field, "at most %d characters" % URI_LENGTH_MAX, "%d characters" % len(uri))
    if not uri:
        raise InputError(field, "a kms:// or storage:// URI", "an empty string")
    if any(c.isspace() or not c.isprintable() for c in uri):
        raise InputError(field, "a URI without spaces or control characters")
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme not in TABLES:
        raise InputError(field + " scheme", "kms:// or storage://", safe_name(scheme if sep else uri.split(":", 1)[0]))
    if "#" in rest:
        raise InputError(field + " fragment", "no '#' fragment (escape '#' in values as %23)")
    authority, qmark, query = rest.partition("?")
    if "/" in authority and authority.split("/", 1)[1]:
        raise InputError(field + " path", "no path after the backend name")
    backend = authority.rstrip("/")
    if "@" in backend or ":" in backend:
        raise InputError(field + " backend", "a bare backend name (no user info, no port)")
    backends = TABLES[scheme]
    if backend not in backends:
        raise InputError(field + " backend", "one of " + ", ".join(backends), safe_name(backend))
    row = backends[backend]
    names = row.params
    if not names:
        if qmark and query:
            raise InputError(field, "no parameters for %s://%s" % (scheme, backend))
        return BackendURI(scheme, backend, ())
    if not query:
        raise InputError(names[0], "a value (%s://%s needs %s)" % (scheme, backend, ", ".join(names)))
    values: Dict[str, str] = {}
    for pair in query.split("&"):
        name, eq, raw = pair.partition("=")
        if not eq or not name:  # a pair without '=' may be a value: never shown
            raise InputError(field + " query", "name=value pairs separated by '&'")
        if name not in names:
            if safe_name(name) is None:
                raise InputError(field + " query", "only the parameters of %s://%s (%s)" % (scheme, backend, ", ".join(names)))
            raise InputError(name, "a parameter of %s://%s (%s)" % (scheme, backend, ", ".join(names)))
        if name in values:
            raise InputError(name, "exactly one value (the parameter is repeated)")
        values[name] = _unescape_twice(name, raw)
    for name in names:
        if name not in values:
            raise InputError(name, "a value (missing from the %s URI)" % scheme)
        _check_value(row, name, values[name])
    return BackendURI(scheme, backend, tuple((n, values[n]) for n in names))


def parse_kms_uri(uri: str) -> BackendURI:
    parsed = parse_uri(uri, "kms_uri")
    if parsed.scheme != KMS_SCHEME:
        raise InputError("kms_uri", "a kms:// URI", parsed.scheme + "://")
    return parsed


def parse_storage_uri(uri: str) -> BackendURI:
    parsed = parse_uri(uri, "storage_uri")
    if parsed.scheme != STORAGE_SCHEME:
        raise InputError("storage_uri", "a storage:// URI", parsed.scheme + "://")
    return parsed


def _unescape_twice(name: str, raw: str) -> str:
    value = raw
    for _round in range(2):
        if _BAD_ESCAPE.search(value):
            raise InputError(name, "valid %-escapes (%XX)")
        try:
            value = unquote_plus(value, errors="strict")
        except UnicodeDecodeError:
            raise InputError(name, "UTF-8 text after unescaping") from None
    return value


def _check_value(row: Backend, name: str, value: object) -> None:
    secret = row.is_secret(name)
    if not isinstance(value, str) or value == "":
        raise InputError(name, "a non-empty value")
    if len(value) > URI_VALUE_LENGTH_MAX:
        raise InputError(name, "at most %d characters" % URI_VALUE_LENGTH_MAX, "%d characters" % len(value))
    if not value.isprintable():
        raise InputError(name, "printable characters only")
    allowed = row.allowed(name)
    if name in row.base64_params:
        if not _URLSAFE_B64.match(value):
            raise InputError(name, "URL-safe base64 with padding (A-Z a-z 0-9 - _ =)")
    elif allowed is not None:
        if value not in allowed:
            raise InputError(name, "one of " + ", ".join(allowed), None if secret else _preview(value))
    elif name not in row.free_text_params and not _IDENTIFIER.match(value):
        raise InputError(name, "an identifier (letters, digits and . _ : / @ + -)", None if secret else _preview(value))


def _b64_param(parsed: BackendURI, name: str) -> bytes:
    value = parsed.get(name)
    try:
        decoded = base64.urlsafe_b64decode(value.encode("ascii"))
    except (binascii.Error, ValueError):
        raise InputError(name, "URL-safe base64 with correct padding") from None
    if base64.urlsafe_b64encode(decoded).decode() != value:
        raise InputError(name, "canonical URL-safe base64 with padding")
    return decoded


def decode_base64(value: object, field: str, max_bytes: int = SALT_LENGTH_MAX) -> bytes:
    """Strict base64 (standard or URL-safe alphabet, padded, canonical) of at most max_bytes."""
    if not isinstance(value, str):
        raise InputError(field, "a base64 string", type(value).__name__)
    if len(value) > 4 * ((max_bytes + 2) // 3):
        raise InputError(field, "at most %d bytes" % max_bytes, "%d base64 characters" % len(value))
    if _STD_B64.match(value):
        decoder, encoder = base64.b64decode, base64.b64encode
    elif _URLSAFE_B64.match(value):
        decoder, encoder = base64.urlsafe_b64decode, base64.urlsafe_b64encode
    else:
        raise InputError(field, "base64 (A-Z a-z 0-9 + / or - _, '=' padding)")
    try:
        decoded = decoder(value.encode("ascii"))
    except (binascii.Error, ValueError):
        raise InputError(field, "base64 with correct padding") from None
    if encoder(decoded).decode() != value:
        raise InputError(field, "canonical base64 with padding")
    return decoded
