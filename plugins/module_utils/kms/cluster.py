# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cluster KMS, the backend this controller has: the master secret and its ``get_dek``, HKDF-SHA256
of the master secret (Constellation's ``constellation-mastersecret.json`` and ``kms://cluster-kms`` URI).
Every other key is derived over ``get_dek`` in ``keys.py``, as for any backend."""

from __future__ import annotations

import base64
import json
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Union

from ansible_collections.constellation.cluster.plugins.module_utils.encoding import load_json
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.kms import keys
from ansible_collections.constellation.cluster.plugins.module_utils.kms.derive import (
    DEK_PREFIX,
    DERIVED_KEY_LENGTH_DEFAULT,
    KEY_ID_LENGTH_MAX,
    MASTER_SECRET_FILE_SIZE_MAX,
    MASTER_SECRET_LENGTH_DEFAULT,
    MASTER_SECRET_LENGTH_MAX,
    MASTER_SECRET_LENGTH_MIN,
    RNG_LENGTH_DEFAULT,
    SALT_LENGTH_MAX,
    _check_bytes,
    _check_key_id,
    hkdf_sha256,
)
from ansible_collections.constellation.cluster.plugins.module_utils.kms.registry import KMS_SCHEME
from ansible_collections.constellation.cluster.plugins.module_utils.kms.uri import (
    CLUSTER_KMS,
    _b64_param,
    decode_base64,
    format_uri,
    parse_uri,
    safe_name,
)

if TYPE_CHECKING:  # pragma: no cover
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


@dataclass(frozen=True, repr=False)
class MasterSecret:
    """The master key and salt the cluster KMS derives every key from."""

    key: bytes
    salt: bytes

    def __post_init__(self):
        _check_bytes("key", self.key, MASTER_SECRET_LENGTH_MIN, MASTER_SECRET_LENGTH_MAX)
        _check_bytes("salt", self.salt, 1, SALT_LENGTH_MAX)

    def __repr__(self) -> str:
        return "MasterSecret(key=<%d bytes>, salt=<%d bytes>)" % (len(self.key), len(self.salt))

    @classmethod
    def generate(cls, key_length: int = MASTER_SECRET_LENGTH_DEFAULT,
                 salt_length: int = RNG_LENGTH_DEFAULT) -> "MasterSecret":
        """A fresh secret, as the Constellation CLI makes one (32-byte key, 32-byte salt)."""
        return cls(secrets.token_bytes(key_length), secrets.token_bytes(salt_length))

    # -- kms://cluster-kms?key=<urlsafe b64>&salt=<urlsafe b64>

    def to_uri(self) -> str:
        return format_uri(KMS_SCHEME, CLUSTER_KMS, {
            "key": base64.urlsafe_b64encode(self.key).decode(),
            "salt": base64.urlsafe_b64encode(self.salt).decode(),
        })

    @classmethod
    def from_uri(cls, uri: str, field: str = "kms_uri") -> "MasterSecret":
        parsed = parse_uri(uri, field)
        if parsed.scheme != KMS_SCHEME or parsed.backend != CLUSTER_KMS:
            raise InputError(field, "a kms://%s?key=...&salt=... URI" % CLUSTER_KMS,
                             "%s://%s" % (parsed.scheme, parsed.backend))
        return cls(_b64_param(parsed, "key"), _b64_param(parsed, "salt"))

    # -- constellation-mastersecret.json: {"key": <std b64>, "salt": <std b64>}

    def to_json(self) -> str:
        return json.dumps({"key": base64.b64encode(self.key).decode(),
                           "salt": base64.b64encode(self.salt).decode()}) + "\n"

    @classmethod
    def from_json(cls, text: Union[str, bytes], field: str = "master_secret") -> "MasterSecret":
        if isinstance(text, bytes):
            try:
                text = text.decode("utf-8")
            except UnicodeDecodeError:
                raise InputError(field, "UTF-8 JSON text") from None
        if not isinstance(text, str):
            raise InputError(field, "JSON text", type(text).__name__)
        if len(text) > MASTER_SECRET_FILE_SIZE_MAX:
            raise InputError(field, "at most %d characters" % MASTER_SECRET_FILE_SIZE_MAX,
                             "%d characters" % len(text))
        try:
            doc = load_json(text, field, MASTER_SECRET_FILE_SIZE_MAX)
        except InputError:
            # The parser's message may quote the secret: do not pass it on.
            raise InputError(field, 'a JSON object {"key": <base64>, "salt": <base64>}') from None
        return cls.from_mapping(doc, field)

    @classmethod
    def from_mapping(cls, doc: object, field: str = "master_secret") -> "MasterSecret":
        if not isinstance(doc, Mapping):
            raise InputError(field, 'a JSON object {"key": <base64>, "salt": <base64>}',
                             type(doc).__name__)
        unknown = sorted(str(k) for k in doc if k not in ("key", "salt"))
        if unknown:
            raise InputError(field, "only the fields key and salt",
                             ", ".join(str(safe_name(k) or "<a name not shown>") for k in unknown)[:100])
        values = {}
        for name in ("key", "salt"):
            if name not in doc or doc[name] in ("", None):
                raise InputError("%s.%s" % (field, name), "a non-empty standard base64 string")
            values[name] = decode_base64(doc[name], "%s.%s" % (field, name), SALT_LENGTH_MAX)
        try:
            return cls(values["key"], values["salt"])
        except InputError as err:
            raise InputError("%s.%s" % (field, err.field), err.expected, err.got) from None

    @classmethod
    def from_file(cls, path: str) -> "MasterSecret":
        try:
            with open(path, "rb") as handle:
                data = handle.read(MASTER_SECRET_FILE_SIZE_MAX + 1)
        except OSError as err:
            raise InputError("master_secret_path", "a readable file", "%s (%s)" % (path, err.strerror)) from None
        return cls.from_json(data, "master_secret_path")


@dataclass(frozen=True, repr=False)
class ClusterKMS:
    """Constellation's cluster KMS: every key is HKDF-SHA256 of the master secret (``get_dek``)."""

    master_secret: MasterSecret

    def __repr__(self) -> str:
        return "ClusterKMS(%r)" % (self.master_secret,)

    @classmethod
    def from_uri(cls, uri: str, field: str = "kms_uri") -> "ClusterKMS":
        return cls(MasterSecret.from_uri(uri, field))

    def get_dek(self, dek_id: str, length: int = DERIVED_KEY_LENGTH_DEFAULT) -> bytes:
        """``GetDEK``: the ID is the HKDF info, verbatim and case-sensitive (callers add ``key-``)."""
        _check_key_id("dek_id", dek_id, len(DEK_PREFIX) + KEY_ID_LENGTH_MAX)
        return hkdf_sha256(self.master_secret.key, self.master_secret.salt,
                           dek_id.encode("utf-8"), length)

    # Shorthands for the keys every backend gives (kms/keys.py), for callers that hold a ClusterKMS.

    def derive_key(self, key_id: str, length: int = DERIVED_KEY_LENGTH_DEFAULT) -> bytes:
        """The key the KeyService hands out for ``GetDataKey(key_id)``: info = ``"key-" + key_id``."""
        return keys.derive_key(self, key_id, length)

    def state_disk_key(self, disk_uuid: str) -> bytes:
        return keys.state_disk_key(self, disk_uuid)

    def measurement_secret(self) -> bytes:
        return keys.measurement_secret(self)

    def cluster_id(self, measurement_salt: bytes) -> bytes:
        return keys.cluster_id(self, measurement_salt)

    def emergency_ssh_ca_seed(self) -> bytes:
        return keys.emergency_ssh_ca_seed(self)

    def emergency_ssh_ca_priv_key(self) -> "Ed25519PrivateKey":
        return keys.emergency_ssh_ca_priv_key(self)

    def coordinator_signing_priv_key(self) -> "Ed25519PrivateKey":
        return keys.coordinator_signing_priv_key(self)

    def coordinator_pub_key(self) -> str:
        return keys.coordinator_pub_key(self)
