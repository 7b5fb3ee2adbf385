# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The keys every KMS backend gives, as functions over its one method, ``get_dek`` (the ``KMS`` protocol).

A backend writes ``get_dek(dek_id, length)`` and nothing else: ``derive_key`` (the KeyService's ``key-``
namespace, what GetDataKey hands out) and the named keys of the chain of trust (measurement secret, cluster ID,
state disk keys, the emergency SSH CA, the Coordinators' signing key) are derived here over ``derive_key``, and
the backup key over ``get_dek`` outside that namespace. The derivations are Constellation's (docs/kms.md).
"""

from __future__ import annotations

import base64

from ansible_collections.constellation.cluster.plugins.module_utils.kms.derive import (
    BACKUP_KEY_INFO,
    COORDINATOR_SIGNING_KEY_ID,
    DEK_PREFIX,
    DERIVED_KEY_LENGTH_DEFAULT,
    EMERGENCY_SSH_CA_KEY_ID,
    KEY_ID_LENGTH_MAX,
    MEASUREMENT_SECRET_KEY_ID,
    STATE_DISK_KEY_LENGTH,
    _check_key_id,
    _check_length,
    derive_cluster_id,
    state_disk_key_id,
)

try:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
except ImportError:  # deriving says what is missing (derive.hkdf_sha256)
    pass

BACKUP_KEY_LENGTH = 32


def derive_key(kms, key_id: str, length: int = DERIVED_KEY_LENGTH_DEFAULT) -> bytes:
    """The key the KeyService hands out for ``GetDataKey(key_id)``: the backend's key for ``"key-" + key_id``."""
    _check_key_id("key_id", key_id, KEY_ID_LENGTH_MAX)
    _check_length("length", length)
    return kms.get_dek(DEK_PREFIX + key_id, length)


def state_disk_key(kms, disk_uuid: str) -> bytes:
    """The LUKS passphrase (raw bytes) of the state disk with that UUID (lower-cased)."""
    return derive_key(kms, state_disk_key_id(disk_uuid), STATE_DISK_KEY_LENGTH)


def measurement_secret(kms) -> bytes:
    return derive_key(kms, MEASUREMENT_SECRET_KEY_ID, DERIVED_KEY_LENGTH_DEFAULT)


def cluster_id(kms, measurement_salt: bytes) -> bytes:
    """The cluster ID: HKDF of the measurement secret and the measurement salt."""
    return derive_cluster_id(measurement_secret(kms), measurement_salt)


def emergency_ssh_ca_seed(kms) -> bytes:
    return derive_key(kms, EMERGENCY_SSH_CA_KEY_ID, DERIVED_KEY_LENGTH_DEFAULT)


def emergency_ssh_ca_priv_key(kms) -> "Ed25519PrivateKey":
    """The emergency SSH CA: an ed25519 key made from the derived seed."""
    return Ed25519PrivateKey.from_private_bytes(emergency_ssh_ca_seed(kms))


def coordinator_signing_priv_key(kms) -> "Ed25519PrivateKey":
    """The Coordinators' Ed25519 signing key, made from the derived seed ``key-coordinator_signing_key``
    (every Coordinator derives the same one)."""
    return Ed25519PrivateKey.from_private_bytes(derive_key(kms, COORDINATOR_SIGNING_KEY_ID, DERIVED_KEY_LENGTH_DEFAULT))


def coordinator_pub_key(kms) -> str:
    """Standard base64 of the raw 32-byte Ed25519 public key of ``coordinator_signing_priv_key``, as Nodes pin it."""
    pub_key = coordinator_signing_priv_key(kms).public_key()
    raw = pub_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")


def backup_key(kms) -> bytes:
    """The 32-byte AES-256-GCM key of the cluster's backups (backup.yml, restore.yml): the backend's key for
    ``BACKUP_KEY_INFO``, outside the ``key-`` namespace, so no ``derive_key`` call (and so no GetDataKey) can
    produce it. For the cluster KMS: HKDF-SHA256(IKM = master key, salt = master salt, info = BACKUP_KEY_INFO)."""
    return kms.get_dek(BACKUP_KEY_INFO.decode("ascii"), BACKUP_KEY_LENGTH)
