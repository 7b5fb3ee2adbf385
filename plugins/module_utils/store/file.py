# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""FileStore: one JSON file, replaced atomically on every write; threads serialised by a lock,
processes by flock."""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import json
import os
from typing import Dict, Iterator, List, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_write
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.store.base import (  # noqa: F401
    FILE_FORMAT,
    StoreError,
    Txn,
    _BaseStore,
    _ReentrantGuard,
    check_key,
    check_prefix,
)


# --------------------------------------------------------------------------- file


class FileStore(_BaseStore):
    """One JSON file ``{"format": ..., "items": {key: base64(value)}}``, replaced atomically."""

    def __init__(self, path: str, cipher=None):
        """``cipher``: the agent's secrets at rest (core/at_rest.py, ``encrypt``/``decrypt``): the whole file is
        sealed with it; without one the file is plain JSON (the controller's and tests' stores)."""
        if not isinstance(path, str) or not path:
            raise InputError("path", "a file path", path)
        self.cipher = cipher
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
        if self.cipher is not None:
            raw = self.cipher.decrypt(raw, os.path.basename(self.path))
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
        if self.cipher is not None:
            raw = self.cipher.encrypt(raw, os.path.basename(self.path))
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

    def relocate(self, path: str) -> bool:
        """Moves the store to ``path`` (e.g. onto the mounted state disk), atomically for its readers: the data is
        written there whole (temp file, fsync, rename), then this object uses it and the old file is removed. A file
        already at ``path`` wins (an earlier move that ended before the old file was removed). Returns whether the
        data was copied now."""
        target = os.path.abspath(path)
        if target == self.path:
            return False
        with self._locked():
            old = (self.path, self.lock_path, self._dir)
            data = None if os.path.exists(target) else self._load()
            self.path, self.lock_path, self._dir = target, target + ".lock", os.path.dirname(target)
            self._cache = None
            try:
                os.makedirs(self._dir, mode=0o700, exist_ok=True)
                self._remove_stale_temp_files()
                if data is not None:
                    self._write(data)
                else:
                    self._load()  # refuse a corrupt file now, and keep the old one
            except (OSError, StoreError) as err:
                self.path, self.lock_path, self._dir = old
                self._cache = None
                if isinstance(err, StoreError):
                    raise
                raise StoreError("cannot move the store to %s: %s" % (target, err.strerror)) from None
            for leftover in old[:2]:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(leftover)
        return data is not None
