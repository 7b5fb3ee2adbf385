# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Signed measurements files (docs/attestation.md, "Signed measurements"): a detached signature in the form ``cosign sign-blob
--key`` prints for an ECDSA P-256 key, that is standard base64 (padded) of the ASN.1 DER ECDSA
signature over SHA-256 of the file's exact bytes; checked against a pinned public key (PEM
SubjectPublicKeyInfo, as ``cosign.pub``) BEFORE the file is parsed. ``cryptography`` does the
ECDSA; nothing here is hand-rolled. Errors name the file, never a key's bytes."""

from __future__ import annotations

import base64
import binascii
import os
from typing import Optional

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError

SIGNATURE_SUFFIX = ".sig"
# A DER ECDSA P-256 signature is at most 72 bytes (base64 96); allow whitespace and a newline.
MAX_SIGNATURE_FILE = 1024
MAX_KEY_FILE = 16 * 1024
MAX_SIGNED_FILE = 4 * 1024 * 1024


def signature_path(path: str) -> str:
    """Where the detached signature of ``path`` lives (cosign's convention: ``FILE.sig``)."""
    return path + SIGNATURE_SUFFIX


def _read(path: str, field: str, limit: int, what: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as err:
        raise InputError(field, what, "%s (%s)" % (path, err.strerror or type(err).__name__)) from None
    if len(data) > limit:
        raise InputError(field, "at most %d bytes" % limit, "%s: more" % path)
    return data


def load_public_key(pem: bytes, field: str = "measurements_public_key"):
    """An ECDSA P-256 public key from PEM (SubjectPublicKeyInfo, cosign.pub)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError):
        raise InputError(field, "a PEM public key (SubjectPublicKeyInfo, as cosign.pub)") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise InputError(field, "an ECDSA P-256 public key", type(key).__name__)
    return key


def load_public_key_file(path: str, field: str = "measurements_public_key"):
    return load_public_key(_read(path, field, MAX_KEY_FILE, "a readable PEM public key file"), field)


def same_public_key(one, other) -> bool:
    """Whether two public keys are the same (their DER SubjectPublicKeyInfo): a signing key against a pinned key."""
    from cryptography.hazmat.primitives import serialization

    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return one.public_bytes(*spki) == other.public_bytes(*spki)


def load_private_key(pem: bytes, field: str = "private_key", password: Optional[bytes] = None):
    """An ECDSA P-256 private key from PEM (PKCS#8 or SEC1). cosign's own encrypted format
    (ENCRYPTED SIGSTORE PRIVATE KEY) is not read: export the key to PEM, or sign with cosign."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        key = serialization.load_pem_private_key(pem, password=password)
    except (ValueError, TypeError):
        raise InputError(field, "a PEM ECDSA P-256 private key (PKCS#8 or SEC1; wrong password?)") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise InputError(field, "an ECDSA P-256 private key", type(key).__name__)
    return key


def load_private_key_file(path: str, field: str = "priv_key_file", passphrase: Optional[str] = None):
    """``load_private_key`` of a PEM file (``passphrase``: of an encrypted one); InputError naming ``field``."""
    return load_private_key(_read(path, field, MAX_KEY_FILE, "a readable PEM private key file"), field,
                            passphrase.encode("utf-8") if passphrase else None)


def sign_blob(priv_key, data: bytes) -> str:
    """What ``cosign sign-blob --key`` prints: std base64 of the DER ECDSA-SHA256 signature."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    return base64.b64encode(priv_key.sign(bytes(data), ec.ECDSA(hashes.SHA256()))).decode("ascii")


def verify_blob(pub_key, data: bytes, signature_text: bytes, name: str) -> None:
    """Checks the detached signature of ``data`` (the file ``name``); InputError naming it."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        raw = base64.b64decode(b"".join(bytes(signature_text).split()), validate=True)
    except (binascii.Error, ValueError):
        raise InputError(name, "a signature file holding std base64 (cosign sign-blob)", "%s" % signature_path(name)) \
            from None
    try:
        pub_key.verify(raw, bytes(data), ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise InputError(name, "a file signed by the pinned measurements key",
                         "a signature (%s) that does not verify: the file was altered or signed by another key"
                         % signature_path(name)) from None


def read_signed_file(path: str, pub_key, field: str = "measurements_path", max_size: int = MAX_SIGNED_FILE) -> bytes:
    """The bytes of ``path`` once its detached signature (``path.sig``) verifies against ``pub_key``."""
    data = _read(path, field, max_size, "a readable file")
    sig_path = signature_path(path)
    if not os.path.exists(sig_path):
        raise InputError(path, "a signed measurements file (a measurements public key is pinned)",
                         "no signature file %s" % sig_path)
    verify_blob(pub_key, data, _read(sig_path, field, MAX_SIGNATURE_FILE, "a readable signature file"), path)
    return data
