# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter agent_config_error: the node agent's own configuration check (module_utils/agent/config.py),
run on the controller before anything is installed. Its documentation is in agent_config_error.yml."""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError


def agent_config_error(config, names=None):
    """config | agent_config_error(names) -> '' when the agent would start with it, else the error,
    naming the field by names[field] (e.g. the role variable that sets it) when given."""
    from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import AgentConfig

    if names is not None and not isinstance(names, Mapping):
        raise AnsibleFilterError("agent_config_error: names: expected a mapping of config key to variable name")
    try:
        AgentConfig.from_mapping(config)
    except InputError as err:
        field = (names or {}).get(err.field, err.field)
        msg = "%s: expected %s" % (field, err.expected)
        if err.got is not None:
            msg += ", got %r" % (err.got,)
        return msg
    except ConstellationError as err:
        return str(err)
    return ""


class FilterModule:
    """Node agent configuration filters."""

    def filters(self):
        return {"agent_config_error": agent_config_error}
