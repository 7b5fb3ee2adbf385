# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The admin key on the controller's side: loading it (PEM or OpenSSH, unencrypted) and signing the
``AdminAuth`` message with it (Ed25519, or ECDSA P-256 with SHA-256). The agent pins its public half at
activation (``core.inputs.parse_admin_pub_key``) and checks the signature (``agent/admin.py``)."""

from __future__ import annotations

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError


def sign_admin(priv_key, message: bytes) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    if isinstance(priv_key, ed25519.Ed25519PrivateKey):
        return priv_key.sign(message)
    if isinstance(priv_key, ec.EllipticCurvePrivateKey) and isinstance(priv_key.curve, ec.SECP256R1):
        return priv_key.sign(message, ec.ECDSA(hashes.SHA256()))
    raise InputError("admin_priv_key", "an Ed25519 or ECDSA P-256 private key", type(priv_key).__name__)


def load_priv_key(data: bytes):
    """An admin private key from PEM (PKCS#8/traditional) or OpenSSH format, unencrypted."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    for loader in (serialization.load_pem_private_key, serialization.load_ssh_private_key):
        try:
            return loader(data, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm):
            continue
    raise InputError("admin_priv_key", "an unencrypted PEM or OpenSSH private key")
