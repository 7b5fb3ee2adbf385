# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters kms_uri, derive_key and coordinator_pub_key: thin adapters over module_utils/kms/.
Their documentation is in kms_uri.yml, derive_key.yml and coordinator_pub_key.yml next to this file."""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils.kms import (
    MasterSecret,
    decode_base64,
    MASTER_SECRET_LENGTH_MAX,
    SALT_LENGTH_MAX,
    coordinator_pub_key as _coordinator_pub_key,
    derive_key as _derive_key,
    open_kms,
)


def kms_uri(key, salt=None):
    """key_b64 | kms_uri(salt_b64), or master-secret JSON / mapping | kms_uri -> kms://cluster-kms?..."""
    try:
        if salt is None:
            if isinstance(key, Mapping):
                secret = MasterSecret.from_mapping(dict(key))
            elif isinstance(key, str) and key.lstrip().startswith("{"):
                secret = MasterSecret.from_json(key)
            else:
                raise AnsibleFilterError(
                    "kms_uri: salt: expected a base64 salt argument, or a master secret "
                    "(JSON text or mapping with key and salt) as input")
        else:
            secret = MasterSecret(decode_base64(key, "key", MASTER_SECRET_LENGTH_MAX),
                                  decode_base64(salt, "salt", SALT_LENGTH_MAX))
        return secret.to_uri()
    except ConstellationError as err:
        raise AnsibleFilterError("kms_uri: %s" % err) from None


def derive_key(uri, key_id, length=32):
    """kms_uri | derive_key(key_id, length=32) -> lower-case hex of HKDF(..., "key-" + key_id, length)."""
    try:
        if isinstance(length, str) and length.isdigit():
            length = int(length)
        return _derive_key(open_kms(uri), key_id, length).hex()
    except ConstellationError as err:
        raise AnsibleFilterError("derive_key: %s" % err) from None


def coordinator_pub_key(uri):
    """kms_uri | coordinator_pub_key -> the Coordinators' Ed25519 public key (standard base64 of 32 bytes)."""
    try:
        return _coordinator_pub_key(open_kms(uri))
    except ConstellationError as err:
        raise AnsibleFilterError("coordinator_pub_key: %s" % err) from None


class FilterModule:
    """Constellation KMS filters."""

    def filters(self):
        return {"kms_uri": kms_uri, "derive_key": derive_key, "coordinator_pub_key": coordinator_pub_key}
