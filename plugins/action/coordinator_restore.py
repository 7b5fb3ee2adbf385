# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin coordinator_restore: a verified backup's Coordinator state onto an attested fresh peer
(ActivateAsCoordinator with restore_state; plugins/plugin_utils/backup.py).
Documentation is in plugins/modules/coordinator_restore.py.
"""

from __future__ import annotations

import base64

from ansible_collections.constellation.cluster.plugins.module_utils import controller_options
from ansible_collections.constellation.cluster.plugins.plugin_utils.cluster_action import ClusterAction, valid_args


class ActionModule(ClusterAction):
    SPEC = controller_options.COORDINATOR_RESTORE_ARGS
    _VALID_ARGS = valid_args(SPEC)

    def act(self, args, settings):
        from cryptography.hazmat.primitives import serialization

        from ansible_collections.constellation.cluster.plugins.module_utils.kms.init_secret import parse_init_secret
        from ansible_collections.constellation.cluster.plugins.module_utils import kms as kms_mod
        from ansible_collections.constellation.cluster.plugins.plugin_utils import backup
        from ansible_collections.constellation.cluster.plugins.plugin_utils.controller import decode_salt

        kms = kms_mod.open_kms(args["kms_uri"])
        salt = decode_salt(args["measurement_salt"])
        cluster_id = kms_mod.cluster_id(kms, salt)
        path, named = backup.choose(args["backup"], args["backup_dir"], cluster_id)
        # Every check before anything is sent: a refused backup never reaches a host.
        try:
            manifest, exported, snapshot = backup.open_all(path, kms, cluster_id)
        except backup.BackupRefused as err:
            raise backup.BackupRefused("backup refused, nothing was sent: %s" % err) from None
        if args["kubernetes_etcd_snapshot"] and snapshot is None:
            raise backup.BackupRefused("%s holds no Kubernetes etcd snapshot (its manifest's contents say why), nothing "
                                       "was sent" % path)
        priv_key = self.load_admin_priv_key(args["admin_priv_key_file"])
        version = backup.peer_resource_version(exported)  # from the decrypted, authenticated state
        reached = {}

        def floor():
            """Only for a fresh host (a second run asks nobody): the versions the Nodes applied, and the newest
            left in the folder must not be older; the highest goes with the restore."""
            reached.update(backup.reached_versions(args["node_endpoints"] or [], settings, priv_key, cluster_id))
            if not named:
                try:
                    backup.check_not_older(path, version, reached)
                except backup.BackupRefused as err:
                    raise backup.BackupRefused("backup refused, nothing was sent: %s" % err) from None
            applied = [v for v in reached.values() if v is not None]
            return max(applied) if applied else None
        pub_key = priv_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo).decode()
        init_secret = parse_init_secret(args["init_secret"]) if args["init_secret"] else None
        out = backup.restore(args["endpoint"], settings, args["kms_uri"], salt, cluster_id, pub_key, exported,
                             init_secret, check_mode=bool(self._task.check_mode), peer_version_floor=floor)
        out.update(backup=path, manifest=manifest, cluster_id=base64.b64encode(cluster_id).decode(), named=named,
                   peer_resource_version=version, nodes_peer_resource_version=reached)
        if args["kubernetes_etcd_snapshot"]:
            out["kubernetes_etcd_snapshot"] = base64.b64encode(snapshot).decode()
        return out
