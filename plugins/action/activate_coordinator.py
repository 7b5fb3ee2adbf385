# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin activate_coordinator: ActivateAsCoordinator from the controller over aTLS.

An action plugin because the KMS URI and the admin key belong to the controller (as with
Constellation's CLI). Documentation is in plugins/modules/activate_coordinator.py.
"""

from __future__ import annotations

from ansible_collections.constellation.cluster.plugins.module_utils import controller_options
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.plugin_utils.cluster_action import ClusterAction, valid_args


class ActionModule(ClusterAction):
    SPEC = controller_options.ACTIVATE_COORDINATOR_ARGS
    _VALID_ARGS = valid_args(SPEC)

    def act(self, args, settings):
        from ansible_collections.constellation.cluster.plugins.plugin_utils.controller import (
            activate_coordinator, decode_salt)
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
        out = activate_coordinator(args["endpoint"], settings, args["kms_uri"],
                                   decode_salt(args["measurement_salt"]), pub_key, admin_priv_key=priv_key,
                                   storage_uri=args["storage_uri"], cluster_config=config,
                                   check_mode=bool(self._task.check_mode), init_secret=args["init_secret"])
        out["endpoint"] = args["endpoint"]
        return out
