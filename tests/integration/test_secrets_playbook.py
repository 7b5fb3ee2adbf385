# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""playbooks/secrets.yml, run for real on a copy of inventories/example (no host is contacted): in check mode
it writes nothing; then it makes the init secret, the master secret, the salt and the admin key, vault-encrypted,
0600, in the inventory's folder; a second run changes nothing; a missing variable or vault password fails naming
it, with nothing written; existing files (a passphrase-protected admin key too) are kept."""

from __future__ import annotations

import json
import shutil
import stat

import pytest

from ansible.parsing.vault import VaultLib, VaultSecret, is_encrypted
from tests.support import ROOT, VENV_BIN
from tests.support.playbook import run_playbook

pytestmark = pytest.mark.slow

PASSWORD = "correct horse battery staple"
SECRET_FILES = ("init_secret", "constellation-mastersecret.json", "constellation-measurement-salt.json", "admin_key")
TASKS = ("The init secret (std base64 of 32 random bytes)", "The master secret", "The measurement salt",
         "The admin key (Ed25519, made in memory, written only vault-encrypted)")


@pytest.fixture()
def inventory(tmp_path):
    inv = tmp_path / "mycluster"
    shutil.copytree(ROOT / "inventories" / "example", inv)  # the README's first step
    (tmp_path / "vault_pass").write_text(PASSWORD + "\n")
    return inv


def secrets_yml(inv, *extra, vault=True):
    args = (["--vault-password-file", str(inv.parent / "vault_pass")] if vault else []) \
        + ["-e", "ansible_python_interpreter=%s" % (VENV_BIN / "python")] + list(extra)
    return run_playbook(ROOT / "playbooks" / "secrets.yml", str(inv / "hosts.yml"), inv.parent / "runs", args)


def vault():
    return VaultLib([("default", VaultSecret(PASSWORD.encode()))])


def written(inv):
    return sorted(name for name in SECRET_FILES if (inv / name).exists())


def test_check_mode_then_made_once_then_nothing_changes(inventory):
    checked = secrets_yml(inventory, "--check")
    assert checked.ok, checked.stdout
    assert all(checked.results("cp-0")[task]["changed"] for task in TASKS)
    assert written(inventory) == []  # check mode writes nothing

    first = secrets_yml(inventory)
    assert first.ok, first.stdout
    assert first.changed() == 4
    before = {name: (inventory / name).read_bytes() for name in SECRET_FILES}
    for name, data in before.items():
        assert stat.S_IMODE((inventory / name).stat().st_mode) == 0o600, name
        assert is_encrypted(data), name

    from ansible_collections.constellation.cluster.plugins.action.measurement_salt import parse_salt_file
    from ansible_collections.constellation.cluster.plugins.module_utils.kms import MasterSecret
    from ansible_collections.constellation.cluster.plugins.module_utils.kms.init_secret import parse_init_secret
    from ansible_collections.constellation.cluster.plugins.plugin_utils.admin_key import load_admin_key

    assert len(parse_init_secret(vault().decrypt(before["init_secret"]).decode())) == 32
    MasterSecret.from_json(vault().decrypt(before["constellation-mastersecret.json"]), "path")
    assert len(parse_salt_file(vault().decrypt(before["constellation-measurement-salt.json"]))) == 32
    key = load_admin_key(str(inventory / "admin_key"), vault_secrets=vault().secrets)  # decrypted in memory
    from cryptography.hazmat.primitives.asymmetric import ed25519
    assert isinstance(key, ed25519.Ed25519PrivateKey)
    assert first.results("cp-0")[TASKS[3]]["public_key"].startswith("ssh-ed25519 ")

    second = secrets_yml(inventory)
    assert second.ok and second.changed() == 0, second.stdout
    again = secrets_yml(inventory, "--check")
    assert again.ok and again.changed() == 0, again.stdout
    assert {name: (inventory / name).read_bytes() for name in SECRET_FILES} == before  # never overwritten


@pytest.mark.parametrize("variable", ["constellation_init_secret_file", "constellation_admin_priv_key_file"])
def test_unset_variable_is_named_with_the_fix_and_nothing_is_written(inventory, variable):
    run = secrets_yml(inventory, "-e", json.dumps({variable: ""}))
    assert not run.ok
    msg = json.dumps(run.results("cp-0")["The inventory says where the init secret and the admin key go"])
    assert "%s is not set" % variable in msg and "group_vars/all" in msg and "playbooks/secrets.yml" in msg
    assert written(inventory) == []


def test_without_a_vault_password_it_says_so_and_writes_nothing(inventory):
    run = secrets_yml(inventory, vault=False)
    assert not run.ok
    assert "--vault-password-file" in run.results("cp-0")[TASKS[0]]["msg"]
    assert written(inventory) == []


def test_existing_files_are_kept_a_passphrase_protected_admin_key_too(inventory):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    own_key = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pp"))
    (inventory / "admin_key").write_bytes(own_key)
    init_secret = vault().encrypt(b"QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVphYmNkZWY=\n")
    (inventory / "init_secret").write_bytes(init_secret)
    run = secrets_yml(inventory)
    assert run.ok, run.stdout
    results = run.results("cp-0")
    assert not results[TASKS[0]]["changed"] and not results[TASKS[3]]["changed"]
    assert results[TASKS[1]]["changed"] and results[TASKS[2]]["changed"]
    assert (inventory / "admin_key").read_bytes() == own_key and (inventory / "init_secret").read_bytes() == init_secret
    with_passphrase = secrets_yml(inventory, "-e", "constellation_admin_key_passphrase=pp")
    assert with_passphrase.ok and with_passphrase.changed() == 0, with_passphrase.stdout
    assert with_passphrase.results("cp-0")[TASKS[3]]["public_key"].startswith("ecdsa-sha2-nistp256 ")


def test_an_action_reads_the_vaulted_admin_key_and_a_vaulted_passphrase(inventory):
    """The admin key secrets.yml made (vault file) and an operator's passphrase-protected one whose passphrase is a
    `!vault` variable: an action that takes admin_priv_key_file opens both in memory and only then contacts the
    peer (here a closed port); without the passphrase it fails naming the variable, before contacting anyone."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    assert secrets_yml(inventory).ok
    protected = inventory / "own_key"
    protected.write_bytes(ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pp")))
    encrypted = vault().encrypt(b"pp").decode()
    (inventory / "group_vars" / "all" / "passphrase.yml").write_text(
        "own_key_passphrase: !vault |\n" + "".join("  %s\n" % line for line in encrypted.splitlines()))
    playbook = inventory.parent / "action.yml"
    task = {"constellation.cluster.accepted_measurements": {
        "endpoint": "127.0.0.1:9", "admin_priv_key_file": "{{ key }}", "variant": "qemu-vtpm",
        "insecure_trust_any_ak": True, "timeout": 2, "measurements": {"4": {"expected": "aa" * 32, "warnOnly": False}}},
        "ignore_errors": True, "register": "out"}
    playbook.write_text(json.dumps([{"hosts": "cp-0", "gather_facts": False, "vars": {"ansible_connection": "local"},
                                     "tasks": [dict(task, name="read the key")]}]))

    def run(key, *extra):
        args = ["--vault-password-file", str(inventory.parent / "vault_pass"), "-e", "key=%s" % key] + list(extra)
        done = run_playbook(playbook, str(inventory / "hosts.yml"), inventory.parent / "runs", args)
        return done.results("cp-0")["read the key"]["msg"]

    for key, extra in ((inventory / "admin_key", ()),
                       (protected, ("-e", "constellation_admin_key_passphrase={{ own_key_passphrase }}"))):
        msg = run(key, *extra)
        assert "127.0.0.1:9" in msg and "admin_priv_key" not in msg, msg  # the key opened; the peer was tried
    msg = run(protected)
    assert "admin_priv_key_passphrase" in msg and "constellation_admin_key_passphrase" in msg, msg
    assert "127.0.0.1:9" not in msg
