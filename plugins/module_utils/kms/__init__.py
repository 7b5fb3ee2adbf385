# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""KMS and storage URIs, the master secret and the keys derived from it (docs/kms.md).

Compatible with Constellation's ``internal/kms/uri`` and cluster KMS: the same URI forms,
the same ``constellation-mastersecret.json`` file and the same HKDF-SHA256 derivations, so a
master secret made here unlocks a Constellation cluster and the other way round.

Rooms: ``derive.py`` (HKDF and the named key IDs), ``registry.py`` (the one table of backends, each with
its whole rule), ``uri.py`` (URIs, parsed by the table), ``cluster.py`` (the cluster KMS: the master secret
and its ``get_dek``), ``keys.py`` (the keys every backend gives over ``get_dek``), ``backends.py`` (the KMS
protocol, the backends we ship, ``open_kms``), ``files.py`` (secret files). This module re-exports their names.

Plain Python: no Ansible, no RPC. Key material never appears in an error message or a repr.
"""

from __future__ import annotations

# pylint: disable=unused-import
from ansible_collections.constellation.cluster.plugins.module_utils.kms.backends import (  # noqa: F401
    AZURE_VAULT_TYPES, KMS, KMSBackendUnavailable, open_kms)
from ansible_collections.constellation.cluster.plugins.module_utils.kms.cluster import ClusterKMS, MasterSecret  # noqa: F401
from ansible_collections.constellation.cluster.plugins.module_utils.kms.derive import (  # noqa: F401
    BACKUP_KEY_INFO, CLUSTER_ID_KEY_ID, COORDINATOR_SIGNING_KEY_ID, DEK_PREFIX, DERIVED_KEY_LENGTH_DEFAULT, DERIVED_KEY_LENGTH_MAX, EMERGENCY_SSH_CA_KEY_ID,
    HAS_CRYPTOGRAPHY, KEY_ID_LENGTH_MAX, MASTER_SECRET_FILE_NAME, MASTER_SECRET_FILE_SIZE_MAX,
    MASTER_SECRET_LENGTH_DEFAULT, MASTER_SECRET_LENGTH_MAX, MASTER_SECRET_LENGTH_MIN, MEASUREMENT_SECRET_KEY_ID,
    NO_STORE_URI, RNG_LENGTH_DEFAULT, SALT_LENGTH_MAX, STATE_DISK_KEY_LENGTH, URI_LENGTH_MAX, URI_VALUE_LENGTH_MAX,
    derive_cluster_id, hkdf_sha256, state_disk_key_id)
from ansible_collections.constellation.cluster.plugins.module_utils.kms.files import secret_file_state, write_secret_file  # noqa: F401
from ansible_collections.constellation.cluster.plugins.module_utils.kms.keys import (  # noqa: F401
    backup_key, cluster_id, coordinator_pub_key, coordinator_signing_priv_key, derive_key, emergency_ssh_ca_priv_key,
    emergency_ssh_ca_seed, measurement_secret, state_disk_key)
from ansible_collections.constellation.cluster.plugins.module_utils.kms.registry import (  # noqa: F401
    BACKENDS, KMS_SCHEME, STORAGE_BACKENDS, STORAGE_SCHEME, Backend, backend_of, register_backend, unregister_backend)
from ansible_collections.constellation.cluster.plugins.module_utils.kms.uri import (  # noqa: F401
    CLUSTER_KMS, NO_STORE, BackendURI, decode_base64, format_kms_uri, format_storage_uri, format_uri, parse_kms_uri,
    parse_storage_uri, parse_uri)
