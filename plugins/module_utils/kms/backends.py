# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The KMS protocol and the ONE table that picks a backend from a ``kms://`` URI.

The cluster KMS is the backend we have (``cluster.py``). The others Constellation knows (AWS KMS,
GCP KMS, Azure Key Vault or managed HSM) are recognised from the same table: their URIs are parsed
and validated, and opening one says "valid but not available here" instead of failing half-way.
Adding a backend: docs/kms.md, "Backends".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Protocol, Tuple, runtime_checkable

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError
from ansible_collections.constellation.cluster.plugins.module_utils.kms.cluster import ClusterKMS, MasterSecret
from ansible_collections.constellation.cluster.plugins.module_utils.kms.derive import DERIVED_KEY_LENGTH_DEFAULT
from ansible_collections.constellation.cluster.plugins.module_utils.kms.uri import (
    CLUSTER_KMS,
    KMS_BACKENDS,
    KMS_SCHEME,
    BackendURI,
    _b64_param,
    parse_uri,
)


@runtime_checkable
class KMS(Protocol):
    """What every KMS backend offers: a key by ID and length (Constellation's ``GetDEK``-based
    ``GetDataKey``). The cluster KMS also derives the named keys the Core needs."""

    def derive_key(self, key_id: str, length: int = DERIVED_KEY_LENGTH_DEFAULT) -> bytes:
        """The data key ``key_id`` of ``length`` bytes."""


class KMSBackendUnavailable(ConstellationError):
    """The URI is valid, but this controller cannot use its backend."""


@dataclass(frozen=True)
class Backend:
    """One row of the table: the backend's name in ``kms://<name>?...``, its parameters in
    Constellation's order, and how to open it (None: valid, but not available here)."""

    name: str
    params: Tuple[str, ...]
    summary: str
    open: Optional[Callable[[BackendURI], KMS]] = None


def _open_cluster_kms(parsed: BackendURI) -> ClusterKMS:
    return ClusterKMS(MasterSecret(_b64_param(parsed, "key"), _b64_param(parsed, "salt")))


_SUMMARIES = {
    CLUSTER_KMS: "Constellation's cluster KMS: HKDF-SHA256 of the master secret (kms://cluster-kms?key=...&salt=...)",
    "aws": "AWS KMS (needs the AWS client, not installed here)",
    "azure": "Azure Key Vault or managed HSM (needs the Azure client, not installed here)",
    "gcp": "Google Cloud KMS (needs the Google client, not installed here)",
}

BACKENDS: Dict[str, Backend] = {}


def register_backend(backend: Backend) -> Backend:
    """Adds a backend to the table (and its parameters to the URI parser's)."""
    if backend.name in BACKENDS and BACKENDS[backend.name] != backend:
        raise ValueError("KMS backend %s is already registered" % backend.name)
    BACKENDS[backend.name] = backend
    KMS_BACKENDS[backend.name] = tuple(backend.params)
    return backend


for _name, _params in list(KMS_BACKENDS.items()):
    register_backend(Backend(_name, _params, _SUMMARIES.get(_name, _name),
                             _open_cluster_kms if _name == CLUSTER_KMS else None))


def unregister_backend(name: str) -> None:
    """Removes a backend added with register_backend (tests)."""
    BACKENDS.pop(name, None)
    KMS_BACKENDS.pop(name, None)


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
