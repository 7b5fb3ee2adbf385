# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin agent_state: attests a peer from the controller and asks its state (read-only).

Documentation is in plugins/modules/agent_state.py; the shared base is plugin_utils/cluster_action.py.
"""

from __future__ import annotations

from ansible_collections.constellation.cluster.plugins.module_utils import controller_options
from ansible_collections.constellation.cluster.plugins.plugin_utils.cluster_action import ClusterAction, valid_args


class ActionModule(ClusterAction):
    SPEC = controller_options.AGENT_STATE_ARGS
    _VALID_ARGS = valid_args(SPEC)

    def act(self, args, settings):
        from ansible_collections.constellation.cluster.plugins.plugin_utils.controller import peer_status
        status = peer_status(args["endpoint"], settings, self.cluster_id_arg(args))
        out = status.to_dict()
        out["changed"] = False
        if status.warnings:
            out["warnings"] = list(status.warnings)
        return out
