# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The admin key file as the controller's plugins read it (the cluster actions, the atls connection): an
Ansible Vault file is decrypted in memory with the run's vault secrets (never written anywhere decrypted), a
passphrase-protected key is opened with the variable ``constellation_admin_key_passphrase``
(module_utils/rpc/admin_key.py). Every error names the option or variable and the fix."""

from __future__ import annotations

from typing import Optional, Sequence

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.admin_key import (
    PASSPHRASE_VARIABLE, load_priv_key)

KEY_FILE_VARIABLE = "constellation_admin_priv_key_file"
_READ_LIMIT = 1024 * 1024


def _run_vault_secrets(secrets: Optional[Sequence] = None) -> list:
    """The vault secrets of this run: ``secrets`` (a loader's) or, from ansible-core 2.19 on, the CLI's."""
    if secrets:
        return list(secrets)
    try:
        from ansible.parsing.vault import VaultSecretsContext
    except ImportError:  # ansible-core 2.18: only a loader's secrets
        return []
    context = VaultSecretsContext.current(optional=True)
    return list(context.secrets) if context else []


def read_key_file(path: str, field: str = "admin_priv_key_file", vault_secrets: Optional[Sequence] = None) -> bytes:
    """The admin key file's bytes; a vault-encrypted one decrypted in memory."""
    from ansible.errors import AnsibleError
    from ansible.parsing.vault import VaultLib, is_encrypted

    try:
        with open(path, "rb") as handle:
            data = handle.read(_READ_LIMIT)
    except OSError as err:
        raise InputError(field, "a readable private key file (variable %s; playbooks/secrets.yml makes one)"
                         % KEY_FILE_VARIABLE, "%s (%s)" % (path, err.strerror)) from None
    if not is_encrypted(data):
        return data
    secrets = _run_vault_secrets(vault_secrets)
    if not secrets:
        raise InputError(field, "the vault password of the vault-encrypted admin key %s: run with "
                         "--vault-password-file FILE or --ask-vault-pass" % path)
    try:
        return VaultLib(secrets).decrypt(data)
    except AnsibleError:
        raise InputError(field, "a vault-encrypted admin key that this run's vault password opens; %s is "
                         "encrypted with another one" % path) from None


def load_admin_key(path: str, passphrase: Optional[str] = None, field: str = "admin_priv_key_file",
                   vault_secrets: Optional[Sequence] = None):
    """The admin private key of ``path`` (vault-encrypted or not; protected with ``passphrase`` or not)."""
    data = read_key_file(path, field, vault_secrets)
    try:
        return load_priv_key(data, passphrase)
    except InputError as err:
        if err.field == "admin_priv_key":  # not a key at all: name the file, never its content
            raise InputError(field, "%s, got %s" % (err.expected, path)) from None
        raise


__all__ = ["KEY_FILE_VARIABLE", "PASSPHRASE_VARIABLE", "load_admin_key", "read_key_file"]
