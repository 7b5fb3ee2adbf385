# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin remove_peer: the controller asks the Coordinator (attested, admin-authenticated) to remove a
Node (RemovePeer). Documentation is in plugins/modules/remove_peer.py.
"""

from __future__ import annotations

from ansible_collections.constellation.cluster.plugins.module_utils import controller_options
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.plugin_utils.cluster_action import ClusterAction, valid_args


class ActionModule(ClusterAction):
    SPEC = controller_options.REMOVE_PEER_ARGS
    _VALID_ARGS = valid_args(SPEC)

    def act(self, args, settings):
        from ansible_collections.constellation.cluster.plugins.plugin_utils.controller import remove_peer
        if bool(args.get("node_public_ip")) == bool(args.get("node_vpn_ip")):
            raise InputError("node_public_ip", "either the Node's public IP or node_vpn_ip, not both")
        return remove_peer(args["coordinator_public_endpoint"], settings,
                           self.load_admin_priv_key(args["admin_priv_key_file"]),
                           node_public_ip=args.get("node_public_ip"), node_vpn_ip=args.get("node_vpn_ip"),
                           cluster_id=self.cluster_id_arg(args), check_mode=bool(self._task.check_mode))
