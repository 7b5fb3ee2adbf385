# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The admin key as every reader on the controller takes it: plain, passphrase-protected (PEM and OpenSSH) or an
Ansible Vault file, decrypted in memory; each error names the option or variable and the fix, never the key."""

from __future__ import annotations

import subprocess

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from ansible.parsing.vault import VaultLib, VaultSecret
from ansible.template import Templar, trust_as_template
from ansible_collections.constellation.cluster.plugins.action.activate_coordinator import ActionModule
from ansible_collections.constellation.cluster.plugins.connection.atls import SettingsError, settings_from_options
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.admin_key import load_priv_key, sign_admin
from ansible_collections.constellation.cluster.plugins.plugin_utils.admin_key import load_admin_key
from ansible_collections.constellation.cluster.plugins.plugin_utils.atls import session

SECRETS = [("default", VaultSecret(b"vault password"))]
OTHER_SECRETS = [("default", VaultSecret(b"another password"))]


def pem(key, password=None):
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


def same_key(a, b):
    return pem(a) == pem(b)


@pytest.fixture(scope="module")
def key():
    return ed25519.Ed25519PrivateKey.generate()


@pytest.mark.parametrize("password", [None, b"pp"])
def test_pem_plain_and_passphrase_protected(key, password):
    assert same_key(load_priv_key(pem(key, password), "pp"), key)


def test_openssh_passphrase_protected(tmp_path):
    path = tmp_path / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "pp", "-f", str(path)], check=True)
    data = path.read_bytes()
    assert sign_admin(load_priv_key(data, "pp"), b"m")
    with pytest.raises(InputError, match="admin_priv_key_passphrase: .*constellation_admin_key_passphrase"):
        load_priv_key(data)
    with pytest.raises(InputError, match="does not open it"):
        load_priv_key(data, "wrong")


@pytest.mark.parametrize("passphrase, needle", [
    (None, "admin_priv_key_passphrase: expected the passphrase .* constellation_admin_key_passphrase"),
    ("wrong", "admin_priv_key_passphrase: .* the one given does not open it"),
])
def test_a_protected_key_without_its_passphrase_names_the_variable(key, passphrase, needle):
    with pytest.raises(InputError, match=needle) as err:
        load_priv_key(pem(key, b"pp"), passphrase)
    assert "wrong" not in str(err.value)  # never quotes the passphrase


def test_vault_file_decrypted_in_memory(key, tmp_path):
    path = tmp_path / "admin_key"
    path.write_bytes(VaultLib(SECRETS).encrypt(pem(ec.generate_private_key(ec.SECP256R1()))))
    assert sign_admin(load_admin_key(str(path), vault_secrets=SECRETS), b"m")
    path.write_bytes(VaultLib(SECRETS).encrypt(pem(key, b"pp")))  # vaulted and passphrase-protected
    assert same_key(load_admin_key(str(path), "pp", vault_secrets=SECRETS), key)


@pytest.mark.parametrize("secrets, needle", [
    ([], "admin_priv_key_file: expected the vault password .* --vault-password-file FILE or --ask-vault-pass"),
    (OTHER_SECRETS, "admin_priv_key_file: expected a vault-encrypted admin key that this run's vault password opens"),
])
def test_vault_file_without_the_right_password_names_the_fix(key, tmp_path, monkeypatch, secrets, needle):
    from ansible_collections.constellation.cluster.plugins.plugin_utils import admin_key

    monkeypatch.setattr(admin_key, "_run_vault_secrets", lambda given=None: list(given or secrets))
    path = tmp_path / "admin_key"
    path.write_bytes(VaultLib(SECRETS).encrypt(pem(key)))
    with pytest.raises(InputError, match=needle):
        load_admin_key(str(path))


def test_not_a_key_names_the_file_not_its_content(tmp_path):
    path = tmp_path / "admin_key"
    path.write_text("secret-looking garbage")
    with pytest.raises(InputError, match="admin_priv_key_file: expected a PEM or OpenSSH private key") as err:
        load_admin_key(str(path))
    assert str(path) in str(err.value) and "garbage" not in str(err.value)
    with pytest.raises(InputError, match="admin_priv_key_file: expected a readable private key file .*secrets.yml"):
        load_admin_key(str(tmp_path / "missing"))


class _Loader:
    class _vault:  # pylint: disable=invalid-name
        secrets = SECRETS


def test_every_cluster_action_reads_a_vaulted_passphrase_protected_key(key, tmp_path):
    """ClusterAction.load_admin_priv_key, which every action that takes admin_priv_key_file calls."""
    path = tmp_path / "admin_key"
    path.write_bytes(VaultLib(SECRETS).encrypt(pem(key, b"pp")))
    action = ActionModule.__new__(ActionModule)
    action._loader = _Loader()  # pylint: disable=protected-access
    action._templar = Templar(loader=None, variables={"secret_pp": "pp"})  # pylint: disable=protected-access
    action._task_vars = {"constellation_admin_key_passphrase": trust_as_template("{{ secret_pp }}")}  # pylint: disable=protected-access
    assert same_key(action.load_admin_priv_key(str(path)), key)
    action._task_vars = {}  # pylint: disable=protected-access
    with pytest.raises(InputError, match="constellation_admin_key_passphrase"):
        action.load_admin_priv_key(str(path))


def connection_options(key_file, **changes):
    opts = {"host": "10.0.0.5", "port": 9000, "endpoint": None, "measurements": None, "measurements_file": None,
            "attestation_variant": "dummy", "admin_priv_key_file": key_file, "connect_timeout": 10,
            "attestation_timeout": 30, "command_timeout": 0, "persist": 60, "control_path_dir": "~/.ansible/cp",
            "netns": None, "warm_interpreter": True, "ek_ca_path": None, "amd_roots": None, "fresh_proof": True,
            "measurements_pub_key_file": None, "prestart": True, "admin_priv_key_passphrase": None,
            "insecure_trust_any_ak": False}
    opts.update(changes)
    return opts.__getitem__


def test_the_atls_connection_hands_the_relay_the_key_decrypted_in_memory(key, tmp_path, monkeypatch):
    from ansible_collections.constellation.cluster.plugins.plugin_utils import admin_key

    path = tmp_path / "admin_key"
    path.write_bytes(VaultLib(SECRETS).encrypt(pem(key, b"pp")))
    monkeypatch.setattr(admin_key, "_run_vault_secrets", lambda given=None: SECRETS)
    settings = settings_from_options(connection_options(str(path), admin_priv_key_passphrase="pp"))
    assert settings.admin_priv_key_pem and "PRIVATE KEY" not in repr(settings) and "pp" not in repr(settings)
    relayed = type(settings).from_json(settings.to_json())  # what the relay gets on its stdin
    seen = {}

    class _Client:
        def admin_auth(self, priv_key):
            seen["key"] = priv_key

    monkeypatch.setattr(session, "validators_for", lambda s: [])
    monkeypatch.setattr("ansible_collections.constellation.cluster.plugins.module_utils.rpc.client."
                        "connect_enrolling", lambda connect, validators: _Client())
    try:
        session.open_admin_client(relayed, validators=[])
    except AttributeError:
        pass  # the stand-in client has no attestation to warn about; the key was used already
    assert same_key(seen["key"], key)
    monkeypatch.setattr(admin_key, "_run_vault_secrets", lambda given=None: [])
    with pytest.raises(SettingsError, match="--vault-password-file .*constellation_admin_priv_key_file"):
        settings_from_options(connection_options(str(path)))
