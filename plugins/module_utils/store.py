# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node agent's key-value stores (SPEC §6.8): one interface, three back ends.

* ``MemoryStore``: a dict (tests, and the agent before activation: Constellation's ``StdStore``).
* ``FileStore``: one JSON file (values std-base64). Every write replaces the file atomically
  (temp file + fsync + rename + fsync of the directory), so a ``kill -9`` at any moment leaves
  either the old or the new content, never a mix. Threads are serialised by a lock, processes by
  ``flock`` on a side file ``<path>.lock``. A file that does not parse is refused, never "repaired".
* ``EtcdStore``: etcd v3 through its HTTP gateway (``etcd3gw``); every key lives under ``prefix``.
  Transactions are optimistic: all reads of a transaction see one revision (a snapshot), and the
  commit is one etcd txn that compares the ``mod_revision`` of everything read; if another writer
  got there first, nothing is written and ``TransactionConflict`` is raised (``update()`` retries).

Keys are non-empty ``str``; values are ``bytes``. ``items(prefix)`` is sorted by key.

``with store.transaction() as tx:`` gives ``tx.get/get_default/put/delete/items`` (reads see the
transaction's own writes); it commits when the block ends and writes nothing if the block raises.
``store.update(fn)`` runs ``fn(tx)`` in a transaction and retries it (bounded) on a conflict: use it
wherever several processes may write the same etcd keys.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import json
import os
import random
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_write
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    ConstellationError,
    InputError,
    StateError,
)

FILE_FORMAT = "constellation.cluster/store/v1"
DEFAULT_ETCD_PREFIX = "constellation/"
DEFAULT_UPDATE_ATTEMPTS = 50


class KeyNotFound(ConstellationError, KeyError):
    """``get`` of a key that is not set (Constellation's ``ValueUnsetError``)."""

    def __init__(self, key: str):
        self.key = key
        super().__init__(key)

    def __str__(self) -> str:
        return "store key %r is not set" % (self.key,)


class StoreError(StateError):
    """The store cannot be used: unreachable etcd, corrupt or unreadable file, refused request."""


class TransactionConflict(StoreError):
    """Another writer changed what this transaction read; nothing was written. Retry."""


def check_key(key: Any, field: str = "key") -> str:
    if not isinstance(key, str) or not key:
        raise InputError(field, "a non-empty string", type(key).__name__ if not isinstance(key, str) else key)
    return key


def check_prefix(prefix: Any, field: str = "prefix") -> str:
    if not isinstance(prefix, str):
        raise InputError(field, "a string", type(prefix).__name__)
    return prefix


def check_value(value: Any, field: str = "value") -> bytes:
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if not isinstance(value, bytes):
        raise InputError(field, "bytes", type(value).__name__)
    return value


# --------------------------------------------------------------------------- transactions


class Txn:
    """Buffered writes over a reader; the store decides how to commit them."""

    def __init__(self, read_one: Callable[[str], Optional[bytes]],
                 read_range: Callable[[str], List[Tuple[str, bytes]]]):
        self._read_one = read_one
        self._read_range = read_range
        self.writes: Dict[str, Optional[bytes]] = {}  # None: delete

    def get(self, key: str) -> bytes:
        value = self.get_default(key)
        if value is None:
            raise KeyNotFound(key)
        return value

    def get_default(self, key: str, default: Optional[bytes] = None) -> Optional[bytes]:
        check_key(key)
        if key in self.writes:
            value = self.writes[key]
        else:
            value = self._read_one(key)
        return default if value is None else value

    def put(self, key: str, value: bytes) -> None:
        self.writes[check_key(key)] = check_value(value)

    def delete(self, key: str) -> None:
        self.writes[check_key(key)] = None

    def items(self, prefix: str = "") -> List[Tuple[str, bytes]]:
        check_prefix(prefix)
        merged = dict(self._read_range(prefix))
        for key, value in self.writes.items():
            if key.startswith(prefix):
                if value is None:
                    merged.pop(key, None)
                else:
                    merged[key] = value
        return sorted(merged.items())


class _BaseStore:
    """What every store shares: plain operations as one-step transactions, ``update``, closing."""

    def get(self, key: str) -> bytes:
        value = self.get_default(key)
        if value is None:
            raise KeyNotFound(key)
        return value

    def get_default(self, key: str, default: Optional[bytes] = None) -> Optional[bytes]:
        raise NotImplementedError

    def put(self, key: str, value: bytes) -> None:
        key, value = check_key(key), check_value(value)
        with self.transaction() as tx:
            tx.put(key, value)

    def delete(self, key: str) -> None:
        check_key(key)
        with self.transaction() as tx:
            tx.delete(key)

    def items(self, prefix: str = "") -> List[Tuple[str, bytes]]:
        raise NotImplementedError

    def transaction(self):
        raise NotImplementedError

    def update(self, fn: Callable[[Txn], Any], attempts: int = DEFAULT_UPDATE_ATTEMPTS) -> Any:
        """``fn(tx)`` in a transaction, re-run on ``TransactionConflict`` (at most ``attempts`` times).
        ``fn`` must only touch the store through ``tx`` (it may run more than once). Returns its result."""
        if not isinstance(attempts, int) or attempts < 1:
            raise InputError("attempts", "a positive integer", attempts)
        for attempt in range(attempts):
            try:
                with self.transaction() as tx:
                    result = fn(tx)
                return result
            except TransactionConflict:
                if attempt == attempts - 1:
                    raise
                # Jittered back-off spreads contending writers apart.
                time.sleep(random.uniform(0, 0.002 * min(attempt + 1, 10)))
        raise AssertionError("unreachable")

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _ReentrantGuard:
    """A thread lock that also tells whether this is the outermost acquisition (for flock)."""

    def __init__(self):
        self._lock = threading.RLock()
        self._local = threading.local()

    @contextlib.contextmanager
    def hold(self, outer: Callable[[], Any]) -> Iterator[None]:
        """Holds the thread lock; on the outermost level also the context manager ``outer()``."""
        with self._lock:
            depth = getattr(self._local, "depth", 0)
            self._local.depth = depth + 1
            try:
                if depth == 0:
                    with outer():
                        yield
                else:
                    yield
            finally:
                self._local.depth = depth


# --------------------------------------------------------------------------- memory


class MemoryStore(_BaseStore):
    """A dict behind a lock; transactions hold the lock, so they are serialised."""

    def __init__(self, data: Optional[Mapping[str, bytes]] = None):
        self._data: Dict[str, bytes] = {}
        self._guard = _ReentrantGuard()
        for key, value in (data or {}).items():
            self._data[check_key(key)] = check_value(value)

    def get_default(self, key: str, default: Optional[bytes] = None) -> Optional[bytes]:
        check_key(key)
        with self._guard.hold(contextlib.nullcontext):
            return self._data.get(key, default)

    def items(self, prefix: str = "") -> List[Tuple[str, bytes]]:
        check_prefix(prefix)
        with self._guard.hold(contextlib.nullcontext):
            return sorted((k, v) for k, v in self._data.items() if k.startswith(prefix))

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Txn]:
        with self._guard.hold(contextlib.nullcontext):
            tx = Txn(self._data.get, lambda p: [(k, v) for k, v in self._data.items() if k.startswith(p)])
            yield tx
            for key, value in tx.writes.items():
                if value is None:
                    self._data.pop(key, None)
                else:
                    self._data[key] = value


# --------------------------------------------------------------------------- file


class FileStore(_BaseStore):
    """One JSON file ``{"format": ..., "items": {key: base64(value)}}``, replaced atomically."""

    def __init__(self, path: str):
        if not isinstance(path, str) or not path:
            raise InputError("path", "a file path", path)
        self.path = os.path.abspath(path)
        self.lock_path = self.path + ".lock"
        self._dir = os.path.dirname(self.path)
        self._guard = _ReentrantGuard()
        self._cache: Optional[Tuple[Tuple[int, int, int], Dict[str, bytes]]] = None
        try:
            os.makedirs(self._dir, mode=0o700, exist_ok=True)
        except OSError as err:
            raise StoreError("cannot create the store directory %s: %s" % (self._dir, err.strerror)) from None
        with self._guard.hold(self._flock):
            self._remove_stale_temp_files()
            self._load()  # refuse a corrupt file now, not at the first use

    # -- locking and I/O

    @contextlib.contextmanager
    def _flock(self) -> Iterator[None]:
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as err:
            raise StoreError("cannot open the store lock %s: %s" % (self.lock_path, err.strerror)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def _locked(self):
        return self._guard.hold(self._flock)

    def _temp_prefix(self) -> str:
        # fileutil.atomic_write names its temp files ".<name>.<random>"
        return "." + os.path.basename(self.path) + "."

    def _remove_stale_temp_files(self) -> None:
        # Left by a writer killed before its rename; we hold the lock, so no one is writing now.
        for name in os.listdir(self._dir):
            if name.startswith(self._temp_prefix()):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self._dir, name))

    def _load(self) -> Dict[str, bytes]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._cache = None
            return {}
        except OSError as err:
            raise StoreError("cannot read the store file %s: %s" % (self.path, err.strerror)) from None
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self._cache is not None and self._cache[0] == stamp:
            return dict(self._cache[1])
        try:
            with open(self.path, "rb") as handle:
                raw = handle.read()
        except OSError as err:
            raise StoreError("cannot read the store file %s: %s" % (self.path, err.strerror)) from None
        data = self._parse(raw)
        self._cache = (stamp, data)
        return dict(data)

    def _parse(self, raw: bytes) -> Dict[str, bytes]:
        def corrupt(why: str) -> StoreError:
            return StoreError("store file %s is corrupt (%s); refusing to use it: restore it from a backup "
                              "or remove it to start empty" % (self.path, why))

        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as err:
            raise corrupt("not JSON: %s" % err) from None
        if not isinstance(doc, dict) or doc.get("format") != FILE_FORMAT or not isinstance(doc.get("items"), dict):
            raise corrupt("expected an object with format %r and items" % FILE_FORMAT)
        data = {}
        for key, text in doc["items"].items():
            if not key or not isinstance(text, str):
                raise corrupt("bad entry %r" % (key,))
            try:
                data[key] = base64.b64decode(text.encode("ascii"), validate=True)
            except (binascii.Error, UnicodeEncodeError):
                raise corrupt("value of %r is not base64" % (key,)) from None
        return data

    def _write(self, data: Dict[str, bytes]) -> None:
        doc = {"format": FILE_FORMAT,
               "items": {k: base64.b64encode(v).decode("ascii") for k, v in sorted(data.items())}}
        raw = json.dumps(doc, indent=1, sort_keys=True).encode("utf-8") + b"\n"
        try:
            atomic_write(self.path, raw, 0o600)
        except OSError as err:
            raise StoreError("cannot write the store file %s: %s" % (self.path, err.strerror)) from None
        st = os.stat(self.path)
        self._cache = ((st.st_ino, st.st_mtime_ns, st.st_size), dict(data))

    # -- the interface

    def get_default(self, key: str, default: Optional[bytes] = None) -> Optional[bytes]:
        check_key(key)
        with self._locked():
            return self._load().get(key, default)

    def items(self, prefix: str = "") -> List[Tuple[str, bytes]]:
        check_prefix(prefix)
        with self._locked():
            return sorted((k, v) for k, v in self._load().items() if k.startswith(prefix))

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Txn]:
        with self._locked():
            data = self._load()
            tx = Txn(data.get, lambda p: [(k, v) for k, v in data.items() if k.startswith(p)])
            yield tx
            if not tx.writes:
                return
            changed = False
            for key, value in tx.writes.items():
                if value is None:
                    changed |= data.pop(key, None) is not None
                elif data.get(key) != value:
                    data[key] = value
                    changed = True
            if changed:
                self._write(data)


# --------------------------------------------------------------------------- etcd


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _range_end(start: bytes) -> bytes:
    """The end of etcd's range of every key that starts with ``start`` ("\\0" = no end)."""
    stripped = start.rstrip(b"\xff")
    if not stripped:
        return b"\0"
    return stripped[:-1] + bytes([stripped[-1] + 1])


class EtcdStore(_BaseStore):
    """etcd v3 through the HTTP gateway; every key is stored as ``prefix + key``.

    ``endpoints``: ``host:port`` or ``http(s)://host:port``; tried in order, the first that answers
    is used until it fails. ``tls``: ``{"ca_cert": path, "cert": path, "key": path}`` (https with a
    client certificate; Constellation used etcd's peer certificate). ``timeout`` is per request.
    """

    def __init__(self, endpoints: List[str], prefix: str = DEFAULT_ETCD_PREFIX, timeout: float = 5,
                 tls: Optional[Mapping[str, str]] = None):
        # Imported here: the other stores (and Ansible modules that use them) need no etcd client.
        try:
            from etcd3gw import exceptions as etcd_exceptions
            from etcd3gw.client import Etcd3Client
        except ImportError:
            raise StoreError("the etcd store needs the Python package etcd3gw") from None
        self._exceptions = etcd_exceptions
        if isinstance(endpoints, str):
            endpoints = [endpoints]
        if not isinstance(endpoints, (list, tuple)) or not endpoints:
            raise InputError("endpoints", "a non-empty list of host:port", endpoints)
        if not isinstance(prefix, str) or not prefix:
            raise InputError("prefix", "a non-empty string", prefix)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise InputError("timeout", "a positive number of seconds", timeout)
        tls = dict(tls or {})
        unknown = set(tls) - {"ca_cert", "cert", "key"}
        if unknown:
            raise InputError("tls", "keys among ca_cert, cert, key", sorted(unknown))
        if bool(tls.get("cert")) != bool(tls.get("key")):
            raise InputError("tls", "both cert and key, or neither", sorted(tls))
        if prefix.startswith("\0"):
            raise InputError("prefix", "a string that does not start with NUL", prefix)
        self.prefix = prefix
        self._raw_prefix = prefix.encode("utf-8")
        # Outside every prefix's range (prefixes never start with NUL): rewritten by each delete.
        self._guard_key = b"\0constellation-delete-guard/" + self._raw_prefix
        self.endpoints: List[str] = []
        self._clients = []
        for index, endpoint in enumerate(endpoints):
            host, port, scheme = self._parse_endpoint(endpoint, index, bool(tls))
            self.endpoints.append("%s://%s:%d" % (scheme, host if ":" not in host else "[%s]" % host, port))
            self._clients.append(Etcd3Client(
                host=host, port=port, protocol=scheme, timeout=timeout, api_path="/v3/",
                ca_cert=tls.get("ca_cert"), cert_cert=tls.get("cert"), cert_key=tls.get("key")))
        self._current = 0
        self._lock = threading.Lock()  # guards _current
        # Serialises this object's transactions (threads of one agent never conflict with each
        # other); other processes are caught by the commit's compares.
        self._tx_lock = threading.RLock()
        self._closed = False
        self._call("/kv/range", {"key": _b64(self._raw_prefix), "limit": 1, "keys_only": True})

    @staticmethod
    def _parse_endpoint(endpoint: Any, index: int, tls: bool) -> Tuple[str, int, str]:
        field = "endpoints[%d]" % index
        if not isinstance(endpoint, str) or not endpoint:
            raise InputError(field, "host:port", endpoint)
        scheme = "https" if tls else "http"
        rest = endpoint
        if "://" in endpoint:
            scheme, rest = endpoint.split("://", 1)
            if scheme not in ("http", "https"):
                raise InputError(field, "an http:// or https:// endpoint", endpoint)
        rest = rest.rstrip("/")
        if rest.startswith("["):
            host, _sep, port_text = rest[1:].partition("]:")
        else:
            host, _sep, port_text = rest.rpartition(":")
        try:
            port = int(port_text)
        except ValueError:
            port = -1
        if not host or not 0 < port < 65536:
            raise InputError(field, "host:port", endpoint)
        return host, port, scheme

    # -- transport

    def _call(self, path: str, payload: dict) -> dict:
        if self._closed:
            raise StoreError("the etcd store is closed")
        exc = self._exceptions
        errors = []
        with self._lock:
            first = self._current
        for step in range(len(self._clients)):
            index = (first + step) % len(self._clients)
            client = self._clients[index]
            try:
                result = client.post(client.get_url(path), json=payload)
            except (exc.ConnectionFailedError, exc.ConnectionTimeoutError) as err:
                errors.append("%s: %s" % (self.endpoints[index], _short(err)))
                continue
            except exc.Etcd3Exception as err:
                detail = _short(err)
                if "too many operations" in detail:
                    raise StoreError("etcd refused a transaction with too many operations (etcd's "
                                     "--max-txn-ops, 128 by default): %s" % detail) from None
                raise StoreError("etcd at %s refused %s: %s" % (self.endpoints[index], path, detail)) from None
            except Exception as err:  # requests' own errors (TLS, bad URL, ...)
                errors.append("%s: %s" % (self.endpoints[index], _short(err)))
                continue
            with self._lock:
                self._current = index
            return result
        raise StoreError("etcd is unreachable (%s)" % "; ".join(errors))

    def _key(self, key: str) -> bytes:
        return self._raw_prefix + key.encode("utf-8")

    def _range(self, start: bytes, end: Optional[bytes], revision: Optional[int]) -> Tuple[int, List[dict]]:
        payload: Dict[str, Any] = {"key": _b64(start)}
        if end is not None:
            payload["range_end"] = _b64(end)
        if revision is not None:
            payload["revision"] = revision
        result = self._call("/kv/range", payload)
        return int(result["header"]["revision"]), result.get("kvs", [])

    def _decode_kv(self, kv: dict) -> Tuple[str, bytes, int]:
        full = base64.b64decode(kv["key"])
        key = full[len(self._raw_prefix):].decode("utf-8", "replace")
        return key, base64.b64decode(kv.get("value", "")), int(kv["mod_revision"])

    # -- the interface

    def get_default(self, key: str, default: Optional[bytes] = None) -> Optional[bytes]:
        check_key(key)
        _rev, kvs = self._range(self._key(key), None, None)
        return self._decode_kv(kvs[0])[1] if kvs else default

    def items(self, prefix: str = "") -> List[Tuple[str, bytes]]:
        check_prefix(prefix)
        start = self._key(prefix)
        _rev, kvs = self._range(start, _range_end(start), None)
        return sorted(self._decode_kv(kv)[:2] for kv in kvs)

    def put(self, key: str, value: bytes) -> None:
        key, value = check_key(key), check_value(value)
        self._call("/kv/put", {"key": _b64(self._key(key)), "value": _b64(value)})

    def delete(self, key: str) -> None:
        check_key(key)
        self._commit({key: None}, {}, [], None)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Txn]:
        snapshot: Dict[str, Optional[int]] = {"revision": None}
        seen: Dict[bytes, int] = {}  # etcd key read -> its mod_revision (0: absent)
        ranges: List[Tuple[bytes, bytes]] = []

        def at_snapshot(start: bytes, end: Optional[bytes]) -> List[dict]:
            rev, kvs = self._range(start, end, snapshot["revision"])
            if snapshot["revision"] is None:
                snapshot["revision"] = rev
            return kvs

        def read_one(key: str) -> Optional[bytes]:
            full = self._key(key)
            kvs = at_snapshot(full, None)
            seen[full] = int(kvs[0]["mod_revision"]) if kvs else 0
            return self._decode_kv(kvs[0])[1] if kvs else None

        def read_range(prefix: str) -> List[Tuple[str, bytes]]:
            start = self._key(prefix)
            kvs = at_snapshot(start, _range_end(start))
            if not ranges:
                guard = at_snapshot(self._guard_key, None)
                seen[self._guard_key] = int(guard[0]["mod_revision"]) if guard else 0
            ranges.append((start, _range_end(start)))
            return [self._decode_kv(kv)[:2] for kv in kvs]

        with self._tx_lock:
            tx = Txn(read_one, read_range)
            yield tx
            if tx.writes:
                self._commit(tx.writes, seen, ranges, snapshot["revision"])

    def _commit(self, writes: Mapping[str, Optional[bytes]], seen: Mapping[bytes, int],
                ranges: List[Tuple[bytes, bytes]], revision: Optional[int]) -> None:
        # Keys read one by one: unchanged (a deleted key compares as 0). Ranges: no key created or
        # modified after the snapshot; deletions in a range are caught by the guard key, which every
        # delete through this class rewrites. One compare per range, not per key in it.
        compare = [{"key": _b64(k), "target": "MOD", "result": "EQUAL", "mod_revision": rev}
                   for k, rev in sorted(seen.items())]
        if revision is not None:
            compare += [{"key": _b64(s), "range_end": _b64(e), "target": "MOD", "result": "LESS",
                         "mod_revision": revision + 1} for s, e in ranges]
        ops = []
        for key, value in sorted(writes.items()):
            full = _b64(self._key(key))
            if value is None:
                ops.append({"request_delete_range": {"key": full}})
            else:
                ops.append({"request_put": {"key": full, "value": _b64(value)}})
        if any(value is None for value in writes.values()):
            ops.append({"request_put": {"key": _b64(self._guard_key), "value": ""}})
        result = self._call("/kv/txn", {"compare": compare, "success": ops, "failure": []})
        if not result.get("succeeded", False):
            raise TransactionConflict("another writer changed the etcd keys this transaction read "
                                      "(under %r); nothing was written" % self.prefix)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for client in self._clients:
            with contextlib.suppress(Exception):
                client.session.close()


def _short(err: Exception) -> str:
    detail = getattr(err, "detail_text", None)
    try:
        # The gateway's JSON error body: {"error": ..., "message": ..., "code": ...}
        detail = json.loads(detail)["message"]
    except (TypeError, ValueError, KeyError):
        pass
    text = " ".join(str(a) for a in (detail,) + tuple(getattr(err, "args", ())) if a) or type(err).__name__
    return text.strip()[:300]


# --------------------------------------------------------------------------- helpers


def open_store(spec: Mapping[str, Any]) -> _BaseStore:
    """``{"type": "memory"}``, ``{"type": "file", "path": ...}`` or
    ``{"type": "etcd", "endpoints": [...], "prefix": ..., "timeout": ..., "tls": {...}}``."""
    if not isinstance(spec, Mapping):
        raise InputError("store", "a mapping with a type", type(spec).__name__)
    kind = spec.get("type")
    allowed = {"memory": {"type"}, "file": {"type", "path"},
               "etcd": {"type", "endpoints", "prefix", "timeout", "tls"}}
    if kind not in allowed:
        raise InputError("store.type", "one of memory, file, etcd", kind)
    unknown = set(spec) - allowed[kind]
    if unknown:
        raise InputError("store", "only the options %s for a %s store" % (", ".join(sorted(allowed[kind])), kind),
                         sorted(unknown))
    if kind == "memory":
        return MemoryStore()
    if kind == "file":
        if not isinstance(spec.get("path"), str) or not spec.get("path"):
            raise InputError("store.path", "a file path", spec.get("path"))
        return FileStore(spec["path"])
    kwargs = {k: spec[k] for k in ("prefix", "timeout", "tls") if k in spec}
    return EtcdStore(spec.get("endpoints"), **kwargs)


def transfer(src: _BaseStore, dst: _BaseStore) -> int:
    """Copies every key of ``src`` into ``dst`` in one transaction of ``dst`` (SPEC §6.8: the
    in-memory store goes to etcd on activation). Keys only in ``dst`` stay. Returns the count."""
    entries = src.items("")

    def copy(tx: Txn) -> None:
        for key, value in entries:
            tx.put(key, value)

    dst.update(copy)
    return len(entries)
