# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The backup on the controller (plugins/plugin_utils/backup.py, backup.yml): the key derived from the master secret
(never the secret), AES-256-GCM with the manifest as associated data, files 0600 in a 0700 folder, and every way a
backup can be refused - each names the file and the reason."""

from __future__ import annotations

import base64
import json
import os
import stat

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
    manifest, data, name = backup.seal(master, exported, "192.0.2.10:9000")
    return backup.write(str(tmp_path / "backups"), manifest, data, name)


def test_the_key_is_derived_with_its_own_label_and_is_no_kms_key(master):
    key = kms.backup_key(master)
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
    opened, state = backup.open_backup(path, master, cluster_id)
    assert state == exported and opened == manifest
    assert backup.backups(str(folder), manifest["cluster_id"]) == [(path, manifest)]
    assert backup.backups(str(folder), "another") == []
    # The fingerprint says "same state" and nothing else; another state has another one.
    assert manifest["state_fingerprint"] == backup.fingerprint(master, exported)
    assert backup.fingerprint(master, export_of(master, b"other")) != manifest["state_fingerprint"]


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
        backup.open_backup(path, master, kms.ClusterKMS(master).cluster_id(SALT))
    assert reason in str(refused.value)
    assert str(tmp_path / "backups") in str(refused.value)


def test_a_foreign_backup_and_another_master_secret_are_refused(tmp_path, master):
    path = written(tmp_path, master, export_of(master))
    other = kms.MasterSecret.generate()
    with pytest.raises(backup.BackupRefused) as refused:  # this inventory's cluster ID differs
        backup.open_backup(path, other, kms.ClusterKMS(other).cluster_id(SALT))
    assert "a backup of another cluster" in str(refused.value)
    with pytest.raises(backup.BackupRefused) as refused:  # same cluster ID claimed, another key
        backup.open_backup(path, other, kms.ClusterKMS(master).cluster_id(SALT))
    assert "the authenticated decryption failed" in str(refused.value)
