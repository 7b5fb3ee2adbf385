# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Renamed options (DESIGN.md 6) keep working under their old names for one release, with a
deprecation, and the new and old name together are refused."""

from __future__ import annotations

import pytest
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.constellation.cluster.plugins.module_utils.agent.daemon import AgentConfig
from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import ACTIVATE_NODES_ARGS
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError

NEW = {"coordinator_public_endpoint": "10.0.0.1:9000", "node_public_endpoints": ["10.0.0.2:9000"],
       "admin_priv_key_file": "/k"}


def test_activate_nodes_takes_the_new_names_without_deprecation():
    result = ArgumentSpecValidator(ACTIVATE_NODES_ARGS).validate(dict(NEW))
    assert not result.error_messages
    assert not result._deprecations  # pylint: disable=protected-access


def test_activate_nodes_old_names_work_with_a_deprecation():
    result = ArgumentSpecValidator(ACTIVATE_NODES_ARGS).validate(
        {"coordinator_endpoint": "10.0.0.1:9000", "node_endpoints": ["10.0.0.2:9000"], "admin_priv_key_file": "/k"})
    assert not result.error_messages
    params = result.validated_parameters
    assert params["coordinator_public_endpoint"] == "10.0.0.1:9000"
    assert params["node_public_endpoints"] == ["10.0.0.2:9000"]
    names = sorted(d["msg"].split("'")[1] for d in result._deprecations)  # pylint: disable=protected-access
    assert names == ["coordinator_endpoint", "node_endpoints"]
    assert all(d["version"] == "2.0.0" for d in result._deprecations)  # pylint: disable=protected-access


def test_agent_config_vpn_interface_and_its_old_name(tmp_path):
    base = {"state_dir": str(tmp_path), "public_endpoint": "127.0.0.1:9000", "variant": "dummy",
            "insecure_unauthenticated_activation": True}
    new = AgentConfig.from_mapping(dict(base, vpn_interface="wgx"))
    assert new.vpn_interface == "wgx" and new.deprecations == []
    old = AgentConfig.from_mapping(dict(base, wg_interface="wgy"))
    assert old.vpn_interface == "wgy"
    assert old.deprecations == ["wg_interface is deprecated (removed in 2.0.0): use vpn_interface"]
    with pytest.raises(InputError, match="wg_interface: expected either vpn_interface or its deprecated name"):
        AgentConfig.from_mapping(dict(base, wg_interface="a", vpn_interface="b"))
