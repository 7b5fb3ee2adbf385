# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The KMS protocol, the backends we ship (rows of ``registry.py``'s table) and ``open_kms``.

The cluster KMS is the backend we have (``cluster.py``). The others Constellation knows (AWS KMS,
GCP KMS, Azure Key Vault or managed HSM) are recognised from the same table: their URIs are parsed
and validated, and opening one says "valid but not available here" instead of failing half-way.
Adding a backend: docs/kms.md, "Backends".
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError
from ansible_collections.constellation.cluster.plugins.module_utils.kms.cluster import ClusterKMS, MasterSecret
from ansible_collections.constellation.cluster.plugins.module_utils.kms.derive import DERIVED_KEY_LENGTH_DEFAULT
from ansible_collections.constellation.cluster.plugins.module_utils.kms.registry import (
    BACKENDS,
    KMS_SCHEME,
    STORAGE_SCHEME,
    Backend,
    register_backend,
)
from ansible_collections.constellation.cluster.plugins.module_utils.kms.uri import (
    CLUSTER_KMS,
    NO_STORE,
    BackendURI,
    _b64_param,
    parse_uri,
)


@runtime_checkable
class KMS(Protocol):
    """What a KMS backend writes: Constellation's ``GetDEK``, a key by ID (used verbatim) and length. Every
    other key (``derive_key``, the named keys, the backup key) is derived over it in ``keys.py``."""

    def get_dek(self, dek_id: str, length: int = DERIVED_KEY_LENGTH_DEFAULT) -> bytes:
        """The key ``dek_id`` of ``length`` bytes."""


class KMSBackendUnavailable(ConstellationError):
    """The URI is valid, but this controller cannot use its backend."""


def _open_cluster_kms(parsed: BackendURI) -> ClusterKMS:
    return ClusterKMS(MasterSecret(_b64_param(parsed, "key"), _b64_param(parsed, "salt")))


AZURE_VAULT_TYPES = (
    "vault.azure.net",
    "vault.azure.cn",
    "vault.usgovcloudapi.net",
    "vault.microsoftazure.de",
    "managedhsm.azure.net",
)

# The backends Constellation knows, their parameters in the order Constellation writes them (docs/kms.md).
register_backend(Backend(
    CLUSTER_KMS, ("key", "salt"),
    "Constellation's cluster KMS: HKDF-SHA256 of the master secret (kms://cluster-kms?key=...&salt=...)",
    _open_cluster_kms, secret_params=("key", "salt"), base64_params=("key", "salt")))
register_backend(Backend(
    "aws", ("region", "accessKeyID", "accessKey", "keyName"), "AWS KMS (needs the AWS client, not installed here)",
    secret_params=("accessKey",), free_text_params=("accessKey",)))
register_backend(Backend(
    "azure", ("tenantID", "clientID", "clientSecret", "vaultName", "vaultType", "keyName"),
    "Azure Key Vault or managed HSM (needs the Azure client, not installed here)",
    secret_params=("clientSecret",), free_text_params=("clientSecret",), choices=(("vaultType", AZURE_VAULT_TYPES),)))
register_backend(Backend(
    "gcp", ("projectID", "location", "keyRing", "credentialsPath", "keyName"),
    "Google Cloud KMS (needs the Google client, not installed here)", free_text_params=("credentialsPath",)))
register_backend(Backend(NO_STORE, (), "no storage", scheme=STORAGE_SCHEME))
register_backend(Backend(
    "aws", ("bucket", "region", "accessKeyID", "accessKey"), "AWS S3", secret_params=("accessKey",),
    free_text_params=("accessKey",), scheme=STORAGE_SCHEME))
register_backend(Backend(
    "azure", ("account", "container", "tenantID", "clientID", "clientSecret"), "Azure Blob Storage",
    secret_params=("clientSecret",), free_text_params=("clientSecret",), scheme=STORAGE_SCHEME))
register_backend(Backend(
    "gcp", ("projectID", "bucket", "credentialsPath"), "Google Cloud Storage", free_text_params=("credentialsPath",),
    scheme=STORAGE_SCHEME))


def open_kms(uri: str, field: str = "kms_uri") -> KMS:
    """The KMS of a ``kms://`` URI, picked from the table; KMSBackendUnavailable for a backend
    that is valid but not available here. Errors never contain the URI's secrets."""
    parsed = parse_uri(uri, field)
    if parsed.scheme != KMS_SCHEME:
        raise InputError(field, "a kms:// URI", parsed.scheme + "://")
    backend = BACKENDS.get(parsed.backend)
    if backend is None or backend.open is None:
        raise KMSBackendUnavailable(
            "%s: KMS backend %r is valid but not available on this controller (no client library "
            "for it is installed here); use kms://%s" % (field, parsed.backend, CLUSTER_KMS))
    return backend.open(parsed)
