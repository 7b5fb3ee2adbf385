# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin activate_nodes: the controller attests the nodes (and the further Coordinators),
then asks the Coordinator (admin-authenticated) to activate the fresh ones with one
ActivateAdditionalNodes. Documentation is in plugins/modules/activate_nodes.py.
"""

from __future__ import annotations

from ansible_collections.constellation.cluster.plugins.module_utils import controller_options
from ansible_collections.constellation.cluster.plugins.plugin_utils.cluster_action import ClusterAction, valid_args


class ActionModule(ClusterAction):
    SPEC = controller_options.ACTIVATE_NODES_ARGS
    _VALID_ARGS = valid_args(SPEC)

    def act(self, args, settings):
        from ansible_collections.constellation.cluster.plugins.plugin_utils.controller import activate_nodes
        further = [e for e in args["coordinator_public_endpoints"] or [] if e != args["coordinator_public_endpoint"]]
        if not args["node_public_endpoints"] and not further:
            return {"changed": False, "nodes": [], "activated": [], "resource_version": None}
        out = activate_nodes(args["coordinator_public_endpoint"], args["node_public_endpoints"], settings,
                             self.load_admin_priv_key(args["admin_priv_key_file"]),
                             cluster_id=self.cluster_id_arg(args), check_mode=bool(self._task.check_mode),
                             coordinator_public_endpoints=further,
                             control_plane_public_endpoints=args.get("control_plane_public_endpoints") or [],
                             node_names=args.get("node_names") or {})
        out["activated"] = [row["endpoint"] for row in out["nodes"] if row["action"] == "activate"]
        return out
