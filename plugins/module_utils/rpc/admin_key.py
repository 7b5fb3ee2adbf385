# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The admin key on the controller's side: loading it (PEM or OpenSSH, unencrypted or passphrase-protected) and
signing the ``AdminAuth`` message with it (Ed25519, or ECDSA P-256 with SHA-256). The agent pins its public half
at activation (``core.inputs.parse_admin_pub_key``) and checks the signature (``agent/admin.py``). A vault-encrypted
key file is decrypted in memory by the controller's plugins first (``plugin_utils/admin_key.py``)."""

from __future__ import annotations

from typing import Optional, Union

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError

PASSPHRASE_FIELD = "admin_priv_key_passphrase"
PASSPHRASE_VARIABLE = "constellation_admin_key_passphrase"


def sign_admin(priv_key, message: bytes) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    if isinstance(priv_key, ed25519.Ed25519PrivateKey):
        return priv_key.sign(message)
    if isinstance(priv_key, ec.EllipticCurvePrivateKey) and isinstance(priv_key.curve, ec.SECP256R1):
        return priv_key.sign(message, ec.ECDSA(hashes.SHA256()))
    raise InputError("admin_priv_key", "an Ed25519 or ECDSA P-256 private key", type(priv_key).__name__)


def _openssh_encrypted(data: bytes) -> bool:
    """Whether an OpenSSH private key names a cipher other than ``none`` (its header is unencrypted)."""
    import base64
    import struct

    begin, end = b"-----BEGIN OPENSSH PRIVATE KEY-----", b"-----END OPENSSH PRIVATE KEY-----"
    start, stop = data.find(begin), data.find(end)
    if start < 0 or stop < 0:
        return False
    try:
        blob = base64.b64decode(b"".join(data[start + len(begin):stop].split()))
    except ValueError:
        return False
    magic = b"openssh-key-v1\x00"
    if not blob.startswith(magic) or len(blob) < len(magic) + 4:
        return False
    (length,) = struct.unpack(">I", blob[len(magic):len(magic) + 4])
    return blob[len(magic) + 4:len(magic) + 4 + length] != b"none"


def load_priv_key(data: bytes, passphrase: Optional[Union[str, bytes]] = None):
    """An admin private key from PEM (PKCS#8/traditional) or OpenSSH format, unencrypted or protected with
    ``passphrase``. Errors name the option and its variable; they never quote the key or the passphrase."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    password = passphrase.encode("utf-8") if isinstance(passphrase, str) else passphrase
    protected = (b"ENCRYPTED" in data.split(b"-----END", 1)[0] if b"-----BEGIN" in data else False) \
        or _openssh_encrypted(data)
    if protected and not password:
        raise InputError(PASSPHRASE_FIELD, "the passphrase of the passphrase-protected admin key (set the variable "
                         "%s, kept in Ansible Vault)" % PASSPHRASE_VARIABLE)
    openssh = b"-----BEGIN OPENSSH PRIVATE KEY-----" in data
    loader = serialization.load_ssh_private_key if openssh else serialization.load_pem_private_key
    try:
        return loader(data, password=password if protected else None)
    except UnsupportedAlgorithm as err:
        if protected and "bcrypt" in str(err):
            raise InputError(PASSPHRASE_FIELD, "the Python package bcrypt on the controller to open a "
                             "passphrase-protected OpenSSH key (requirements.txt)") from None
    except (ValueError, TypeError):
        if protected:
            raise InputError(PASSPHRASE_FIELD, "the passphrase the admin key is protected with (variable %s); "
                             "the one given does not open it" % PASSPHRASE_VARIABLE) from None
    raise InputError("admin_priv_key", "a PEM or OpenSSH private key (unencrypted, passphrase-protected with "
                     "%s, or an Ansible Vault file of one)" % PASSPHRASE_VARIABLE)
