# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin measurement_salt: makes the cluster's measurement salt file on the controller once.

The salt is generated once per cluster (as Constellation's CLI does at init) and must stay the
same for the life of the cluster: the cluster ID is HKDF(measurement secret, salt), and every
re-run of site.yml checks the Coordinator against it. Same file handling as master_secret
(0600, atomic, never overwritten, optionally Ansible Vault); documentation in
plugins/modules/measurement_salt.py.
"""

from __future__ import annotations

import base64
import json
import secrets

from ansible_collections.constellation.cluster.plugins.action.master_secret import WriteOnceSecretAction

SALT_LENGTH = 32
FIELD = "measurementSalt"


def parse_salt_file(data: bytes) -> bytes:
    """``{"measurementSalt": "<std base64 of 32 bytes>"}`` -> the salt; ValueError names the problem."""
    try:
        doc = json.loads(data.decode("utf-8"))
        salt = base64.b64decode(doc[FIELD], validate=True)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise ValueError("expected JSON {\"%s\": \"<base64>\"}" % FIELD) from None
    if len(salt) != SALT_LENGTH:
        raise ValueError("expected a %d-byte salt, found %d bytes" % (SALT_LENGTH, len(salt)))
    return salt


class ActionModule(WriteOnceSecretAction):
    WHAT = "measurement salt file"
    READ_LIMIT = 65536

    def _generate(self) -> bytes:
        return (json.dumps({FIELD: base64.b64encode(secrets.token_bytes(SALT_LENGTH)).decode()}) + "\n").encode()

    def _check_content(self, data: bytes) -> None:
        parse_salt_file(data)
