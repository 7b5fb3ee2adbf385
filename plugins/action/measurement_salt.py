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
import os
import secrets

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.parsing.vault import AnsibleVaultError, is_encrypted

from ansible_collections.constellation.cluster.plugins.action.master_secret import ActionModule as MasterSecretAction
from ansible_collections.constellation.cluster.plugins.module_utils.kms import write_secret_file

SALT_LENGTH = 32
FIELD = "measurementSalt"
ARGUMENT_SPEC = dict(
    path=dict(type="path", required=True),
    vault=dict(type="bool", default=False),
    vault_id=dict(type="str"),
)


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


class ActionModule(MasterSecretAction):
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)

    def run(self, tmp=None, task_vars=None):
        result = super(MasterSecretAction, self).run(tmp, task_vars)  # pylint: disable=bad-super-call
        del tmp
        validation = ArgumentSpecValidator(ARGUMENT_SPEC).validate(self._task.args)
        if validation.error_messages:
            raise AnsibleActionFail("; ".join(validation.error_messages))
        args = validation.validated_parameters
        path = args["path"]
        if not os.path.isabs(path):
            path = os.path.join(self._loader.get_basedir(), path)
        result.update(path=path, changed=False)
        if os.path.lexists(path):
            result["vault_encrypted"] = self._check_salt_file(path)
            return result
        if not os.path.isdir(os.path.dirname(path)):
            raise AnsibleActionFail("path: expected an existing directory for %s" % path)
        content = (json.dumps({FIELD: base64.b64encode(secrets.token_bytes(SALT_LENGTH)).decode()}) + "\n").encode()
        if args["vault"]:
            content = self._encrypt(content, args["vault_id"])
        result.update(changed=True, vault_encrypted=args["vault"])
        if self._task.check_mode:
            return result
        try:
            written = write_secret_file(path, content, exclusive=True)
        except OSError as err:
            raise AnsibleActionFail("path: could not write %s: %s" % (path, err.strerror)) from None
        if not written:
            result.update(changed=False, vault_encrypted=self._check_salt_file(path))
        return result

    def _check_salt_file(self, path):
        """Never overwrites; checks what is there when it can read it."""
        if not os.path.isfile(path):
            raise AnsibleActionFail("path: %s exists and is not a regular file; not overwritten" % path)
        with open(path, "rb") as handle:
            data = handle.read(65536)
        encrypted = is_encrypted(data)
        if encrypted:
            if not self._vault().secrets:
                return True
            try:
                data = self._vault().decrypt(data)
            except AnsibleVaultError:
                raise AnsibleActionFail("path: %s is vault-encrypted with a secret this play does not have; "
                                        "not overwritten" % path) from None
        try:
            parse_salt_file(data)
        except ValueError as err:
            raise AnsibleActionFail("%s is not a measurement salt file (%s); not overwritten" % (path, err)) from None
        return encrypted
