# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin activate_coordinator: ActivateAsCoordinator from the controller over aTLS.

An action plugin because the KMS URI and the admin key belong to the controller (as with
Constellation's CLI). Documentation is in plugins/modules/activate_coordinator.py.
"""

from __future__ import annotations

import base64
import json
import os
import secrets

from ansible.errors import AnsibleError
from ansible.parsing.vault import is_encrypted

from ansible_collections.constellation.cluster.plugins.action.master_secret import loader_vault, vault_encrypt
from ansible_collections.constellation.cluster.plugins.action.measurement_salt import (
    FIELD as SALT_FIELD, SALT_LENGTH, parse_salt_file)
from ansible_collections.constellation.cluster.plugins.module_utils import controller_options
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.kms import (
    MASTER_SECRET_FILE_SIZE_MAX, MasterSecret, write_secret_file)
from ansible_collections.constellation.cluster.plugins.plugin_utils.cluster_action import ClusterAction, valid_args


class ActionModule(ClusterAction):
    SPEC = controller_options.ACTIVATE_COORDINATOR_ARGS
    _VALID_ARGS = valid_args(SPEC)

    def act(self, args, settings):
        from ansible_collections.constellation.cluster.plugins.plugin_utils.controller import (
            activate_coordinator, decode_salt)
        kms_uri, salt, to_write = self.cluster_secrets(args)
        priv_key = None
        if args["admin_priv_key_file"]:
            priv_key = self.load_admin_priv_key(args["admin_priv_key_file"])
        pub_key = args["admin_pub_key"]
        if not pub_key:
            if priv_key is None:
                raise InputError("admin_pub_key", "the admin's public key, or admin_priv_key_file to derive it from",
                                 None)
            from cryptography.hazmat.primitives import serialization
            pub_key = priv_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()
        config = {"vpn_cidr": args["vpn_cidr"]}
        if args["cluster_name"]:
            config["cluster_name"] = args["cluster_name"]
        if args["cluster_pod_cidr"]:  # the Coordinator validates them before its node lock
            config.update(cluster_pod_cidr=args["cluster_pod_cidr"], node_pod_cidr_mask_size=args["node_pod_cidr_mask_size"])
        out = activate_coordinator(args["endpoint"], settings, kms_uri,
                                   decode_salt(salt), pub_key, admin_priv_key=priv_key,
                                   storage_uri=args["storage_uri"], cluster_config=config,
                                   check_mode=bool(self._task.check_mode), init_secret=args["init_secret"])
        out["endpoint"] = args["endpoint"]
        if to_write is not None:
            # Written only now: the Coordinator accepted them (or, in check mode, would).
            out["secret_files_made"] = [path for path, _data in to_write]
            if not self._task.check_mode:
                write_made_secrets(args["endpoint"], to_write)
        return out

    def cluster_secrets(self, args):
        """(kms_uri, measurement salt b64, files to write once activated or None): the given values, the files
        (decrypted in memory), or, where neither file exists, new ones made in memory (vault-encrypted with vault)."""
        files = [args["master_secret_file"], args["measurement_salt_file"]]
        if not any(files):
            for name in ("kms_uri", "measurement_salt"):
                if not args[name]:
                    raise InputError(name, "a value, or master_secret_file and measurement_salt_file")
            return args["kms_uri"], args["measurement_salt"], None
        if args["kms_uri"] or args["measurement_salt"]:
            raise InputError("master_secret_file", "either kms_uri and measurement_salt or the secret files, not both")
        if not all(files):
            raise InputError("measurement_salt_file" if files[0] else "master_secret_file",
                             "a path too (master_secret_file and measurement_salt_file go together)")
        files = [path if os.path.isabs(path) else os.path.join(self._loader.get_basedir(), path) for path in files]
        present = [os.path.lexists(path) for path in files]
        if all(present):
            secret = MasterSecret.from_json(self._read_secret(files[0], "master_secret_file"), "master_secret_file")
            try:
                salt = parse_salt_file(self._read_secret(files[1], "measurement_salt_file"))
            except ValueError as err:
                raise InputError("measurement_salt_file", "%s in %s" % (err, files[1])) from None
            return secret.to_uri(), base64.b64encode(salt).decode(), None
        if any(present):
            have, missing = (files[0], files[1]) if present[0] else (files[1], files[0])
            raise InputError("master_secret_file and measurement_salt_file", "both or neither (a cluster's secrets "
                             "belong together), found only %s; restore %s from your backup" % (have, missing))
        for path in files:
            directory = os.path.dirname(path)
            if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
                raise InputError("master_secret_file" if path == files[0] else "measurement_salt_file",
                                 "a path in an existing, writable folder", path)
        secret = MasterSecret.generate()
        salt = secrets.token_bytes(SALT_LENGTH)
        contents = [secret.to_json().encode(), (json.dumps({SALT_FIELD: base64.b64encode(salt).decode()}) + "\n").encode()]
        if args["vault"]:  # encrypted before anything is sent: what remains after the activation is one write each
            contents = [vault_encrypt(self._loader, data, args["vault_id"], what)
                        for data, what in zip(contents, ("master secret", "measurement salt file"))]
        return secret.to_uri(), base64.b64encode(salt).decode(), list(zip(files, contents))

    def _read_secret(self, path: str, field: str) -> bytes:
        try:
            with open(path, "rb") as handle:
                data = handle.read(MASTER_SECRET_FILE_SIZE_MAX * 4)
        except OSError as err:
            raise InputError(field, "a readable file", "%s (%s)" % (path, err.strerror)) from None
        if is_encrypted(data):
            vault = loader_vault(self._loader)
            if not vault.secrets:
                raise InputError(field, "the play's vault password to decrypt %s (--vault-password-file FILE or "
                                 "--ask-vault-pass)" % path)
            try:
                data = vault.decrypt(data)
            except AnsibleError:
                raise InputError(field, "a file this play's vault password decrypts", path) from None
        return data


def write_made_secrets(endpoint: str, to_write) -> None:
    """Writes the secret files the Coordinator now holds (0600, atomic, never over an existing file)."""
    for path, data in to_write:
        try:
            written = write_secret_file(path, data, exclusive=True)
        except OSError as err:
            written, reason = False, err.strerror
        else:
            reason = "another file appeared there meanwhile"
        if not written:
            raise StateError("%s is activated with secrets that could not be written to %s (%s): the cluster cannot "
                             "be recovered without them; reset the Coordinator (playbooks/reset.yml) and run again"
                             % (endpoint, path, reason))
