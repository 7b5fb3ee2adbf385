# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin coordinator_backup: the attested Coordinator's state (ExportState over the admin channel),
encrypted on the controller into the backup folder (plugins/plugin_utils/backup.py).
Documentation is in plugins/modules/coordinator_backup.py.
"""

from __future__ import annotations

import base64

from ansible_collections.constellation.cluster.plugins.module_utils import controller_options
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.plugin_utils.cluster_action import ClusterAction, valid_args

KUBERNETES_NOT_TAKEN = {"name": "kubernetes_etcd", "included": False,
                        "reason": "Kubernetes is managed but no snapshot of its etcd was given (kubernetes_etcd_snapshot): "
                                  "the backup holds the Coordinator's state only"}
# What the manifest says about where the snapshot was taken (the kubernetes_etcd_snapshot module's result).
_SOURCE_FIELDS = ("control_plane", "endpoint", "revision", "etcd_version")


class ActionModule(ClusterAction):
    SPEC = controller_options.COORDINATOR_BACKUP_ARGS
    _VALID_ARGS = valid_args(SPEC)

    def act(self, args, settings):
        from ansible_collections.constellation.cluster.plugins.module_utils import kms as kms_mod
        from ansible_collections.constellation.cluster.plugins.plugin_utils import backup
        from ansible_collections.constellation.cluster.plugins.plugin_utils.controller import decode_salt

        kms = kms_mod.open_kms(args["kms_uri"])
        cluster_id = kms_mod.cluster_id(kms, decode_salt(args["measurement_salt"]))
        exported = backup.export_state(args["endpoint"], settings, self.load_admin_priv_key(args["admin_priv_key_file"]),
                                       cluster_id)
        out = {"changed": False, "endpoint": args["endpoint"], "cluster_id": base64.b64encode(cluster_id).decode()}
        warnings = []
        kubernetes, snapshot, snapshot_sha256 = None, None, None
        if args["kubernetes"] and args["kubernetes_etcd_snapshot"]:
            try:
                snapshot = base64.b64decode(args["kubernetes_etcd_snapshot"], validate=True)
            except ValueError:
                raise InputError("kubernetes_etcd_snapshot", "the snapshot in standard base64", "(not shown)") from None
            # Verified before anything is compared or written: a damaged snapshot makes no backup.
            snapshot_sha256 = backup.check_snapshot(snapshot, "the Kubernetes etcd snapshot given")
            source = args["kubernetes_etcd_source"] or {}
            kubernetes = {k: source[k] for k in _SOURCE_FIELDS
                          if isinstance(source.get(k), (str, int)) and not isinstance(source.get(k), bool)}
        elif args["kubernetes"]:
            kubernetes = KUBERNETES_NOT_TAKEN
            warnings.append(KUBERNETES_NOT_TAKEN["reason"])
        current = backup.fingerprint(kms, exported, snapshot_sha256)
        for path, _manifest in reversed(backup.backups(args["backup_dir"], out["cluster_id"])):
            try:
                manifest, _state = backup.open_backup(path, kms, cluster_id)
            except backup.BackupRefused as err:  # a damaged newest backup is no reason to skip this one
                warnings.append("the newest backup is not usable, a new one is made: %s" % err)
                break
            if manifest.get("state_fingerprint") == current:
                out.update(path=path, manifest=manifest, note="the Coordinator's state is unchanged since this backup")
                return dict(out, warnings=warnings) if warnings else out
            break
        out["changed"] = True
        manifest, data, name = backup.seal(kms, exported, args["endpoint"], kubernetes, snapshot)
        if self._task.check_mode:
            out.update(path=None, manifest=manifest, note="check mode: a new backup would be written")
        else:
            out.update(path=backup.write(args["backup_dir"], manifest, data, name), manifest=manifest)
        return dict(out, warnings=warnings) if warnings else out
