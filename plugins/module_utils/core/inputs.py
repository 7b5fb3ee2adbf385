# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checked inputs of the Core: base64 fields, IPs, admin keys, salts, disk UUIDs, KMS URIs.
Every error names the field and never echoes a secret."""

from __future__ import annotations

import ipaddress
import uuid as uuid_mod
from typing import Any

try:
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519
except ImportError:  # ansible-test's import sanity runs without third-party packages
    HAS_CRYPTOGRAPHY = False
else:
    HAS_CRYPTOGRAPHY = True

from ansible_collections.constellation.cluster.plugins.module_utils import kms as kms_mod
from ansible_collections.constellation.cluster.plugins.module_utils.encoding import b64decode, b64encode
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError

MEASUREMENT_SALT_LENGTH = 32
CLUSTER_ID_LENGTH = 32
ADMIN_PUB_KEY_MAX = 16384


def b64(data: bytes) -> str:
    return b64encode(data)


def b64d(value: Any, field_name: str, size: int) -> bytes:
    """Standard base64 of exactly ``size`` bytes (encoding.b64decode)."""
    return b64decode(value, field_name, size)


def ip(value: Any, field_name: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise InputError(field_name, "an IP address", value) from None


def open_kms(kms_uri: Any) -> kms_mod.ClusterKMS:
    """The KMS of a URI; every error names the field ``kms_uri`` (never a secret)."""
    try:
        return kms_mod.open_kms(kms_uri, "kms_uri")
    except InputError as err:
        if err.field.startswith("kms_uri"):
            raise
        raise InputError("kms_uri", "a valid KMS URI (%s)" % err) from None


def parse_admin_pub_key(text: Any):
    """The admin's public key: PEM SubjectPublicKeyInfo or an OpenSSH line; Ed25519 or ECDSA P-256."""
    if not HAS_CRYPTOGRAPHY:
        raise ConstellationError("the Python package cryptography is required for admin keys")
    if not isinstance(text, str) or not text.strip() or len(text) > ADMIN_PUB_KEY_MAX:
        raise InputError("admin_pub_key", "a PEM or OpenSSH public key (Ed25519 or ECDSA P-256)")
    data = text.strip().encode("ascii", "replace")
    key = None
    for loader in (serialization.load_pem_public_key, serialization.load_ssh_public_key):
        try:
            key = loader(data)
            break
        except (ValueError, TypeError, UnsupportedAlgorithm):
            continue
    if key is None:
        raise InputError("admin_pub_key", "a PEM or OpenSSH public key (Ed25519 or ECDSA P-256)", text[:40])
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key
    if isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1):
        return key
    raise InputError("admin_pub_key", "an Ed25519 or ECDSA P-256 key", type(key).__name__)


def parse_measurement_salt(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        raw = bytes(value)
        if len(raw) != MEASUREMENT_SALT_LENGTH:
            raise InputError("measurement_salt", "%d bytes" % MEASUREMENT_SALT_LENGTH, "%d bytes" % len(raw))
        return raw
    return b64d(value, "measurement_salt", MEASUREMENT_SALT_LENGTH)


def normalize_disk_uuid(value: Any) -> str:
    return kms_mod.state_disk_key_id(value)


def new_disk_uuid() -> str:
    return str(uuid_mod.uuid4())
