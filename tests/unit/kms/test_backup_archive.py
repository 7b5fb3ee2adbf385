# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The backup on the controller (plugins/plugin_utils/backup.py, backup.yml): the key derived from the master secret
(never the secret), AES-256-GCM with the manifest as associated data, files 0600 in a 0700 folder, and every way a
backup can be refused - each names the file and the reason."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import struct

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.plugin_utils import backup

SALT = os.urandom(32)


@pytest.fixture
def master():
    return kms.MasterSecret.generate()


def export_of(master, extra=b"peer"):
    cluster_id = kms.ClusterKMS(master).cluster_id(SALT)
    return {"format": "constellation.cluster/coordinator-state/v1", "cluster_id": base64.b64encode(cluster_id).decode(),
            "vpn_ip": "10.118.0.1",
            "items": {"nodeState": base64.b64encode(b"wireguard-private-key").decode(),
                      "peer10.118.0.1": base64.b64encode(extra).decode()}}


def written(tmp_path, master, exported):
    manifest, data, name = backup.seal(kms.ClusterKMS(master), exported, "192.0.2.10:9000")
    return backup.write(str(tmp_path / "backups"), manifest, data, name)


def test_the_key_is_derived_with_its_own_label_and_is_no_kms_key(master):
    key = kms.backup_key(kms.ClusterKMS(master))
    assert len(key) == 32 and key != master.key
    assert key == kms.hkdf_sha256(master.key, master.salt, b"constellation.cluster/backup-encryption-key/v1", 32)
    cluster = kms.ClusterKMS(master)
    assert key not in {cluster.derive_key("backup"), cluster.derive_key("constellation.cluster/backup-encryption-key/v1")}


def test_round_trip_files_and_modes(tmp_path, master):
    exported = export_of(master)
    path = written(tmp_path, master, exported)
    folder = tmp_path / "backups"
    manifest = json.loads(open(path).read())
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()} == {0o600}
    assert sorted(p.name for p in folder.iterdir()) == sorted([os.path.basename(path), manifest["data_file"]])
    assert b"wireguard-private-key" not in (folder / manifest["data_file"]).read_bytes()
    cluster_id = kms.ClusterKMS(master).cluster_id(SALT)
    opened, state = backup.open_backup(path, kms.ClusterKMS(master), cluster_id)
    assert state == exported and opened == manifest
    assert backup.backups(str(folder), manifest["cluster_id"]) == [(path, manifest)]
    assert backup.backups(str(folder), "another") == []
    # The fingerprint says "same state" and nothing else; another state has another one.
    assert manifest["state_fingerprint"] == backup.fingerprint(kms.ClusterKMS(master), exported)
    assert backup.fingerprint(kms.ClusterKMS(master), export_of(master, b"other")) != manifest["state_fingerprint"]


@pytest.mark.parametrize("how, reason", [
    ("flip", "its SHA-256 does not match the manifest's data_sha256"),
    ("digest", "its SHA-256 does not match the manifest's data_sha256"),
    ("truncate", "bytes, the manifest says"),
    ("field", "the authenticated decryption failed"),
    ("nonce", "the authenticated decryption failed"),
    ("format", "not a backup of format constellation.cluster/backup/v1"),
    ("data_file", "the manifest names no data file in its folder"),
    ("missing", "cannot read the backup's data"),
    ("json", "not a backup manifest"),
])
def test_a_tampered_backup_is_refused_naming_the_file_and_the_reason(tmp_path, master, how, reason):
    path = written(tmp_path, master, export_of(master))
    manifest = json.loads(open(path).read())
    data_path = tmp_path / "backups" / manifest["data_file"]
    data = bytearray(data_path.read_bytes())
    if how == "flip":
        data[-5] ^= 0x80
    elif how == "digest":
        manifest["data_sha256"] = "f" * 64
    elif how == "truncate":
        data = data[:-1]
    elif how == "field":
        manifest["created"] = "2000-01-01T00:00:00.000000Z"
    elif how == "nonce":
        manifest["cipher"]["nonce"] = base64.b64encode(os.urandom(12)).decode()
    elif how == "format":
        manifest["format"] = "constellation.cluster/backup/v0"
    elif how == "data_file":
        manifest["data_file"] = "../../etc/passwd.enc"
    elif how == "missing":
        data_path.unlink()
    if how != "missing":
        data_path.write_bytes(bytes(data))
    open(path, "w").write("{not json" if how == "json" else json.dumps(manifest))
    with pytest.raises(backup.BackupRefused) as refused:
        backup.open_backup(path, kms.ClusterKMS(master), kms.ClusterKMS(master).cluster_id(SALT))
    assert reason in str(refused.value)
    assert str(tmp_path / "backups") in str(refused.value)


def test_a_foreign_backup_and_another_master_secret_are_refused(tmp_path, master):
    path = written(tmp_path, master, export_of(master))
    other = kms.MasterSecret.generate()
    with pytest.raises(backup.BackupRefused) as refused:  # this inventory's cluster ID differs
        backup.open_backup(path, kms.ClusterKMS(other), kms.ClusterKMS(other).cluster_id(SALT))
    assert "a backup of another cluster" in str(refused.value)
    with pytest.raises(backup.BackupRefused) as refused:  # same cluster ID claimed, another key
        backup.open_backup(path, kms.ClusterKMS(other), kms.ClusterKMS(master).cluster_id(SALT))
    assert "the authenticated decryption failed" in str(refused.value)


def snapshot_of(marker=b"kubernetes-secret"):
    """An etcd snapshot's shape: a bbolt database (its first meta page's magic) followed by its SHA-256."""
    body = bytearray(8192)
    struct.pack_into("<I", body, 16, 0xED0CDAED)
    body[4096:4096 + len(marker)] = marker
    return bytes(body) + hashlib.sha256(bytes(body)).digest()


SOURCE = {"control_plane": "cp-1", "endpoint": "127.0.0.1:2379", "revision": 42, "etcd_version": "3.5.16"}


def test_the_kubernetes_etcd_snapshot_is_sealed_listed_and_opened(tmp_path, master):
    exported, snapshot = export_of(master), snapshot_of()
    manifest, data, name = backup.seal(kms.ClusterKMS(master), exported, "192.0.2.10:9000", SOURCE, snapshot)
    path = backup.write(str(tmp_path / "backups"), manifest, data, name)
    entry = backup.kubernetes_etcd_entry(manifest)
    assert entry == dict(SOURCE, name="kubernetes_etcd", included=True, size=len(snapshot),
                         sha256=hashlib.sha256(snapshot).hexdigest(), what=entry["what"])
    assert b"kubernetes-secret" not in data and base64.b64encode(snapshot)[:200] not in data
    cluster_id = kms.ClusterKMS(master).cluster_id(SALT)
    opened, state, restored = backup.open_all(path, kms.ClusterKMS(master), cluster_id)
    assert (opened, state, restored) == (manifest, exported, snapshot)
    assert backup.open_backup(path, kms.ClusterKMS(master), cluster_id) == (manifest, exported)
    # The fingerprint covers the snapshot: the same one says "unchanged", another one does not.
    sha = entry["sha256"]
    assert manifest["state_fingerprint"] == backup.fingerprint(kms.ClusterKMS(master), exported, sha)
    assert manifest["state_fingerprint"] not in {backup.fingerprint(kms.ClusterKMS(master), exported),
                                                 backup.fingerprint(kms.ClusterKMS(master), exported, hashlib.sha256(snapshot_of(b"x")).hexdigest())}
    # Without Kubernetes, the manifest says why nothing of it is included.
    plain_manifest = backup.seal(kms.ClusterKMS(master), exported, "192.0.2.10:9000")[0]
    assert backup.kubernetes_etcd_entry(plain_manifest) is None
    assert plain_manifest["contents"][1] == {"name": "kubernetes_etcd", "included": False,
                                             "reason": "Kubernetes is not managed by this inventory"}


@pytest.mark.parametrize("how, reason", [
    ("truncated", "is damaged: its last 32 bytes are not the SHA-256"),
    ("altered", "is damaged: its last 32 bytes are not the SHA-256"),
    ("not etcd", "is no etcd snapshot"),
])
def test_a_damaged_snapshot_is_not_sealed(master, how, reason):
    snapshot = bytearray(snapshot_of())
    if how == "truncated":
        snapshot = snapshot[:-100]
    elif how == "altered":
        snapshot[5000] ^= 1
    else:
        snapshot[16] ^= 1
        snapshot[-32:] = hashlib.sha256(bytes(snapshot[:-32])).digest()
    with pytest.raises(backup.BackupRefused, match="the Kubernetes etcd snapshot to back up %s" % reason):
        backup.seal(kms.ClusterKMS(master), export_of(master), "192.0.2.10:9000", SOURCE, bytes(snapshot))


def _reseal(path, master, manifest, plain):
    """Encrypts ``plain`` as the backup's data with the right key and associated data: what only a holder of
    the master secret (or a bug) could write - the snapshot's own checks must still refuse it."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = base64.b64decode(manifest["cipher"]["nonce"])
    data = nonce + AESGCM(kms.backup_key(kms.ClusterKMS(master))).encrypt(nonce, backup.canonical(plain), backup._aad(manifest))
    manifest.update(data_sha256=hashlib.sha256(data).hexdigest(), data_size=len(data))
    (path.parent / manifest["data_file"]).write_bytes(data)
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize("how, reason", [
    ("missing", "the manifest lists a Kubernetes etcd snapshot, the decrypted backup holds none"),
    ("other", "the Kubernetes etcd snapshot does not match the manifest's size and sha256"),
    ("damaged", "the Kubernetes etcd snapshot is damaged"),
])
def test_a_backup_whose_snapshot_does_not_match_is_refused(tmp_path, master, how, reason):
    exported, snapshot = export_of(master), snapshot_of()
    manifest, data, name = backup.seal(kms.ClusterKMS(master), exported, "192.0.2.10:9000", SOURCE, snapshot)
    path = tmp_path / "backups" / (name + backup.MANIFEST_SUFFIX)
    backup.write(str(tmp_path / "backups"), manifest, data, name)
    plain = {"coordinator_state": exported}
    if how == "other":
        plain["kubernetes_etcd_snapshot"] = base64.b64encode(snapshot_of(b"another")).decode()
    elif how == "damaged":
        damaged = bytearray(snapshot)
        damaged[5000] ^= 1
        entry = backup.kubernetes_etcd_entry(manifest)
        entry["sha256"] = hashlib.sha256(bytes(damaged)).hexdigest()
        plain["kubernetes_etcd_snapshot"] = base64.b64encode(bytes(damaged)).decode()
    _reseal(path, master, manifest, plain)
    with pytest.raises(backup.BackupRefused, match=reason) as refused:
        backup.open_all(str(path), kms.ClusterKMS(master), kms.ClusterKMS(master).cluster_id(SALT))
    assert str(path) in str(refused.value)
