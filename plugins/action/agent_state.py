# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin agent_state: attests a peer from the controller and asks its state (read-only).

Documentation is in plugins/modules/agent_state.py; the shared base is plugin_utils/cluster_action.py.
"""

from __future__ import annotations

import os

from ansible_collections.constellation.cluster.plugins.module_utils import controller_options
from ansible_collections.constellation.cluster.plugins.plugin_utils.cluster_action import (
    ClusterAction, display, valid_args)


class ActionModule(ClusterAction):
    SPEC = controller_options.AGENT_STATE_ARGS
    _VALID_ARGS = valid_args(SPEC)

    def act(self, args, settings):
        from ansible_collections.constellation.cluster.plugins.plugin_utils.controller import peer_report
        # The admin key (before the first activation it may not exist yet: then only state and role are read).
        key_file = args.get("admin_priv_key_file")
        priv_key = self.load_admin_priv_key(key_file) if key_file and os.path.exists(key_file) else None
        report = peer_report(args["endpoint"], settings, self.cluster_id_arg(args), priv_key)
        out = report.to_dict()
        out["changed"] = False
        warnings = list(report.warnings)
        if report.host_root_trusted:  # said on every run (docs/security.md, "At rest")
            warnings.append("%s: host root is trusted on this peer (deployment_mode %s: the agent runs on an ordinary "
                            "host, whose root can replay what the agent measures and read its secrets)"
                            % (report.endpoint, report.deployment_mode))
        if warnings:
            out["warnings"] = warnings
        self._prestart_connection(report.endpoint, report.state)
        return out

    def _prestart_connection(self, endpoint: str, state: str) -> None:
        """An activated peer's admin channel is open: the atls connection (its option prestart)
        starts its relay now, in the background, for the tasks that come. Nothing else is sent, and
        whatever goes wrong is the first such task's to report."""
        from ansible_collections.constellation.cluster.plugins.module_utils.core.state import ACTIVATED

        start = getattr(self._connection, "start_in_background", None)
        if start is None or state not in [activated.wire_name for activated in ACTIVATED]:
            return
        try:
            if start():
                display.vvv("ATLS: relay started in the background", host=endpoint)
        except Exception as err:  # pylint: disable=broad-except
            display.vvv("ATLS: no relay started in the background: %s" % err, host=endpoint)
