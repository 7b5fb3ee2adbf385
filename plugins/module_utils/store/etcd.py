# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""EtcdStore: etcd v3 through its HTTP gateway (etcd3gw), with optimistic transactions that compare the
mod_revision of everything read."""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.encoding import parse_endpoint
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.store.base import (  # noqa: F401
    DEFAULT_ETCD_PREFIX,
    StoreError,
    TransactionConflict,
    Txn,
    _BaseStore,
    check_key,
    check_prefix,
    check_value,
)


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
        self._timeout = timeout
        self._raw_prefix = prefix.encode("utf-8")
        # Outside every prefix's range (prefixes never start with NUL): rewritten by each delete.
        self._guard_key = b"\0constellation-delete-guard/" + self._raw_prefix
        self.endpoints: List[str] = []
        self._clients = []
        for index, endpoint in enumerate(endpoints):
            host, port, scheme = self._parse_endpoint(endpoint, index, bool(tls))
            self.endpoints.append("%s://%s:%d" % (scheme, host if ":" not in host else "[%s]" % host, port))
            client = Etcd3Client(host=host, port=port, protocol=scheme, timeout=timeout, api_path="/v3/",
                                 ca_cert=tls.get("ca_cert"), cert_cert=tls.get("cert"), cert_key=tls.get("key"))
            # Not the environment's settings: REQUESTS_CA_BUNDLE would replace the cluster's CA (requests
            # lets it win over the session's), and HTTP(S)_PROXY would send etcd's traffic elsewhere.
            client.session.trust_env = False
            self._clients.append(client)
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
        try:
            host, port = parse_endpoint(rest.rstrip("/"), field)
        except InputError:
            raise InputError(field, "host:port", endpoint) from None
        return host, port, scheme

    # -- transport

    # etcd's answers while it elects a leader (a member died or was cut off): the request was not
    # applied; asked again once a leader is there (a transaction that was applied after all fails its
    # compares and is re-read by ``update``).
    _ELECTING = ("leader changed", "no leader")

    def _call(self, path: str, payload: dict) -> dict:
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                return self._call_once(path, payload)
            except StoreError as err:
                if not any(text in str(err) for text in self._ELECTING) or time.monotonic() >= deadline:
                    raise
            time.sleep(0.05)

    def _call_once(self, path: str, payload: dict) -> dict:
        if self._closed:
            raise StoreError("the etcd store is closed")
        exc = self._exceptions
        errors = []
        silent = []  # endpoints that took the request and did not answer in time
        with self._lock:
            first = self._current
        for step in range(len(self._clients)):
            index = (first + step) % len(self._clients)
            client = self._clients[index]
            try:
                result = client.post(client.get_url(path), json=payload)
            except exc.ConnectionTimeoutError as err:
                silent.append(self.endpoints[index])
                errors.append("%s: %s" % (self.endpoints[index], _short(err)))
                continue
            except exc.ConnectionFailedError as err:
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
        if silent:
            # A member that accepts the request but cannot commit it has lost its majority (or is
            # overloaded). A write it took may still be applied once a majority is back.
            raise StoreError("etcd has no quorum: %s took the request but did not answer within %g s, the other "
                             "members are down or unreachable; writes stop until a majority of the members runs "
                             "again (a write that timed out may be applied then) (%s)"
                             % (", ".join(silent), self._timeout, "; ".join(errors)))
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

    def peek(self, key: str, default: Optional[bytes] = None) -> Optional[bytes]:
        """A serializable read: the member's own copy, no round to the leader, answered without a majority."""
        check_key(key)
        kvs = self._call("/kv/range", {"key": _b64(self._key(key)), "serializable": True}).get("kvs", [])
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

    # -- membership (etcd_member.py): one member per Coordinator

    def member_list(self) -> List[Dict[str, Any]]:
        """Every member: ``{"id", "name", "peer_urls", "client_urls"}`` (a member added but not
        started yet has no name and no client URLs)."""
        result = self._call("/cluster/member/list", {})
        return [{"id": int(m["ID"]), "name": m.get("name", ""), "peer_urls": list(m.get("peerURLs", [])),
                 "client_urls": list(m.get("clientURLs", []))} for m in result.get("members", [])]

    def member_add(self, peer_url: str, wait: float = 30, learner: bool = False) -> int:
        """Adds a member at ``peer_url``. A voting member must start soon: until it does, a cluster of
        two has lost its majority. A ``learner`` does not vote (the majority stays as it was) until
        ``member_promote``; one that never starts is removed without a majority changing. Returns its ID."""
        if not isinstance(peer_url, str) or "://" not in peer_url:
            raise InputError("peer_url", "http(s)://host:port of the new member", peer_url)
        request = {"peerURLs": [peer_url], "isLearner": True} if learner else {"peerURLs": [peer_url]}
        # etcd refuses a change while a member joined only moments ago ("unhealthy cluster": it waits
        # until every member has been connected for a while), and right after its own start ("member not
        # found": it has not published itself yet). Bounded retries.
        return int(self.retry(lambda: self._call("/cluster/member/add", request),
                              ("unhealthy cluster", "member not found"), wait)["member"]["ID"])

    def member_promote(self, member_id: int, wait: float = 30) -> None:
        """Makes the learner ``member_id`` a voting member, once it has caught up with the leader
        (etcd refuses before: retried until ``wait`` runs out)."""
        self.retry(lambda: self._call("/cluster/member/promote", {"ID": str(int(member_id))}),
                   ("in sync with leader", "unhealthy cluster"), wait)

    @staticmethod
    def retry(call: Callable[[], Any], transient: Tuple[str, ...], wait: float) -> Any:
        """``call()``, asked again while it fails with a StoreError naming one of ``transient`` (etcd's
        refusals that pass by themselves), for at most ``wait`` seconds."""
        deadline = time.monotonic() + wait
        while True:
            try:
                return call()
            except StoreError as err:
                if not any(text in str(err) for text in transient) or time.monotonic() >= deadline:
                    raise
            time.sleep(0.25)

    def member_remove(self, member_id: int, wait: float = 30) -> None:
        self.retry(lambda: self._call("/cluster/member/remove", {"ID": str(int(member_id))}),
                   ("unhealthy cluster",), wait)
        # etcd 3.4 does not persist its applied index with a removal (etcd-io/etcd#19571): a member killed
        # before its next write forgets the removal and counts the removed member again after a restart.
        # One write right after makes it durable.
        self._call("/kv/put", {"key": _b64(self._guard_key), "value": _b64(b"member removed")})

    # -- election (leases: a key that lives while its holder renews the lease)

    def lead(self, key: str, holder: str, ttl: int, lease: Optional[int] = None) -> Tuple[str, Optional[int]]:
        check_key(key)
        if isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 1:
            raise InputError("ttl", "a whole number of seconds >= 1", ttl)
        if lease is not None and int(self._call("/lease/keepalive", {"ID": lease}).get("result", {}).get("TTL", -1)) <= 0:
            lease = None  # expired: the key it held is gone
        if lease is None:
            lease = int(self._call("/lease/grant", {"TTL": ttl, "ID": 0})["ID"])
        full = _b64(self._key(key))
        result = self._call("/kv/txn", {
            "compare": [{"key": full, "target": "CREATE", "result": "EQUAL", "create_revision": 0}],
            "success": [{"request_put": {"key": full, "value": _b64(holder.encode("utf-8")), "lease": lease}}],
            "failure": [{"request_range": {"key": full}}]})
        if result.get("succeeded", False):
            return holder, lease
        kvs = result["responses"][0]["response_range"].get("kvs", [])
        return (base64.b64decode(kvs[0].get("value", "")).decode("utf-8", "replace") if kvs else ""), lease

    def resign(self, key: str, holder: str, lease: Optional[int]) -> None:
        check_key(key)
        full = _b64(self._key(key))
        self._call("/kv/txn", {
            "compare": [{"key": full, "target": "VALUE", "result": "EQUAL", "value": _b64(holder.encode("utf-8"))}],
            "success": [{"request_delete_range": {"key": full}}], "failure": []})
        if lease is not None:
            self._call("/kv/lease/revoke", {"ID": lease})

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
