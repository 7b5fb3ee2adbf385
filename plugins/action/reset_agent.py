# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin reset_agent: the controller resets a peer's agent (ResetAgent; attested,
admin-authenticated) and waits until it answers fresh. Documentation is in plugins/modules/reset_agent.py.
"""

from __future__ import annotations

from ansible_collections.constellation.cluster.plugins.module_utils import controller_options
from ansible_collections.constellation.cluster.plugins.module_utils.errors import PeerUnreachable
from ansible_collections.constellation.cluster.plugins.plugin_utils.cluster_action import ClusterAction, valid_args


class ActionModule(ClusterAction):
    SPEC = controller_options.RESET_AGENT_ARGS
    _VALID_ARGS = valid_args(SPEC)

    def act(self, args, settings):
        from ansible_collections.constellation.cluster.plugins.plugin_utils.controller import reset_agent
        try:
            return reset_agent(args["endpoint"], settings, self.load_admin_priv_key(args["admin_priv_key_file"]),
                               args["public_ip"], cluster_id=self.cluster_id_arg(args), force=args["force"],
                               check_mode=bool(self._task.check_mode), wait_timeout=args["wait_timeout"])
        except PeerUnreachable as err:
            if not args["unreachable_ok"]:
                raise
            return {"changed": False, "reachable": False, "msg": "%s: not reset" % err}
