# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""HKDF-SHA256 derivations and the named key IDs, exactly as Constellation's cluster KMS
(docs/kms.md, "Derived keys"): the same master secret gives the same keys in both."""

from __future__ import annotations

import re
from typing import Optional

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError

try:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
except ImportError:  # a host without it can still parse URIs; deriving says what is missing
    HAS_CRYPTOGRAPHY = False
else:
    HAS_CRYPTOGRAPHY = True

# Constellation's constants (docs/kms.md, "Derived keys").
DEK_PREFIX = "key-"
MASTER_SECRET_LENGTH_DEFAULT = 32
MASTER_SECRET_LENGTH_MIN = 16
RNG_LENGTH_DEFAULT = 32
DERIVED_KEY_LENGTH_DEFAULT = 32
STATE_DISK_KEY_LENGTH = 32
MEASUREMENT_SECRET_KEY_ID = "measurementSecret"
CLUSTER_ID_KEY_ID = "clusterID"
EMERGENCY_SSH_CA_KEY_ID = "ca_emergency_ssh"
# Ours (not Constellation's): the seed of the Coordinators' Ed25519 signing key. Every Coordinator holds the
# KMS and derives the same key; Nodes pin its public key (``coordinator_pub_key``) and check with it every
# ticket and peer update (docs/protocol.md, "Coordinator signatures"). GetDataKey never hands it out.
COORDINATOR_SIGNING_KEY_ID = "coordinator_signing_key"
# Ours: the key backup.yml encrypts the Coordinators' state with (docs/kms.md). HKDF of the master secret with an
# info label of its own, outside Constellation's ``key-`` namespace, so no derive_key / GetDataKey ID reaches it.
BACKUP_KEY_INFO = b"constellation.cluster/backup-encryption-key/v1"
MASTER_SECRET_FILE_NAME = "constellation-mastersecret.json"
NO_STORE_URI = "storage://no-store"

# Our bounds: every value that comes in from outside has a ceiling.
MASTER_SECRET_LENGTH_MAX = 512
SALT_LENGTH_MAX = 512
DERIVED_KEY_LENGTH_MAX = 255 * 32  # RFC 5869: L <= 255 * HashLen
KEY_ID_LENGTH_MAX = 256
URI_LENGTH_MAX = 8192
URI_VALUE_LENGTH_MAX = 2048
MASTER_SECRET_FILE_SIZE_MAX = 16384

_UUID = re.compile(r"\A[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}\Z")


def hkdf_sha256(ikm: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    """RFC 5869 HKDF-SHA256 (Extract + Expand), as Constellation's ``crypto.DeriveKey``.

    The raw primitive: the empty salt of RFC 5869 A.3 is allowed here, the cluster KMS
    refuses it one level up.
    """
    if not HAS_CRYPTOGRAPHY:
        raise ConstellationError("deriving keys needs the Python library cryptography, which is not "
                                 "installed for this Python interpreter")
    _check_bytes("ikm", ikm, 1, None)
    _check_bytes("salt", salt, 0, None)
    _check_bytes("info", info, 0, None)
    _check_length("length", length)
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(ikm)


def derive_cluster_id(measurement_secret: bytes, measurement_salt: bytes) -> bytes:
    """clusterID = HKDF(measurementSecret, measurementSalt, "key-clusterID", 32)
    (Constellation's ``attestation.DeriveClusterID``)."""
    _check_bytes("measurement_secret", measurement_secret, 1, SALT_LENGTH_MAX)
    _check_bytes("measurement_salt", measurement_salt, 1, SALT_LENGTH_MAX)
    return hkdf_sha256(measurement_secret, measurement_salt,
                       (DEK_PREFIX + CLUSTER_ID_KEY_ID).encode(), DERIVED_KEY_LENGTH_DEFAULT)


def state_disk_key_id(disk_uuid: str) -> str:
    """The key ID of a state disk: its LUKS2 UUID, lower-cased as Constellation's initserver
    does (libcryptsetup reports lower case; the KMS itself is case-sensitive)."""
    if not isinstance(disk_uuid, str) or not _UUID.match(disk_uuid):
        raise InputError("disk_uuid", "a UUID like 0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
                         _preview(disk_uuid))
    return disk_uuid.lower()


def _check_bytes(field: str, value: object, min_len: int, max_len: Optional[int]) -> None:
    if not isinstance(value, (bytes, bytearray)):
        raise InputError(field, "bytes", type(value).__name__)
    if len(value) < min_len:
        raise InputError(field, "at least %d bytes" % min_len, "%d bytes" % len(value))
    if max_len is not None and len(value) > max_len:
        raise InputError(field, "at most %d bytes" % max_len, "%d bytes" % len(value))


def _check_length(field: str, length: object) -> None:
    if isinstance(length, bool) or not isinstance(length, int):
        raise InputError(field, "an integer", _preview(length))
    if not 1 <= length <= DERIVED_KEY_LENGTH_MAX:
        raise InputError(field, "between 1 and %d" % DERIVED_KEY_LENGTH_MAX, length)


def _check_key_id(field: str, key_id: object, max_len: int) -> None:
    if not isinstance(key_id, str):
        raise InputError(field, "a string", type(key_id).__name__)
    if not key_id:
        raise InputError(field, "a non-empty key ID")
    if len(key_id) > max_len:
        raise InputError(field, "at most %d characters" % max_len, "%d characters" % len(key_id))
    if not key_id.isprintable():
        raise InputError(field, "printable characters only")


def _preview(value: object) -> object:
    if isinstance(value, str) and len(value) > 64:
        return value[:61] + "..."
    return value
