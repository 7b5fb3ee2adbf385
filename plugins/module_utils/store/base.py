# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The store interface every back end shares: errors, key and value checks, transactions, the base
class, and the in-memory store."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError, StateError


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


class _Reader:
    """``get`` over ``get_default``, for a transaction and a store alike."""

    def get(self, key: str) -> bytes:
        value = self.get_default(key)
        if value is None:
            raise KeyNotFound(key)
        return value

    def get_default(self, key: str, default: Optional[bytes] = None) -> Optional[bytes]:
        raise NotImplementedError


class Txn(_Reader):
    """Buffered writes over a reader; the store decides how to commit them."""

    def __init__(self, read_one: Callable[[str], Optional[bytes]],
                 read_range: Callable[[str], List[Tuple[str, bytes]]]):
        self._read_one = read_one
        self._read_range = read_range
        self.writes: Dict[str, Optional[bytes]] = {}  # None: delete

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


class _BaseStore(_Reader):
    """What every store shares: plain operations as one-step transactions, ``update``, closing."""

    def peek(self, key: str, default: Optional[bytes] = None) -> Optional[bytes]:
        """``get_default`` where a store can answer faster or without a majority, possibly a little behind
        (etcd: a serializable read of its member's copy). For hints only, never inside a transaction."""
        return self.get_default(key, default)

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

    def lead(self, key: str, holder: str, ttl: int, lease: Optional[int] = None) -> Tuple[str, Optional[int]]:
        """One step of an election for ``key``: keeps or takes ``key`` for ``holder`` under a lease of
        ``ttl`` seconds (``lease``: what the previous step returned). Returns the holder now and the
        lease to pass next time. A store that only one process uses has no rival: ``holder`` leads."""
        check_key(key)
        return holder, lease

    def resign(self, key: str, holder: str, lease: Optional[int]) -> None:
        """Gives ``key`` up if ``holder`` holds it, at once (no wait for the lease to run out)."""
        check_key(key)

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
