# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin admit_nodes: the controller asks the Coordinator (attested, admin-authenticated) to admit nodes
to join (AdmitNodes), each by its TPM's EK. Documentation is in plugins/modules/admit_nodes.py.
"""

from __future__ import annotations

from ansible_collections.constellation.cluster.plugins.module_utils import controller_options
from ansible_collections.constellation.cluster.plugins.plugin_utils.cluster_action import ClusterAction, valid_args


class ActionModule(ClusterAction):
    SPEC = controller_options.ADMIT_NODES_ARGS
    _VALID_ARGS = valid_args(SPEC)

    def act(self, args, settings):
        from ansible_collections.constellation.cluster.plugins.plugin_utils.admission import admit_nodes
        answer = admit_nodes(args["coordinator_public_endpoint"], args["nodes"], settings,
                             self.load_admin_priv_key(args["admin_priv_key_file"]),
                             cluster_id=self.cluster_id_arg(args), check_mode=bool(self._task.check_mode))
        before = answer.pop("before")
        if answer["changed"]:
            answer["diff"] = {"before": _lines(before), "after": _lines(answer["admissions"]),
                              "before_header": "admissions", "after_header": "admissions"}
        return answer


def _lines(admissions) -> str:
    return "".join("%s %s%s\n" % (a["name"], a["ek_pub_sha256"], " (joined)" if a.get("joined") else "")
                   for a in admissions)
