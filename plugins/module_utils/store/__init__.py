# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node agent's key-value stores (docs/store.md, "Interface"): one interface, three back ends.

Rooms: ``base.py`` (interface, transactions, MemoryStore), ``file.py``, ``etcd.py``; this module
re-exports their names and holds ``open_store`` and ``transfer``.

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

from typing import Any, Mapping

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.store.base import (  # noqa: F401 pylint: disable=unused-import
    DEFAULT_ETCD_PREFIX,
    DEFAULT_UPDATE_ATTEMPTS,
    FILE_FORMAT,
    KeyNotFound,
    MemoryStore,
    StoreError,
    TransactionConflict,
    Txn,
    _BaseStore,
    _ReentrantGuard,
    check_key,
    check_prefix,
    check_value,
)
from ansible_collections.constellation.cluster.plugins.module_utils.store.file import (  # noqa: F401 pylint: disable=unused-import
    FileStore,
)
from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd import (  # noqa: F401 pylint: disable=unused-import
    EtcdStore,
    _b64,
    _range_end,
    _short,
)
from ansible_collections.constellation.cluster.plugins.module_utils.store.file import (  # noqa: F401
    FileStore,
)
from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd import (  # noqa: F401
    EtcdStore,
)


# --------------------------------------------------------------------------- helpers


def open_store(spec: Mapping[str, Any], cipher: Any = None) -> _BaseStore:
    """``{"type": "memory"}``, ``{"type": "file", "path": ...}`` or
    ``{"type": "etcd", "endpoints": [...], "prefix": ..., "timeout": ..., "tls": {...}}``. ``cipher``: what a
    file store is sealed with (the agent's secrets at rest, core/at_rest.py)."""
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
        return FileStore(spec["path"], cipher=cipher)
    kwargs = {k: spec[k] for k in ("prefix", "timeout", "tls") if k in spec}
    return EtcdStore(spec.get("endpoints"), **kwargs)


def transfer(src: _BaseStore, dst: _BaseStore) -> int:
    """Copies every key of ``src`` into ``dst`` in one transaction of ``dst`` (docs/store.md, "Interface": the
    in-memory store goes to etcd on activation). Keys only in ``dst`` stay. Returns the count."""
    entries = src.items("")

    def copy(tx: Txn) -> None:
        for key, value in entries:
            tx.put(key, value)

    dst.update(copy)
    return len(entries)
