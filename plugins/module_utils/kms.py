# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""KMS and storage URIs, the master secret and the keys derived from it (SPEC.md 3).

Compatible with Constellation's ``internal/kms/uri`` and cluster KMS: the same URI forms,
the same ``constellation-mastersecret.json`` file and the same HKDF-SHA256 derivations, so a
master secret made here unlocks a Constellation cluster and the other way round.

Only the cluster KMS (master secret + salt) derives keys here. AWS, Azure and GCP URIs are
parsed and validated, but using them needs the cloud's KMS client, which this controller does
not have: ``open_kms`` says so instead of failing half-way.

Plain Python: no Ansible, no RPC. Key material never appears in an error message or a repr.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import secrets
import stat
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Tuple, Union
from urllib.parse import quote, unquote_plus

from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_write
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    ConstellationError,
    InputError,
)

try:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
except ImportError:  # a host without it can still parse URIs; deriving says what is missing
    HAS_CRYPTOGRAPHY = False
else:
    HAS_CRYPTOGRAPHY = True

# Constellation's constants (SPEC.md 3.3).
DEK_PREFIX = "key-"
MASTER_SECRET_LENGTH_DEFAULT = 32
MASTER_SECRET_LENGTH_MIN = 16
RNG_LENGTH_DEFAULT = 32
DERIVED_KEY_LENGTH_DEFAULT = 32
STATE_DISK_KEY_LENGTH = 32
MEASUREMENT_SECRET_KEY_ID = "measurementSecret"
CLUSTER_ID_KEY_ID = "clusterID"
EMERGENCY_SSH_CA_KEY_ID = "ca_emergency_ssh"
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

KMS_SCHEME = "kms"
STORAGE_SCHEME = "storage"
CLUSTER_KMS = "cluster-kms"
NO_STORE = "no-store"

# Parameters in the order Constellation writes them (SPEC.md 3.1). Every one is mandatory.
KMS_BACKENDS: Dict[str, Tuple[str, ...]] = {
    CLUSTER_KMS: ("key", "salt"),
    "aws": ("region", "accessKeyID", "accessKey", "keyName"),
    "azure": ("tenantID", "clientID", "clientSecret", "vaultName", "vaultType", "keyName"),
    "gcp": ("projectID", "location", "keyRing", "credentialsPath", "keyName"),
}
STORAGE_BACKENDS: Dict[str, Tuple[str, ...]] = {
    NO_STORE: (),
    "aws": ("bucket", "region", "accessKeyID", "accessKey"),
    "azure": ("account", "container", "tenantID", "clientID", "clientSecret"),
    "gcp": ("projectID", "bucket", "credentialsPath"),
}
_BACKENDS = {KMS_SCHEME: KMS_BACKENDS, STORAGE_SCHEME: STORAGE_BACKENDS}

AZURE_VAULT_TYPES = (
    "vault.azure.net",
    "vault.azure.cn",
    "vault.usgovcloudapi.net",
    "vault.microsoftazure.de",
    "managedhsm.azure.net",
)

# Values never echoed in errors.
SECRET_PARAMS = frozenset(("key", "salt", "accessKey", "clientSecret"))
_BASE64_PARAMS = frozenset(("key", "salt"))
# Free text (secrets, file paths): any printable character. Everything else is a cloud
# identifier, for which '&', '=', '?', '#', '%' or spaces can only mean an injection attempt.
_FREE_TEXT_PARAMS = frozenset(("accessKey", "clientSecret", "credentialsPath"))
_IDENTIFIER = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._:/@+-]*\Z")
_URLSAFE_B64 = re.compile(r"\A[A-Za-z0-9_-]*={0,2}\Z")
_STD_B64 = re.compile(r"\A[A-Za-z0-9+/]*={0,2}\Z")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_UUID = re.compile(r"\A[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}\Z")


class KMSBackendUnavailable(ConstellationError):
    """The URI is valid, but this controller cannot use its backend."""


# ---------------------------------------------------------------------------------------------
# HKDF


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


# ---------------------------------------------------------------------------------------------
# Master secret and the cluster KMS


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
            doc = json.loads(text)
        except ValueError:
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
            raise InputError(field, "only the fields key and salt", ", ".join(unknown)[:100])
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
    """Constellation's cluster KMS: every key is HKDF-SHA256 of the master secret."""

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

    def derive_key(self, key_id: str, length: int = DERIVED_KEY_LENGTH_DEFAULT) -> bytes:
        """The key the KeyService hands out for ``GetDataKey(key_id)``: info = ``"key-" + key_id``."""
        _check_key_id("key_id", key_id, KEY_ID_LENGTH_MAX)
        _check_length("length", length)
        return self.get_dek(DEK_PREFIX + key_id, length)

    def state_disk_key(self, disk_uuid: str) -> bytes:
        """The LUKS passphrase (raw bytes) of the state disk with that UUID."""
        return self.derive_key(state_disk_key_id(disk_uuid), STATE_DISK_KEY_LENGTH)

    def measurement_secret(self) -> bytes:
        return self.derive_key(MEASUREMENT_SECRET_KEY_ID, DERIVED_KEY_LENGTH_DEFAULT)

    def cluster_id(self, measurement_salt: bytes) -> bytes:
        return derive_cluster_id(self.measurement_secret(), measurement_salt)

    def emergency_ssh_ca_seed(self) -> bytes:
        return self.derive_key(EMERGENCY_SSH_CA_KEY_ID, DERIVED_KEY_LENGTH_DEFAULT)

    def emergency_ssh_ca_priv_key(self) -> "Ed25519PrivateKey":
        """The emergency SSH CA (RFC 016): an ed25519 key made from the derived seed."""
        return Ed25519PrivateKey.from_private_bytes(self.emergency_ssh_ca_seed())


def open_kms(uri: str, field: str = "kms_uri") -> ClusterKMS:
    """A KMS able to derive keys for the URI; only the cluster KMS works on this controller."""
    parsed = parse_uri(uri, field)
    if parsed.scheme != KMS_SCHEME:
        raise InputError(field, "a kms:// URI", parsed.scheme + "://")
    if parsed.backend != CLUSTER_KMS:
        raise KMSBackendUnavailable(
            "%s: KMS backend %r is valid but not available on this controller (no client library "
            "for it is installed here); use kms://%s" % (field, parsed.backend, CLUSTER_KMS))
    return ClusterKMS(MasterSecret(_b64_param(parsed, "key"), _b64_param(parsed, "salt")))


# ---------------------------------------------------------------------------------------------
# URIs


@dataclass(frozen=True)
class BackendURI:
    """A parsed ``kms://`` or ``storage://`` URI: scheme, backend and decoded parameters."""

    scheme: str
    backend: str
    params: Tuple[Tuple[str, str], ...] = ()

    def __repr__(self) -> str:
        shown = ", ".join("%s=%s" % (k, "<secret>" if k in SECRET_PARAMS else v) for k, v in self.params)
        return "BackendURI(%s://%s?%s)" % (self.scheme, self.backend, shown)

    def get(self, name: str) -> str:
        return dict(self.params)[name]

    def to_uri(self) -> str:
        return format_uri(self.scheme, self.backend, dict(self.params))


def _escape(value: str) -> str:
    # Constellation's parser unescapes every value twice (url.Values.Get, then QueryUnescape),
    # so '%' and '+' must be escaped twice to come back as themselves.
    return quote(value.replace("%", "%25").replace("+", "%2B"), safe="")


def format_uri(scheme: str, backend: str, params: Mapping[str, str], field: str = "uri") -> str:
    """Builds a URI in Constellation's parameter order; values are validated, then escaped."""
    backends = _BACKENDS.get(scheme)
    if backends is None:
        raise InputError(field + " scheme", "one of kms, storage", _preview(scheme))
    if backend not in backends:
        raise InputError(field + " backend", "one of " + ", ".join(backends), _preview(backend))
    names = backends[backend]
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise InputError(unknown[0], "a parameter of %s://%s (%s)" % (scheme, backend, ", ".join(names)))
    for name in names:
        _check_value(scheme, backend, name, params.get(name))
    if not names:
        return "%s://%s" % (scheme, backend)
    # Base64 values are written raw, as Constellation does (their alphabet is query-safe).
    query = "&".join("%s=%s" % (name, params[name] if name in _BASE64_PARAMS else _escape(params[name]))
                     for name in names)
    return "%s://%s?%s" % (scheme, backend, query)


def format_kms_uri(backend: str, **params: str) -> str:
    return format_uri(KMS_SCHEME, backend, params, "kms_uri")


def format_storage_uri(backend: str, **params: str) -> str:
    return format_uri(STORAGE_SCHEME, backend, params, "storage_uri")


def parse_uri(uri: str, field: str = "uri") -> BackendURI:
    """Parses and validates a ``kms://`` or ``storage://`` URI strictly.

    Accepts every URI Constellation writes. Refuses what Constellation would silently
    misread: duplicate or unknown parameters (``key=a&key=b``), fragments, user info, paths,
    bad escapes, and parameter values that smuggle query syntax.
    """
    if not isinstance(uri, str):
        raise InputError(field, "a string", type(uri).__name__)
    if len(uri) > URI_LENGTH_MAX:
        raise InputError(field, "at most %d characters" % URI_LENGTH_MAX, "%d characters" % len(uri))
    if not uri:
        raise InputError(field, "a kms:// or storage:// URI", "an empty string")
    if any(c.isspace() or not c.isprintable() for c in uri):
        raise InputError(field, "a URI without spaces or control characters")
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme not in _BACKENDS:
        raise InputError(field + " scheme", "kms:// or storage://", _preview(scheme if sep else uri))
    if "#" in rest:
        raise InputError(field + " fragment", "no '#' fragment (escape '#' in values as %23)")
    authority, qmark, query = rest.partition("?")
    if "/" in authority and authority.split("/", 1)[1]:
        raise InputError(field + " path", "no path after the backend name", _preview(authority))
    backend = authority.rstrip("/")
    if "@" in backend or ":" in backend:
        raise InputError(field + " backend", "a bare backend name (no user info, no port)")
    backends = _BACKENDS[scheme]
    if backend not in backends:
        raise InputError(field + " backend", "one of " + ", ".join(backends), _preview(backend))
    names = backends[backend]
    if not names:
        if qmark and query:
            raise InputError(field, "no parameters for %s://%s" % (scheme, backend))
        return BackendURI(scheme, backend, ())
    if not query:
        raise InputError(names[0], "a value (%s://%s needs %s)" % (scheme, backend, ", ".join(names)))
    values: Dict[str, str] = {}
    for pair in query.split("&"):
        name, eq, raw = pair.partition("=")
        if not eq or not name:
            raise InputError(field + " query", "name=value pairs separated by '&'", _preview(pair[:40]))
        if name not in names:
            raise InputError(_preview(name), "a parameter of %s://%s (%s)" % (scheme, backend, ", ".join(names)))
        if name in values:
            raise InputError(name, "exactly one value (the parameter is repeated)")
        values[name] = _unescape_twice(name, raw)
    for name in names:
        if name not in values:
            raise InputError(name, "a value (missing from the %s URI)" % scheme)
        _check_value(scheme, backend, name, values[name])
    return BackendURI(scheme, backend, tuple((n, values[n]) for n in names))


def parse_kms_uri(uri: str) -> BackendURI:
    parsed = parse_uri(uri, "kms_uri")
    if parsed.scheme != KMS_SCHEME:
        raise InputError("kms_uri", "a kms:// URI", parsed.scheme + "://")
    return parsed


def parse_storage_uri(uri: str) -> BackendURI:
    parsed = parse_uri(uri, "storage_uri")
    if parsed.scheme != STORAGE_SCHEME:
        raise InputError("storage_uri", "a storage:// URI", parsed.scheme + "://")
    return parsed


def _unescape_twice(name: str, raw: str) -> str:
    value = raw
    for _round in range(2):
        if _BAD_ESCAPE.search(value):
            raise InputError(name, "valid %-escapes (%XX)")
        try:
            value = unquote_plus(value, errors="strict")
        except UnicodeDecodeError:
            raise InputError(name, "UTF-8 text after unescaping") from None
    return value


def _check_value(scheme: str, backend: str, name: str, value: object) -> None:
    secret = name in SECRET_PARAMS
    if not isinstance(value, str) or value == "":
        raise InputError(name, "a non-empty value")
    if len(value) > URI_VALUE_LENGTH_MAX:
        raise InputError(name, "at most %d characters" % URI_VALUE_LENGTH_MAX, "%d characters" % len(value))
    if not value.isprintable():
        raise InputError(name, "printable characters only")
    if name in _BASE64_PARAMS:
        if not _URLSAFE_B64.match(value):
            raise InputError(name, "URL-safe base64 with padding (A-Z a-z 0-9 - _ =)")
    elif name == "vaultType":
        if value not in AZURE_VAULT_TYPES:
            raise InputError(name, "one of " + ", ".join(AZURE_VAULT_TYPES), _preview(value))
    elif name not in _FREE_TEXT_PARAMS and not _IDENTIFIER.match(value):
        raise InputError(name, "an identifier (letters, digits and . _ : / @ + -)", None if secret else _preview(value))


def _b64_param(parsed: BackendURI, name: str) -> bytes:
    value = parsed.get(name)
    try:
        decoded = base64.urlsafe_b64decode(value.encode("ascii"))
    except (binascii.Error, ValueError):
        raise InputError(name, "URL-safe base64 with correct padding") from None
    if base64.urlsafe_b64encode(decoded).decode() != value:
        raise InputError(name, "canonical URL-safe base64 with padding")
    return decoded


def decode_base64(value: object, field: str, max_bytes: int = SALT_LENGTH_MAX) -> bytes:
    """Strict base64 (standard or URL-safe alphabet, padded, canonical) of at most max_bytes."""
    if not isinstance(value, str):
        raise InputError(field, "a base64 string", type(value).__name__)
    if len(value) > 4 * ((max_bytes + 2) // 3):
        raise InputError(field, "at most %d bytes" % max_bytes, "%d base64 characters" % len(value))
    if _STD_B64.match(value):
        decoder, encoder = base64.b64decode, base64.b64encode
    elif _URLSAFE_B64.match(value):
        decoder, encoder = base64.urlsafe_b64decode, base64.urlsafe_b64encode
    else:
        raise InputError(field, "base64 (A-Z a-z 0-9 + / or - _, '=' padding)")
    try:
        decoded = decoder(value.encode("ascii"))
    except (binascii.Error, ValueError):
        raise InputError(field, "base64 with correct padding") from None
    if encoder(decoded).decode() != value:
        raise InputError(field, "canonical base64 with padding")
    return decoded


# ---------------------------------------------------------------------------------------------
# Secret files


def write_secret_file(path: str, data: bytes, mode: int = 0o600, exclusive: bool = False) -> bool:
    """Writes a secret atomically (fileutil.atomic_write). With exclusive, an existing file is
    never replaced, even when another process wins a race; returns False then."""
    return atomic_write(path, data, mode, exclusive)


def secret_file_state(path: str, data: Optional[bytes], mode: int = 0o600) -> Dict[str, object]:
    """What a secret file looks like now, metadata only: exists, mode, size, and whether its
    content equals data (compared in constant time). Never returns the content."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return {"path": path, "exists": False}
    if not stat.S_ISREG(info.st_mode):
        raise InputError("dest", "a regular file or nothing", path)
    state: Dict[str, object] = {"path": path, "exists": True, "mode": "%04o" % stat.S_IMODE(info.st_mode),
                                "size": info.st_size}
    if data is not None:
        same = False
        if info.st_size == len(data):
            with open(path, "rb") as handle:
                same = secrets.compare_digest(handle.read(len(data) + 1), data)
        state["content_matches"] = same
        state["mode_matches"] = stat.S_IMODE(info.st_mode) == mode
    return state


# ---------------------------------------------------------------------------------------------
# Checks


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
