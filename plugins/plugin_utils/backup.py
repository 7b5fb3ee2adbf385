# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Backups of the Coordinator's state on the controller (backup.yml, restore.yml; docs/site.md).

A backup is two files in the backup folder (0700), both 0600, written atomically, the data first:

* ``<name>.enc``: ``AES-256-GCM(key, nonce, plaintext, aad)``, the key ``kms.backup_key(kms)``
  (the KMS's key for an info label of its own, outside GetDataKey's reach, docs/kms.md; for the cluster KMS an
  HKDF of the master secret, never the master secret itself), the plaintext the
  canonical JSON of ``{"coordinator_state": <ExportState answer>}``, and where Kubernetes is managed
  ``"kubernetes_etcd_snapshot"``: Kubernetes' etcd snapshot (base64; kubeadm/etcd_snapshot.py, its appended
  SHA-256 checked when sealed and when opened);
* ``<name>.manifest.json``: what (the contents, key counts), when, the cluster ID, the Coordinator, the format
  version, the cipher and nonce, a keyed fingerprint of the state and the data file's size and SHA-256. The
  associated data of the AEAD is the canonical JSON of the manifest without its two data fields (which
  depend on the ciphertext): changing any other field of the manifest fails the decryption.

The manifest is the commit marker: a data file without one is no backup. Opening a backup checks, in order,
the manifest's format, the data file's size and digest, the cluster ID against the one the controller
derives, the AEAD, the fingerprint and (when the manifest lists one) the Kubernetes etcd snapshot's size, digest
and integrity; each refusal (``BackupRefused``) names the file and the reason, and
nothing is sent before all of them passed. "A second run changes nothing": when the Coordinator's state
has the same fingerprint as the newest backup of this cluster in the folder, no new backup is written. The
fingerprint covers the Kubernetes etcd snapshot's SHA-256 too: a snapshot of an unchanged etcd is the same
bytes, but a live Kubernetes writes to its etcd every few seconds (node leases), so with Kubernetes nearly
every run writes a new backup - the state really changed.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import json
import os
import secrets
from typing import Any, Callable, Dict, List, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils import constants
from ansible_collections.constellation.cluster.plugins.module_utils import kms as kms_mod
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_write

FORMAT = "constellation.cluster/backup/v1"
CIPHER = "AES-256-GCM"
KEY_DERIVATION = "HKDF-SHA256(master key, master salt, info=%s)" % kms_mod.BACKUP_KEY_INFO.decode()
MANIFEST_SUFFIX = ".manifest.json"
DATA_SUFFIX = ".enc"
MAX_MANIFEST = 1 << 20
MAX_STATE = 64 << 20
MAX_KUBERNETES_ETCD_SNAPSHOT = 256 << 20  # kubeadm/etcd_snapshot.MAX_SIZE
# The data: the state, the snapshot in base64, the AEAD's nonce and tag.
MAX_DATA = MAX_STATE + (MAX_KUBERNETES_ETCD_SNAPSHOT + 2) // 3 * 4 + 4096
KUBERNETES_ETCD = "kubernetes_etcd"
_DATA_FIELDS = ("data_sha256", "data_size")
_FINGERPRINT_INFO = b"constellation.cluster/backup-fingerprint/v1"


class BackupRefused(ConstellationError):
    """A backup that is not opened (names the file and the reason); nothing was sent."""


def canonical(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")


def _aad(manifest: Dict[str, Any]) -> bytes:
    return canonical({k: v for k, v in manifest.items() if k not in _DATA_FIELDS})


def fingerprint(kms: kms_mod.KMS, exported: Dict[str, Any], kubernetes_etcd_sha256: Optional[str] = None) -> str:
    """A keyed digest of the state (HMAC-SHA256 under a key derived from the backup key): says whether two
    exports hold the same state without saying anything about it to whoever reads the manifest. With a
    Kubernetes etcd snapshot, its SHA-256 is part of it (without one, the digest is the one of format v1's
    first backups)."""
    key = kms_mod.hkdf_sha256(kms_mod.backup_key(kms), b"", _FINGERPRINT_INFO, 32)
    doc = exported if kubernetes_etcd_sha256 is None else {"coordinator_state": exported,
                                                           "kubernetes_etcd_sha256": kubernetes_etcd_sha256}
    return hmac.new(key, canonical(doc), hashlib.sha256).hexdigest()


def key_derivation(kms: kms_mod.KMS) -> str:
    """The manifest's ``cipher.key``: how the backup key is derived from this KMS."""
    if isinstance(kms, kms_mod.ClusterKMS):
        return KEY_DERIVATION
    return "the KMS's get_dek(%s)" % kms_mod.BACKUP_KEY_INFO.decode()


def _now() -> Tuple[str, str]:
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), now.strftime("backup-%Y%m%dT%H%M%S%fZ")


def seal(kms: kms_mod.KMS, exported: Dict[str, Any], endpoint: str,
         kubernetes: Optional[Dict[str, Any]] = None, kubernetes_etcd_snapshot: Optional[bytes] = None
         ) -> Tuple[Dict[str, Any], bytes, str]:
    """(manifest, data, name) of a new backup of ``exported`` (an ExportState answer) and, when given, of
    Kubernetes' etcd snapshot (verified first: a damaged one is refused, nothing is sealed). ``kubernetes``: the
    manifest's entry for Kubernetes' etcd (where it was taken, or why it is not included)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    created, name = _now()
    nonce = secrets.token_bytes(12)
    contents = [{"name": "coordinator_state", "what": "the Coordinator's store (ExportState over the admin channel)",
                 "keys": len(exported.get("items") or {}) + len(exported.get("cluster_items") or {}),
                 "format": exported.get("format")}]
    plain: Dict[str, Any] = {"coordinator_state": exported}
    snapshot_sha256 = None
    if kubernetes_etcd_snapshot is not None:
        snapshot_sha256 = check_snapshot(kubernetes_etcd_snapshot, "the Kubernetes etcd snapshot to back up")
        contents.append(dict(kubernetes or {}, name=KUBERNETES_ETCD, included=True, size=len(kubernetes_etcd_snapshot),
                             sha256=snapshot_sha256, what="Kubernetes' etcd (Maintenance.Snapshot; restore it with "
                                                          "etcdutl snapshot restore, docs/site.md)"))
        plain["kubernetes_etcd_snapshot"] = base64.b64encode(kubernetes_etcd_snapshot).decode()
    else:
        contents.append(dict(kubernetes or {"name": KUBERNETES_ETCD, "included": False,
                                            "reason": "Kubernetes is not managed by this inventory"}))
    manifest = {"format": FORMAT, "created": created, "cluster_id": exported.get("cluster_id"),
                "coordinator": {"endpoint": endpoint, "vpn_ip": exported.get("vpn_ip")}, "contents": contents,
                "peer_resource_version": peer_resource_version(exported),
                "state_fingerprint": fingerprint(kms, exported, snapshot_sha256),
                "cipher": {"algorithm": CIPHER, "key": key_derivation(kms), "nonce": base64.b64encode(nonce).decode(),
                           "aad": "the canonical JSON of this manifest without %s" % " and ".join(_DATA_FIELDS)},
                "data_file": name + DATA_SUFFIX}
    data = nonce + AESGCM(kms_mod.backup_key(kms)).encrypt(nonce, canonical(plain), _aad(manifest))
    manifest.update(data_sha256=hashlib.sha256(data).hexdigest(), data_size=len(data))
    return manifest, data, name


def peer_resource_version(exported: Any) -> Optional[int]:
    """The version of the peer set in an ExportState answer (the backup's counter: every change of the peers, an
    eviction too, raises it), or None in a backup made without it."""
    version = exported.get("peer_resource_version") if isinstance(exported, dict) else None
    return version if isinstance(version, int) and not isinstance(version, bool) else None


def choose(backup: Optional[str], backup_dir: Optional[str], cluster_id: bytes) -> Tuple[str, bool]:
    """(manifest path, named): the backup the admin names (a manifest's path, or a backup's name in
    ``backup_dir``: ``backup-...`` with or without ``.manifest.json``), else the newest of this cluster in
    ``backup_dir`` (which ``check_not_older`` checks against what the cluster reached)."""
    if backup:
        if os.path.isfile(backup) or not backup_dir or os.sep in backup:
            return backup, True
        name = backup if backup.endswith(MANIFEST_SUFFIX) else backup + MANIFEST_SUFFIX
        return os.path.join(backup_dir, name), True
    if not backup_dir:
        raise InputError("backup", "the backup's manifest file or name, or backup_dir to take the newest of this cluster")
    found = backups(backup_dir, base64.b64encode(cluster_id).decode())
    if not found:
        raise InputError("backup_dir", "a folder with a backup of this cluster", backup_dir)
    return found[-1][0], False


def check_not_older(path: str, version: Optional[int], reached: Dict[str, Optional[int]]) -> None:
    """The newest backup in its folder is restored only when its peer set is not older than the one the cluster
    is known to have reached: ``reached`` maps each Node asked to the version it applied (None: it did not answer).
    Its newer backups deleted, the newest left would roll back every change since (an evicted peer would come
    back). BackupRefused naming both versions and the override: naming the backup."""
    override = ("to restore it anyway, name it: -e constellation_backup=%s (restore.yml, docs/site.md)" % path)
    answered = {endpoint: v for endpoint, v in reached.items() if v is not None}
    if reached and not answered:
        raise BackupRefused("%s: none of the Nodes (%s) answered with the peer set version it applied, so the newest "
                            "backup cannot be checked against what the cluster reached; %s"
                            % (path, ", ".join(sorted(reached)), override))
    if not answered:
        return
    endpoint = max(sorted(answered), key=lambda e: answered[e])
    if version is None:
        raise BackupRefused("%s does not say which peer set version it holds (made by an older version of this "
                            "collection), so it cannot be checked against version %d, which %s applied; %s"
                            % (path, answered[endpoint], endpoint, override))
    if version < answered[endpoint]:
        raise BackupRefused("%s holds the peer set at version %d, older than version %d, which %s applied: the newest "
                            "backup left in its folder would roll back what changed since (an evicted peer would come "
                            "back); %s" % (path, version, answered[endpoint], endpoint, override))


def reached_versions(endpoints: List[str], settings, admin_priv_key, cluster_id: bytes) -> Dict[str, Optional[int]]:
    """The peer set version each Node at ``endpoints`` applied (attested, PCR 15 ours, GetState's details after
    AdminAuth); None for one that cannot be reached or is not a Node of this cluster."""
    from ansible_collections.constellation.cluster.plugins.plugin_utils.controller import IS_NODE, OURS, peer_report

    reached: Dict[str, Optional[int]] = {}
    for endpoint in endpoints:
        try:
            report = peer_report(endpoint, settings, cluster_id, admin_priv_key)
        except (ConstellationError, OSError):
            reached[endpoint] = None
            continue
        ours = report.membership == OURS and report.state == IS_NODE
        reached[endpoint] = report.peer_resource_version if ours else None
    return reached


def check_snapshot(data: bytes, what: str) -> str:
    """The SHA-256 (hex) of an intact Kubernetes etcd snapshot of at most MAX_KUBERNETES_ETCD_SNAPSHOT bytes;
    BackupRefused naming ``what`` and the reason otherwise."""
    from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm import etcd_snapshot

    if len(data) > MAX_KUBERNETES_ETCD_SNAPSHOT:
        raise BackupRefused("%s is %d bytes, more than %d" % (what, len(data), MAX_KUBERNETES_ETCD_SNAPSHOT))
    try:
        return etcd_snapshot.verify(data, what)
    except etcd_snapshot.SnapshotError as err:
        raise BackupRefused(str(err)) from None


def kubernetes_etcd_entry(manifest: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The manifest's entry of an included Kubernetes etcd snapshot, or None."""
    for entry in manifest.get("contents") or []:
        if isinstance(entry, dict) and entry.get("name") == KUBERNETES_ETCD and entry.get("included") is True:
            return entry
    return None


def write(backup_dir: str, manifest: Dict[str, Any], data: bytes, name: str) -> str:
    """Writes the data, then the manifest (0600, atomically) into ``backup_dir`` (made 0700); the manifest's path."""
    os.makedirs(backup_dir, mode=0o700, exist_ok=True)
    atomic_write(os.path.join(backup_dir, name + DATA_SUFFIX), data, 0o600, exclusive=True)
    path = os.path.join(backup_dir, name + MANIFEST_SUFFIX)
    atomic_write(path, json.dumps(manifest, indent=2, sort_keys=True).encode() + b"\n", 0o600, exclusive=True)
    return path


def read_manifest(path: str) -> Dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_MANIFEST + 1)
    except OSError as err:
        raise BackupRefused("%s: cannot read the backup's manifest: %s" % (path, err.strerror)) from None
    try:
        manifest = json.loads(raw) if len(raw) <= MAX_MANIFEST else None
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict):
        raise BackupRefused("%s: not a backup manifest (not a JSON object of at most 1 MiB)" % path)
    if manifest.get("format") != FORMAT:
        raise BackupRefused("%s: not a backup of format %s (format %r)" % (path, FORMAT, str(manifest.get("format"))[:80]))
    return manifest


def backups(backup_dir: str, cluster_id: Optional[str] = None) -> List[Tuple[str, Dict[str, Any]]]:
    """(manifest path, manifest) of the readable backups in ``backup_dir`` (of ``cluster_id``), oldest first."""
    found = []
    try:
        names = sorted(os.listdir(backup_dir))
    except FileNotFoundError:
        return []
    for entry in names:
        if not entry.endswith(MANIFEST_SUFFIX):
            continue
        path = os.path.join(backup_dir, entry)
        try:
            manifest = read_manifest(path)
        except BackupRefused:
            continue
        if cluster_id is None or manifest.get("cluster_id") == cluster_id:
            found.append((path, manifest))
    return sorted(found, key=lambda item: (str(item[1].get("created")), item[0]))


def open_backup(path: str, kms: kms_mod.KMS, cluster_id: bytes) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(manifest, the Coordinator's exported state) of the backup whose manifest is ``path``, after every
    check (module docstring); BackupRefused naming the file and the reason otherwise."""
    manifest, exported, _snapshot = open_all(path, kms, cluster_id)
    return manifest, exported


def open_all(path: str, kms: kms_mod.KMS, cluster_id: bytes
             ) -> Tuple[Dict[str, Any], Dict[str, Any], Optional[bytes]]:
    """(manifest, the Coordinator's exported state, Kubernetes' etcd snapshot or None) of the backup whose
    manifest is ``path``, after every check of ``open_backup`` and, when the manifest lists a snapshot, its size,
    SHA-256 and integrity; BackupRefused naming the file and the reason otherwise."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    manifest = read_manifest(path)
    data_name = manifest.get("data_file")
    if not isinstance(data_name, str) or os.path.basename(data_name) != data_name or not data_name.endswith(DATA_SUFFIX):
        raise BackupRefused("%s: the manifest names no data file in its folder" % path)
    data_path = os.path.join(os.path.dirname(path), data_name)
    try:
        with open(data_path, "rb") as handle:
            data = handle.read(MAX_DATA + 1)
    except OSError as err:
        raise BackupRefused("%s: cannot read the backup's data: %s" % (data_path, err.strerror)) from None
    if len(data) != manifest.get("data_size"):
        raise BackupRefused("%s: %d bytes, the manifest says %s: damaged or changed"
                            % (data_path, len(data), manifest.get("data_size")))
    if not hmac.compare_digest(hashlib.sha256(data).hexdigest(), str(manifest.get("data_sha256"))):
        raise BackupRefused("%s: its SHA-256 does not match the manifest's data_sha256 (%s): damaged or changed"
                            % (data_path, os.path.basename(path)))
    if manifest.get("cluster_id") != base64.b64encode(cluster_id).decode():
        raise BackupRefused("%s: a backup of another cluster (cluster ID %s, this inventory's is %s)"
                            % (path, str(manifest.get("cluster_id"))[:64], base64.b64encode(cluster_id).decode()))
    try:
        plain = AESGCM(kms_mod.backup_key(kms)).decrypt(data[:12], data[12:], _aad(manifest))
    except (InvalidTag, ValueError):
        raise BackupRefused("%s: the authenticated decryption failed: the manifest or the data was changed, or the "
                            "backup was made with another master secret" % path) from None
    try:
        doc = json.loads(plain)
        exported = doc["coordinator_state"]
    except (ValueError, KeyError, TypeError):
        raise BackupRefused("%s: the decrypted backup holds no Coordinator state" % path) from None
    entry = kubernetes_etcd_entry(manifest)
    snapshot = None
    if entry is not None:
        try:
            snapshot = base64.b64decode(doc["kubernetes_etcd_snapshot"], validate=True)
        except (KeyError, TypeError, ValueError):
            raise BackupRefused("%s: the manifest lists a Kubernetes etcd snapshot, the decrypted backup holds none" % path) from None
        if len(snapshot) != entry.get("size") or hashlib.sha256(snapshot).hexdigest() != entry.get("sha256"):
            raise BackupRefused("%s: the Kubernetes etcd snapshot does not match the manifest's size and sha256" % path)
        check_snapshot(snapshot, "%s: the Kubernetes etcd snapshot" % path)
    if not isinstance(exported, dict) or exported.get("cluster_id") != manifest.get("cluster_id") \
            or not hmac.compare_digest(fingerprint(kms, exported, entry and entry.get("sha256")),
                                       str(manifest.get("state_fingerprint"))):
        raise BackupRefused("%s: the decrypted state does not match the manifest (cluster ID, fingerprint)" % path)
    return manifest, exported, snapshot


def export_state(endpoint: str, settings, admin_priv_key, cluster_id: bytes) -> Dict[str, Any]:
    """The attested Coordinator's state (ExportState after AdminAuth); StateError if it is not an activated
    Coordinator of this cluster (PCR 15)."""
    from ansible_collections.constellation.cluster.plugins.plugin_utils.controller import open_coordinator

    if cluster_id is None:
        raise StateError("%s: the cluster ID is needed to back up its Coordinator (PCR 15 must be ours)" % endpoint)
    with open_coordinator(endpoint, settings, admin_priv_key, cluster_id, ": nothing to back up from it") as client:
        exported = client.export_state()
    if exported.get("cluster_id") != base64.b64encode(cluster_id).decode():
        raise StateError("%s exported another cluster's state" % endpoint)
    return exported


def restore(endpoint: str, settings, kms_uri: str, measurement_salt: bytes, cluster_id: bytes, admin_pub_key: str,
            exported: Dict[str, Any], init_secret: Optional[bytes], check_mode: bool,
            peer_version_floor: Optional[Callable[[], Optional[int]]] = None) -> Dict[str, Any]:
    """Restores ``exported`` (from ``open_backup``) onto the attested fresh peer at ``endpoint``
    (ActivateAsCoordinator with restore_state). A Coordinator of this cluster is left alone (changed False);
    anything but a fresh peer is refused, naming it. ``peer_version_floor()``, asked only for a fresh peer (also in
    check mode): the highest version the Nodes applied, which the restored peer set continues above; it may refuse
    (``check_not_older``)."""
    from ansible_collections.constellation.cluster.plugins.plugin_utils.controller import (
        ACCEPTING_INIT, ACTIVATING_NODES, FRESH, OURS, ROLE_COORDINATOR, open_peer, report_of)

    result: Dict[str, Any] = {"changed": False, "endpoint": endpoint}

    def fresh(client) -> bool:
        report = report_of(client, endpoint, cluster_id)
        result.update(state_before=report.state, state=report.state)
        if report.membership == OURS and report.role == ROLE_COORDINATOR and report.state == ACTIVATING_NODES:
            result["note"] = "already a Coordinator of this cluster: nothing to restore"
            return False
        if report.membership != FRESH or report.state != ACCEPTING_INIT:
            raise StateError("%s is %s (role %s, PCR 15 %s): a backup is restored only onto a fresh peer; reset it "
                             "(or recover a rebooted Coordinator with recover.yml)"
                             % (endpoint, report.state, report.role, report.membership))
        if report.role != constants.ROLE_UNKNOWN:
            raise StateError("%s holds a %s's state and waits for recovery: recover it with recover.yml instead of "
                             "restoring a backup over it" % (endpoint, report.role))
        return True

    if peer_version_floor is not None:  # the Nodes are asked only for a fresh peer, on no connection of its
        with open_peer(endpoint, settings) as client:
            if not fresh(client):
                return result
        floor = peer_version_floor()
    else:
        floor = None
    with open_peer(endpoint, settings) as client:
        if not fresh(client):
            return result
        result["changed"] = True
        if check_mode:
            return result
        answer = client.activate_as_coordinator(kms_uri, measurement_salt, admin_pub_key, init_secret=init_secret,
                                                restore_state=exported, peer_resource_version_floor=floor)
    if base64.b64decode(answer.get("cluster_id", "")) != cluster_id or answer.get("coordinator_vpn_ip") != exported.get("vpn_ip"):
        raise StateError("%s answered another cluster ID or VPN IP than the backup's" % endpoint)
    result.update(state=answer.get("state"), coordinator_vpn_ip=answer.get("coordinator_vpn_ip"),
                  coordinator_vpn_pub_key=answer.get("coordinator_vpn_pub_key"))
    return result
