# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A snapshot of Kubernetes' etcd on a kubeadm control plane, without etcdctl (backup.yml; docs/site.md).

etcd v3's ``Maintenance.Snapshot`` through its HTTP/JSON gateway: ``POST /v3/maintenance/snapshot`` answers a
stream of JSON messages, one a line, ``{"result": {"blob": <base64>, "remaining_bytes": N}}``; the blobs joined
are the bbolt database followed by the SHA-256 of the database (etcd 3.4+ sends that digest as the last
message). ``verify`` checks that digest (what ``etcdutl snapshot restore`` checks before it restores), so a
truncated or altered snapshot is refused here and again when a backup is opened.

TLS only, with the CA pinned (kubeadm's ``pki/etcd/ca.crt``; no system roots, no environment proxy) and a client
certificate of that CA (kubeadm's ``pki/etcd/healthcheck-client`` or ``pki/apiserver-etcd-client``). The standard
library only (``http.client``, ``ssl``): a control plane need not have the etcd3gw/requests client that the
Coordinator's store (``store/etcd.py``) uses, and that client cannot stream an answer of many megabytes.
The snapshot holds every Kubernetes Secret: it stays in memory, and callers put it only into the encrypted backup.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import http.client
import json
import os
import ssl
import struct
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.encoding import parse_endpoint
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError
from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_write

DEFAULT_ENDPOINT = "127.0.0.1:2379"
DEFAULT_MAX_SIZE = 128 << 20
MAX_SIZE = 256 << 20  # what a backup archive takes (plugin_utils/backup.py)
HASH_SIZE = 32
_BOLT_MAGIC = 0xED0CDAED  # the first meta page's magic (bbolt's page header is 16 bytes)
_MAX_LINE = 1 << 20  # one message of the stream (etcd sends 32 KiB blobs)


class SnapshotError(ConstellationError):
    """The snapshot was not taken or is not intact; the message names the endpoint or the file and the reason."""


@dataclass(frozen=True)
class Snapshot:
    data: bytes  # the database and its SHA-256, as etcdutl snapshot restore reads it
    sha256: str  # of ``data``, hex
    revision: int  # etcd's revision when the snapshot was asked for
    etcd_version: str

    @property
    def size(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:  # never the data: it holds the cluster's Secrets
        return "Snapshot(size=%d, sha256=%s, revision=%d)" % (self.size, self.sha256, self.revision)


def kubeadm_tls(kubernetes_dir: str = "/etc/kubernetes") -> Dict[str, str]:
    """{"ca_cert", "cert", "key"}: kubeadm's etcd CA and the first client certificate of it that exists
    (``pki/etcd/healthcheck-client``, then ``pki/apiserver-etcd-client``)."""
    pki = os.path.join(kubernetes_dir, "pki")
    ca_cert = os.path.join(pki, "etcd", "ca.crt")
    for stem in (os.path.join(pki, "etcd", "healthcheck-client"), os.path.join(pki, "apiserver-etcd-client")):
        if os.path.isfile(stem + ".crt") and os.path.isfile(stem + ".key"):
            return {"ca_cert": ca_cert, "cert": stem + ".crt", "key": stem + ".key"}
    raise InputError("kubernetes_dir", "a kubeadm control plane's folder with pki/etcd/healthcheck-client.crt/.key or "
                     "pki/apiserver-etcd-client.crt/.key (this host is no kubeadm control plane?)", kubernetes_dir)


def _url(endpoint: str) -> Tuple[str, int, str]:
    rest = endpoint
    if "://" in endpoint:
        scheme, rest = endpoint.split("://", 1)
        if scheme != "https":
            raise InputError("endpoint", "an https:// endpoint (Kubernetes' etcd speaks TLS only)", endpoint)
    host, port = parse_endpoint(rest.rstrip("/"), "endpoint")
    return host, port, "https://%s:%d" % (host if ":" not in host else "[%s]" % host, port)


def _context(tls: Mapping[str, Optional[str]]) -> ssl.SSLContext:
    if not tls.get("ca_cert"):
        raise InputError("ca_cert", "the etcd CA's certificate (pinned: no system roots)", tls.get("ca_cert"))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and the host name
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_verify_locations(cafile=tls["ca_cert"])
        if tls.get("cert") or tls.get("key"):
            context.load_cert_chain(tls["cert"], tls["key"])
    except (OSError, ssl.SSLError, TypeError) as err:
        raise InputError("tls", "readable PEM files for ca_cert, cert and key", "%s (%s)" % (dict(tls), err)) from None
    return context


def _post(endpoint: str, path: str, tls: Mapping[str, Optional[str]], timeout: float):
    host, port, url = _url(endpoint)
    connection = http.client.HTTPSConnection(host, port, timeout=timeout, context=_context(tls))
    try:
        connection.request("POST", path, body=b"{}", headers={"Content-Type": "application/json"})
        response = connection.getresponse()
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as err:
        # TLS 1.3: etcd's refusal of a client certificate reaches the client after its handshake, as an
        # alert, an EOF or a reset, depending on timing.
        connection.close()
        reason = getattr(err, "reason", None) or str(err) or type(err).__name__
        if isinstance(err, ssl.SSLCertVerificationError):
            why = "its server certificate is not one of the pinned CA %s (%s)" % (tls.get("ca_cert"), err.verify_message)
        elif not tls.get("cert"):
            why = "it asks for a client certificate and none was given (%s)" % reason
        else:
            why = "it refused the client certificate %s (%s): not one of its CA?" % (tls.get("cert"), reason)
        raise SnapshotError("etcd at %s: the TLS handshake failed: %s" % (url, why)) from None
    except (OSError, http.client.HTTPException) as err:
        connection.close()
        raise SnapshotError("etcd at %s did not answer %s: %s" % (url, path, err or type(err).__name__)) from None
    if response.status != 200:
        detail = response.read(4096).decode("utf-8", "replace")
        connection.close()
        raise SnapshotError("etcd at %s refused %s: HTTP %d %s" % (url, path, response.status, _message(detail)))
    return connection, response, url


def _message(text: str) -> str:
    try:
        doc = json.loads(text)
        return str(doc.get("message") or doc.get("error") or text)[:300]
    except (ValueError, AttributeError):
        return text.strip()[:300]


def status(endpoint: str, tls: Mapping[str, Optional[str]], timeout: float = 10) -> Dict[str, Any]:
    """{"db_size", "revision", "etcd_version"} of the member at ``endpoint`` (``Maintenance.Status``)."""
    connection, response, url = _post(endpoint, "/v3/maintenance/status", tls, timeout)
    try:
        doc = json.loads(response.read(_MAX_LINE))
        return {"db_size": int(doc.get("dbSize", 0)), "revision": int(doc["header"]["revision"]),
                "etcd_version": str(doc.get("version", ""))}
    except (ValueError, KeyError, TypeError, OSError) as err:
        raise SnapshotError("etcd at %s: no status in its answer (%s)" % (url, err)) from None
    finally:
        connection.close()


def take(endpoint: str, tls: Mapping[str, Optional[str]], max_size: int = DEFAULT_MAX_SIZE,
         timeout: float = 60) -> Snapshot:
    """A verified snapshot of the member at ``endpoint``; SnapshotError naming the endpoint and the reason."""
    if isinstance(max_size, bool) or not isinstance(max_size, int) or not 0 < max_size <= MAX_SIZE:
        raise InputError("max_size", "a size in bytes of at most %d" % MAX_SIZE, max_size)
    before = status(endpoint, tls, timeout)
    if before["db_size"] + HASH_SIZE > max_size:
        raise SnapshotError("etcd at %s: its database is %d bytes, more than max_size %d: nothing was taken (compact "
                            "and defragment it, or raise max_size)" % (endpoint, before["db_size"], max_size))
    connection, response, url = _post(endpoint, "/v3/maintenance/snapshot", tls, timeout)
    data = bytearray()
    try:
        while True:
            line = response.readline(_MAX_LINE + 1)
            if not line:
                break
            if len(line) > _MAX_LINE:
                raise SnapshotError("etcd at %s: a snapshot message longer than %d bytes" % (url, _MAX_LINE))
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError:
                raise SnapshotError("etcd at %s: the snapshot stream holds no JSON message" % url) from None
            if not isinstance(message, dict) or "error" in message or not isinstance(message.get("result"), dict):
                error = message.get("error") if isinstance(message, dict) else None
                raise SnapshotError("etcd at %s refused the snapshot: %s"
                                    % (url, _message(json.dumps(error)) if error else "an unexpected message"))
            try:
                data += base64.b64decode(message["result"].get("blob", ""), validate=True)
            except (binascii.Error, TypeError):
                raise SnapshotError("etcd at %s: a snapshot chunk is not base64" % url) from None
            if len(data) > max_size:
                raise SnapshotError("etcd at %s: the snapshot grew beyond max_size %d while it was taken" % (url, max_size))
    except (OSError, http.client.HTTPException) as err:
        raise SnapshotError("etcd at %s: the snapshot stream broke off after %d bytes: %s"
                            % (url, len(data), err or type(err).__name__)) from None
    finally:
        connection.close()
    raw = bytes(data)
    return Snapshot(raw, verify(raw, "the snapshot of etcd at %s" % url), before["revision"], before["etcd_version"])


def verify(data: bytes, what: str = "the snapshot") -> str:
    """The SHA-256 (hex) of an intact snapshot: a bbolt database followed by its SHA-256, as etcd writes it;
    SnapshotError naming ``what`` and the reason otherwise (truncated, altered, no etcd snapshot)."""
    if not isinstance(data, (bytes, bytearray)) or len(data) < 4096 + HASH_SIZE:
        raise SnapshotError("%s is %s bytes: too short for an etcd snapshot (truncated?)"
                            % (what, len(data) if isinstance(data, (bytes, bytearray)) else "no"))
    if struct.unpack_from("<I", data, 16)[0] != _BOLT_MAGIC:
        raise SnapshotError("%s is no etcd snapshot (no bbolt database at its start)" % what)
    body, digest = data[:-HASH_SIZE], data[-HASH_SIZE:]
    if not hmac.compare_digest(hashlib.sha256(body).digest(), bytes(digest)):
        raise SnapshotError("%s is damaged: its last %d bytes are not the SHA-256 of the database before them "
                            "(truncated or altered)" % (what, HASH_SIZE))
    return hashlib.sha256(data).hexdigest()


def write(dest: str, data: bytes, check_mode: bool = False) -> Dict[str, Any]:
    """Writes the verified snapshot ``data`` to ``dest`` (0600, atomically) for ``etcdutl snapshot restore``;
    a file there with the same SHA-256 (and mode 0600) is left alone. {"changed", "dest", "size", "sha256",
    "before": {"size", "sha256"} or None} - metadata only, never the data."""
    sha256 = verify(data, "the snapshot to write to %s" % dest)
    if not os.path.isabs(dest) or dest.endswith("/"):
        raise InputError("dest", "an absolute file path", dest)
    if not os.path.isdir(os.path.dirname(dest)):
        raise InputError("dest", "a path in an existing folder", dest)
    before = None
    if os.path.lexists(dest):
        if os.path.islink(dest) or not os.path.isfile(dest):
            raise InputError("dest", "a path that is a regular file or nothing (not a link, not a folder)", dest)
        digest = hashlib.sha256()
        with open(dest, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        before = {"size": os.path.getsize(dest), "sha256": digest.hexdigest(),
                  "mode": "%04o" % (os.stat(dest).st_mode & 0o7777)}
    changed = before is None or before["sha256"] != sha256 or before["mode"] != "0600"
    if changed and not check_mode:
        atomic_write(dest, data, 0o600)
    return {"changed": changed, "dest": dest, "size": len(data), "sha256": sha256, "before": before}
