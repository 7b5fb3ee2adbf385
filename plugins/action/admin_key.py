# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin admin_key: makes the cluster's admin key (Ed25519, PKCS#8 PEM) on the controller once, with the
master secret's file handling (WriteOnceSecretAction: 0600, atomic, never overwritten, optionally Ansible
Vault). The key is made in memory and written only vault-encrypted (with ``vault``), so it never lies on disk in
the clear. An existing key (vault-encrypted, passphrase-protected with ``constellation_admin_key_passphrase`` or
plain) is checked and kept. Documentation in plugins/modules/admin_key.py."""

from __future__ import annotations

from ansible_collections.constellation.cluster.plugins.action.master_secret import WriteOnceSecretAction
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.admin_key import (
    PASSPHRASE_FIELD, PASSPHRASE_VARIABLE, load_priv_key, sign_admin)


def public_key_openssh(priv_key) -> str:
    from cryptography.hazmat.primitives import serialization

    return priv_key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                              serialization.PublicFormat.OpenSSH).decode("ascii")


class ActionModule(WriteOnceSecretAction):
    WHAT = "admin key (an Ed25519 or ECDSA P-256 private key)"
    READ_LIMIT = 65536

    _passphrase = None
    _public_key = None

    def run(self, tmp=None, task_vars=None):
        passphrase = (task_vars or {}).get(PASSPHRASE_VARIABLE)
        self._passphrase = self._templar.template(passphrase) if passphrase else None
        self._public_key = None
        result = super().run(tmp, task_vars)
        if self._public_key:
            result["public_key"] = self._public_key
        return result

    def _generate(self) -> bytes:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519

        key = ed25519.Ed25519PrivateKey.generate()
        self._public_key = public_key_openssh(key)
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    def _check_content(self, data: bytes) -> None:
        try:
            key = load_priv_key(data, self._passphrase)
        except InputError as err:
            if err.field == PASSPHRASE_FIELD and not self._passphrase:
                return  # passphrase-protected, no passphrase in this play: kept as it is
            raise ValueError(str(err)) from None
        sign_admin(key, b"check")  # Ed25519 or ECDSA P-256, else InputError (a ValueError)
        self._public_key = public_key_openssh(key)
