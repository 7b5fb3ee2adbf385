# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Small parsers every layer shares, written once: base64 fields, endpoints, and the ONE bounded
loader of untrusted JSON and YAML (``load_json``, ``load_yaml``, ``read_text``).

Errors are ``InputError`` naming the field and what was expected. They never echo the value of a
base64 field (it may be a key): only its type or length. The loaders never echo the document either:
a parser's message names a position, not the text there.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Optional, Tuple, Union

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError

MAX_B64_BYTES = 1 << 20
# Bounds of every untrusted JSON/YAML document (RPC frames, attestation documents, policies, configs).
MAX_DOCUMENT = 1 << 20
MAX_DEPTH = 32
MAX_ITEMS = 1 << 20  # more than a MAX_DOCUMENT of JSON can hold
MAX_YAML_ITEMS = 100000  # YAML aliases share objects: a small text can name an enormous tree
_SCALARS = (str, int, float, bool, type(None))


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


# ----------------------------------------------------------------- bounded JSON and YAML


def read_text(path: str, field: str, max_size: int = MAX_DOCUMENT, expected: str = "a readable UTF-8 file") -> str:
    """The UTF-8 text of a file of at most ``max_size`` bytes; InputError naming ``field`` otherwise."""
    if not isinstance(path, str) or not path:
        raise InputError(field, "a file path", type(path).__name__)
    try:
        with open(path, "rb") as handle:
            data = handle.read(max_size + 1)
    except OSError as err:
        raise InputError(field, expected, "%s (%s)" % (path, err.strerror or type(err).__name__)) from None
    return _text(data, field, max_size, "%s: " % path)


def _text(data: Any, field: str, max_size: int, where: str = "") -> str:
    if isinstance(data, (bytes, bytearray)):
        if len(data) > max_size:
            raise InputError(field, "at most %d bytes" % max_size, "%smore" % where)
        try:
            return bytes(data).decode("utf-8")
        except UnicodeDecodeError as err:
            raise InputError(field, "UTF-8 text", "%san invalid byte at offset %d" % (where, err.start)) from None
    if not isinstance(data, str):
        raise InputError(field, "JSON text", type(data).__name__)
    if len(data) > max_size:
        raise InputError(field, "at most %d characters" % max_size, "%s%d characters" % (where, len(data)))
    return data


def _refuse_constant(name: str) -> None:
    raise ValueError("%s is not a JSON number" % name)


def load_json(data: Union[str, bytes], field: str, max_size: int = MAX_DOCUMENT, max_depth: int = MAX_DEPTH) -> Any:
    """A JSON document from untrusted text or UTF-8 bytes, bounded in size, nesting depth and
    element count. Refuses NaN/Infinity and integers too long to convert. Raises only InputError."""
    text = _text(data, field, max_size)
    try:
        doc = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise InputError(field, "JSON nested at most %d deep" % max_depth, "deeper nesting") from None
    except json.JSONDecodeError as err:
        raise InputError(field, "valid JSON", "%s at line %d column %d" % (err.msg, err.lineno, err.colno)) from None
    except ValueError as err:  # an integer of more than sys.get_int_max_str_digits() digits, NaN
        raise InputError(field, "valid JSON", str(err).split(":", 1)[0][:80]) from None
    check_document(doc, field, max_depth)
    return doc


def load_yaml(data: Union[str, bytes], field: str, max_size: int = MAX_DOCUMENT, max_depth: int = MAX_DEPTH,
              int_keys: bool = False) -> Any:
    """A YAML (or JSON) document from untrusted text, with PyYAML's safe loader, bounded as load_json.
    Mapping keys must be strings (or integers, not booleans, with ``int_keys``): YAML's ``true:`` or
    ``1.5:`` is refused here rather than met later by code that sorts or formats the keys."""
    text = _text(data, field, max_size)
    try:
        import yaml
    except ImportError:  # pragma: no cover - PyYAML comes with ansible-core
        return load_json(text, field, max_size, max_depth)
    try:  # most of these files are JSON: the C parser first, PyYAML's (pure Python) only for the rest
        doc = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise InputError(field, "JSON nested at most %d deep" % max_depth, "deeper nesting") from None
    except ValueError:
        pass
    else:
        check_document(doc, field, max_depth)
        return doc
    loader = None
    try:
        loader = _bounded_loader(yaml)(text)  # its reader refuses control characters already
        loader.max_depth = max_depth
        doc = loader.get_single_data()
    except (RecursionError, _TooDeep):
        raise InputError(field, "YAML nested at most %d deep" % max_depth, "deeper nesting") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = " at line %d column %d" % (mark.line + 1, mark.column + 1) if mark is not None else ""
        problem = getattr(err, "problem", None) or type(err).__name__
        raise InputError(field, "valid JSON or YAML", "%s%s" % (str(problem)[:80], where)) from None
    except (ValueError, TypeError, OverflowError) as err:  # a scalar PyYAML's constructors cannot convert
        raise InputError(field, "valid JSON or YAML", type(err).__name__) from None
    finally:
        if loader is not None:
            loader.dispose()
    check_document(doc, field, max_depth, (str, int) if int_keys else (str,), MAX_YAML_ITEMS)
    return doc


class _TooDeep(Exception):
    """Raised inside the YAML composer (turned into an InputError by load_yaml)."""


_LOADERS: dict = {}


def _bounded_loader(yaml):
    """PyYAML's (pure Python) SafeLoader that stops composing at ``max_depth``: a text of 5,000
    '[' is refused after 33 of them instead of recursing until RecursionError."""
    loader = _LOADERS.get("safe")
    if loader is None:
        class BoundedSafeLoader(yaml.SafeLoader):  # pylint: disable=too-many-ancestors
            max_depth = MAX_DEPTH
            depth = 0

            def compose_node(self, parent, index):
                self.depth += 1
                try:
                    if self.depth > self.max_depth:
                        raise _TooDeep()
                    return super().compose_node(parent, index)
                finally:
                    self.depth -= 1

        loader = _LOADERS["safe"] = BoundedSafeLoader
    return loader


def check_document(doc: Any, field: str, max_depth: int = MAX_DEPTH, key_types: Tuple[type, ...] = (str,),
                   max_items: int = MAX_ITEMS) -> None:
    """Iteratively checks a parsed document: nesting depth, element count (YAML aliases share
    objects, so a small text can name an enormous tree: it is counted as visited) and key types."""
    stack = [(doc, 1)]
    seen = 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if seen > max_items:
            raise InputError(field, "at most %d elements" % max_items, "more")
        if isinstance(node, dict):
            children = []
            for key, value in node.items():
                if isinstance(key, bool) or not isinstance(key, key_types):
                    raise InputError(field, "keys that are %s" % " or ".join(
                        {"str": "strings", "int": "integers"}.get(t.__name__, t.__name__) for t in key_types),
                        "a key of type %s" % type(key).__name__)
                children.append(value)
        elif isinstance(node, (list, tuple, set, frozenset)):
            children = list(node)
        else:
            continue
        if children and depth >= max_depth:
            raise InputError(field, "nesting at most %d deep" % max_depth, "deeper nesting")
        stack.extend((child, depth + 1) for child in children)
