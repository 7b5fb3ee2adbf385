# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin master_secret: makes constellation-mastersecret.json on the controller.

An action plugin, not a module, because the master secret belongs to the admin's controller
(like Constellation's CLI) and because Ansible Vault output needs the play's vault secrets,
which only the controller has. The documentation is in plugins/modules/master_secret.py.
"""

from __future__ import annotations

import os

from ansible.errors import AnsibleActionFail
from ansible.parsing.vault import AnsibleVaultError, VaultLib, is_encrypted, match_encrypt_secret

from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import SECRET_FILE_ARGS
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils.kms import (
    MASTER_SECRET_FILE_SIZE_MAX,
    MasterSecret,
    write_secret_file,
)
from ansible_collections.constellation.cluster.plugins.plugin_utils.action_args import ArgSpecAction


def loader_vault(loader) -> VaultLib:
    """The play's vault (its secrets), as the loader holds it."""
    vault = getattr(loader, "_vault", None)
    return vault if vault is not None else VaultLib([])


def vault_encrypt(loader, content: bytes, vault_id, what: str) -> bytes:
    """``content`` encrypted with the play's vault secret ``vault_id`` (default the first); fails naming the fix."""
    secrets = loader_vault(loader).secrets
    if not secrets:
        raise AnsibleActionFail("vault: expected vault secrets in the play "
                                "(--vault-id or --vault-password-file) to encrypt the %s" % what)
    try:
        matched = match_encrypt_secret(secrets, encrypt_vault_id=vault_id)
    except AnsibleVaultError:
        raise AnsibleActionFail("vault_id: expected one of the play's vault IDs (%s), got %r"
                                % (", ".join(v for v, _s in secrets), vault_id)) from None
    return VaultLib(secrets).encrypt(content, secret=matched[1], vault_id=matched[0])


class WriteOnceSecretAction(ArgSpecAction):
    """Makes a secret file on the controller once: generated, optionally Ansible Vault encrypted,
    written 0600 atomically, never overwritten (an existing file is only checked). Subclasses say
    what the file is (``WHAT``), how to make its content and how to check one read back."""

    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(SECRET_FILE_ARGS)
    _requires_connection = False
    WHAT = "Constellation master secret"
    READ_LIMIT = MASTER_SECRET_FILE_SIZE_MAX * 4

    def _generate(self) -> bytes:
        return MasterSecret.generate().to_json().encode()

    def _check_content(self, data: bytes) -> None:
        """Raises ConstellationError or ValueError naming what is wrong with a file's content."""
        MasterSecret.from_json(data, "path")

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        args = self.validated_args(SECRET_FILE_ARGS)
        path = args["path"]
        if not os.path.isabs(path):
            path = os.path.join(self._loader.get_basedir(), path)
        result.update(path=path, changed=False)

        if os.path.lexists(path):
            result["vault_encrypted"] = self._check_existing(path, args)
            return result

        directory = os.path.dirname(path)
        if not os.path.isdir(directory):
            raise AnsibleActionFail("path: expected an existing directory for %s" % path)
        content = self._generate()
        if args["vault"]:
            content = self._encrypt(content, args["vault_id"])
        result.update(changed=True, vault_encrypted=args["vault"])
        if self._task.diff:
            result["diff"] = dict(before_header=path, after_header=path,
                                  before="path: %s\nexists: false\n" % path,
                                  after="path: %s\nexists: true\nmode: '0600'\nvault_encrypted: %s\n"
                                        % (path, str(args["vault"]).lower()))
        if self._task.check_mode:
            return result
        try:
            written = write_secret_file(path, content, exclusive=True)
        except OSError as err:
            raise AnsibleActionFail("path: could not write %s: %s" % (path, err.strerror)) from None
        if not written:
            # another fork (same task, other host) created it first: that one is kept
            result.update(changed=False, vault_encrypted=self._check_existing(path, args))
            result.pop("diff", None)
        return result

    def _vault(self):
        return loader_vault(self._loader)

    def _encrypt(self, content, vault_id):
        return vault_encrypt(self._loader, content, vault_id, self.WHAT)

    def _check_existing(self, path, args):
        """Never overwrites; checks that what is there is the right kind of file when it can read it."""
        name = self._task.action.split(".")[-1]
        if not os.path.isfile(path):
            raise AnsibleActionFail("path: %s exists and is not a regular file; not overwritten" % path)
        try:
            with open(path, "rb") as handle:
                data = handle.read(self.READ_LIMIT)
        except OSError as err:
            raise AnsibleActionFail("path: cannot read existing %s: %s" % (path, err.strerror)) from None
        encrypted = is_encrypted(data)
        if encrypted:
            if not self._vault().secrets:
                self._display.warning("%s: %s is vault-encrypted and the play has no vault "
                                      "secret; it was kept but not checked" % (name, path))
                return True
            try:
                data = self._vault().decrypt(data)
            except AnsibleVaultError:
                raise AnsibleActionFail("path: %s is vault-encrypted with a secret this play does not have; "
                                        "not overwritten" % path) from None
        elif args["vault"]:
            self._display.warning("%s: %s exists unencrypted; it was kept as it is (never "
                                  "overwritten). Encrypt it with ansible-vault encrypt." % (name, path))
        try:
            self._check_content(data)
        except (ConstellationError, ValueError) as err:
            raise AnsibleActionFail("%s is not a valid %s (%s); not overwritten" % (path, self.WHAT, err)) from None
        return encrypted


class ActionModule(WriteOnceSecretAction):
    """master_secret: constellation-mastersecret.json (the defaults of the base)."""
