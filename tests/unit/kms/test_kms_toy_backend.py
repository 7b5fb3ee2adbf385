# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A KMS backend's registration carries its whole rule: a toy backend added with ``register_backend`` only
(no other edit) parses and opens from its URI, never shows its secret parameter (repr, str, errors), gives
the Core its cluster ID and disk keys, and is accepted by the backup (``coordinator_backup`` and
``coordinator_restore``, plugins/plugin_utils/backup.py). The fixture removes it again."""

from __future__ import annotations

import base64
import hashlib
from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from ansible_collections.constellation.cluster.plugins.action import coordinator_backup, coordinator_restore
from ansible_collections.constellation.cluster.plugins.module_utils import core, kms
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import expected_pcr15
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils.store import MemoryStore
from ansible_collections.constellation.cluster.plugins.plugin_utils import backup
from ansible_collections.constellation.cluster.tests.support.core_fakes import MemoryTPM, RecordingVPN

TOKEN = "t0ken-SECRET-4242"  # the toy's secret parameter: never shown
SALT = bytes(range(32))


class ToyKMS:
    """A KMS that writes nothing but ``get_dek``."""

    def __init__(self, seed: str, token: str):
        self._material = (seed + "/" + token).encode()

    def get_dek(self, dek_id: str, length: int = 32) -> bytes:
        return hashlib.sha256(self._material + b"/" + dek_id.encode()).digest()[:length]


@pytest.fixture
def toy():
    """The toy backend, registered through the table alone, and removed after the test."""
    assert "toy" not in kms.BACKENDS
    row = kms.register_backend(kms.Backend("toy", ("seed", "token"), "a test backend",
                                           lambda parsed: ToyKMS(parsed.get("seed"), parsed.get("token")),
                                           secret_params=("token",)))
    try:
        yield row
    finally:
        kms.unregister_backend("toy")
    assert "toy" not in kms.BACKENDS


def toy_uri(token: str = TOKEN) -> str:
    return kms.format_kms_uri("toy", seed="abc", token=token)


def test_toy_backend_registered_in_the_table_opens_from_its_uri(toy):
    uri = toy_uri()
    assert uri == "kms://toy?seed=abc&token=" + TOKEN
    opened = kms.open_kms(uri)
    assert isinstance(opened, kms.KMS)
    assert kms.derive_key(opened, "x", 16) == hashlib.sha256(b"abc/" + TOKEN.encode() + b"/key-x").digest()[:16]
    with pytest.raises(ConstellationError, match="seed"):
        kms.open_kms("kms://toy?other=1")


def test_unregistered_toy_is_unknown():
    with pytest.raises(ConstellationError, match="kms_uri backend: expected one of cluster-kms"):
        kms.open_kms("kms://toy?seed=abc&token=" + TOKEN)


def test_the_secret_parameter_never_appears_in_a_repr_str_or_error(toy):
    parsed = kms.parse_kms_uri(toy_uri())
    for shown in (repr(parsed), str(parsed)):
        assert TOKEN not in shown and "token=<secret>" in shown and "seed=abc" in shown
    bad = [
        "kms://toy?seed=abc&token=t0ken!SECRET-4242",                 # not an identifier
        "kms://toy?seed=abc&token=%s&token=%s" % (TOKEN, TOKEN),        # repeated
        "kms://toy?seed=abc&token=%s%%zz" % TOKEN,                      # a bad escape
        "kms://toy?seed=a!c&token=%s" % TOKEN,                          # another parameter is wrong
        "kms://toy?seed=abc&token=%s&extra=1" % TOKEN,                  # an unknown parameter
        "kms://toy?seed=abc&%s=1" % TOKEN,                              # the secret as a name
        "kms://toy?seed=abc&token=" + "x" * 3000,                        # too long
    ]
    for uri in bad:
        with pytest.raises(ConstellationError) as err:
            kms.open_kms(uri)
        assert "SECRET" not in str(err.value) and "t0ken" not in str(err.value), str(err.value)
    # Once it is no longer in the table, a parsed URI of the backend shows no value at all.
    kms.unregister_backend("toy")
    assert "abc" not in repr(parsed) and TOKEN not in repr(parsed)


def _core(tmp_path, public_ip: str):
    state_dir = tmp_path / public_ip
    state_dir.mkdir()
    c = core.Core(MemoryStore(), MemoryTPM(), RecordingVPN(), str(state_dir), public_ip, core.new_disk_uuid())
    c.recovery.load()
    return c


def _admin_pem(key) -> str:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


@pytest.fixture
def coordinator(toy, tmp_path):
    """A Coordinator activated with the toy's URI, and its admin key."""
    del toy
    admin_key = ed25519.Ed25519PrivateKey.generate()
    c = _core(tmp_path, "10.42.0.11")
    result = c.coordinator.activate_as_coordinator(toy_uri(), SALT, _admin_pem(admin_key))
    return c, admin_key, result


def test_the_core_derives_the_cluster_id_and_disk_key_with_it(coordinator):
    c, _admin_key, result = coordinator
    toy_kms = kms.open_kms(toy_uri())
    assert result.cluster_id == kms.cluster_id(toy_kms, SALT) != kms.ClusterKMS(kms.MasterSecret.generate()).cluster_id(SALT)
    assert c.context.tpm.pcr15() == expected_pcr15(result.cluster_id)
    assert c.context.read_disk_key() == kms.state_disk_key(toy_kms, c.context.disk_uuid)
    assert c.coordinator.state_disk_key(c.context.disk_uuid) == c.context.read_disk_key()


def test_the_backup_and_restore_actions_accept_it(coordinator, tmp_path, monkeypatch):
    c, admin_key, result = coordinator
    key_file = tmp_path / "admin.key"
    key_file.write_bytes(admin_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                 serialization.NoEncryption()))
    monkeypatch.setattr(backup, "export_state", lambda endpoint, settings, priv_key, cluster_id: c.backup.export_state())
    args = {"endpoint": "10.42.0.11:9000", "kms_uri": toy_uri(), "measurement_salt": base64.b64encode(SALT).decode(),
            "admin_priv_key_file": str(key_file), "backup_dir": str(tmp_path / "backups")}
    task = SimpleNamespace(check_mode=False)
    action = object.__new__(coordinator_backup.ActionModule)
    action._task = task  # pylint: disable=protected-access
    made = action.act(dict(args, kubernetes=False, kubernetes_etcd_snapshot=None, kubernetes_etcd_source=None), None)
    assert made["changed"] and made["cluster_id"] == base64.b64encode(result.cluster_id).decode()
    assert made["manifest"]["cipher"]["key"] == backup.key_derivation(kms.open_kms(toy_uri()))
    assert TOKEN not in open(made["path"]).read()
    again = action.act(dict(args, kubernetes=False, kubernetes_etcd_snapshot=None, kubernetes_etcd_source=None), None)
    assert not again["changed"] and again["path"] == made["path"]  # the keyed fingerprint matches

    fresh = _core(tmp_path, "10.42.0.99")

    def restore(endpoint, settings, kms_uri, salt, cluster_id, pub_key, exported, init_secret, **kwargs):
        del endpoint, settings, salt, cluster_id, init_secret, kwargs
        fresh.backup.restore(kms_uri, pub_key, exported)
        return {"changed": True}
    monkeypatch.setattr(backup, "restore", restore)
    action = object.__new__(coordinator_restore.ActionModule)
    action._task = task  # pylint: disable=protected-access
    restored = action.act(dict(args, backup=None, node_endpoints=[], kubernetes_etcd_snapshot=False, init_secret=None),
                          None)
    assert restored["backup"] == made["path"] and restored["cluster_id"] == made["cluster_id"]
    assert fresh.context.tpm.pcr15() == expected_pcr15(result.cluster_id)
    assert fresh.context.read_disk_key() == kms.state_disk_key(kms.open_kms(toy_uri()), fresh.context.disk_uuid)
    # Another token is another KMS: its backup key does not open the backup.
    with pytest.raises(backup.BackupRefused, match="authenticated decryption failed"):
        backup.open_backup(made["path"], kms.open_kms(toy_uri("another-token")), result.cluster_id)


def test_the_backup_key_is_no_data_key(toy):
    del toy
    opened = kms.open_kms(toy_uri())
    assert kms.backup_key(opened) == opened.get_dek(kms.BACKUP_KEY_INFO.decode(), 32)
    assert kms.backup_key(opened) not in {kms.derive_key(opened, kms.BACKUP_KEY_INFO.decode()), kms.derive_key(opened, "backup")}
