# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin recover_peer: re-sends the KMS URI to a rebooted peer over aTLS (Recover).
Documentation is in plugins/modules/recover_peer.py.
"""

from __future__ import annotations

from ansible_collections.constellation.cluster.plugins.module_utils import controller_options
from ansible_collections.constellation.cluster.plugins.plugin_utils.cluster_action import ClusterAction, valid_args


class ActionModule(ClusterAction):
    SPEC = controller_options.RECOVER_PEER_ARGS
    _VALID_ARGS = valid_args(SPEC)

    def act(self, args, settings):
        from ansible_collections.constellation.cluster.plugins.plugin_utils.controller import (
            decode_salt, derive_cluster_id, recover_peer)
        cluster_id = derive_cluster_id(args["kms_uri"], decode_salt(args["measurement_salt"]))
        out = recover_peer(args["endpoint"], settings, args["kms_uri"], cluster_id,
                           check_mode=bool(self._task.check_mode))
        out["endpoint"] = args["endpoint"]
        return out
