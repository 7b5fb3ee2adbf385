# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Renamed options (docs/names.md, "Renamed options") keep working under their old names for one release, with a
deprecation, and the new and old name together are refused."""

from __future__ import annotations

import importlib
import inspect
import os
import re
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import AgentConfig
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import ATTESTATION_ARGUMENT_SPEC
from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import ACTIVATE_NODES_ARGS
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
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


# --- the names of docs/names.md (pub_key/priv_key, vpn, vpnapi, one suffix for files, one name per value)

_BASE = {"state_dir": "/tmp/unused", "public_endpoint": "127.0.0.1:9000", "variant": "dummy",
         "insecure_unauthenticated_activation": True}
AGENT_RENAMES = [  # old key, new key, a value (wg_interface -> vpn_interface: the test above)
    ("wg_listen_port", "vpn_listen_port", 51821),
    ("vpn_api_port", "vpnapi_port", 9028),
    ("disk_uuid_file", "state_disk_uuid_file", "/var/lib/x/disk_uuid"),
    ("measurements_public_key", "measurements_pub_key", "/etc/x/measurements.pub"),
]


@pytest.mark.parametrize("old, new, value", AGENT_RENAMES)
def test_agent_config_renamed_keys(old, new, value, tmp_path):
    base = dict(_BASE, state_dir=str(tmp_path))
    config = AgentConfig.from_mapping(dict(base, **{new: value}))
    assert getattr(config, new) == value and config.deprecations == []
    config = AgentConfig.from_mapping(dict(base, **{old: value}))
    assert getattr(config, new) == value
    assert config.deprecations == ["%s is deprecated (removed in 2.0.0): use %s" % (old, new)]
    with pytest.raises(InputError, match="%s: expected either %s or its deprecated name" % (old, new)):
        AgentConfig.from_mapping(dict(base, **{old: value, new: value}))


def _module_spec(monkeypatch, name):
    """The argument spec a module's main() builds (captured before anything runs)."""
    module = importlib.import_module("ansible_collections.constellation.cluster.plugins.modules." + name)

    class _Captured(Exception):
        pass

    captured = {}

    def capture(**kwargs):
        captured.update(kwargs)
        raise _Captured()

    monkeypatch.setattr(module, "AnsibleModule", capture)
    with pytest.raises(_Captured):
        module.main()
    return captured["argument_spec"]


MODULE_RENAMES = [  # module (None: the attestation actions' shared spec), base arguments, old, new, a value
    ("wireguard_interface", {"address": "10.118.0.2/16"}, "private_key_file", "priv_key_file", "/etc/wireguard/k"),
    ("measurements_signature", {"path": "/m.json"}, "private_key_path", "priv_key_file", "/k.pem"),
    ("measurements_signature", {"path": "/m.json"}, "private_key_passphrase", "priv_key_passphrase", "pass"),
    ("measurements_signature", {"path": "/m.json"}, "public_key_path", "pub_key_file", "/k.pub"),
    ("kms_key", {"key_id": "x", "dest": "/k"}, "master_secret_path", "master_secret_file", "/s.json"),
    ("kms_key", {"master_secret_file": "/s.json", "dest": "/k"}, "disk_uuid", "state_disk_uuid", "0f7c0b4e-0000-4000-8000-000000000001"),
    ("attestation_info", {}, "event_log_path", "event_log_file", "/log"),
    (None, {}, "measurements_path", "measurements_file", "/m.json"),
    (None, {"measurements_file": "/m.json"}, "measurements_public_key_path", "measurements_pub_key_file", "/m.pub"),
]


@pytest.mark.parametrize("name, base, old, new, value", MODULE_RENAMES)
def test_module_options_renamed(monkeypatch, name, base, old, new, value):
    spec = _module_spec(monkeypatch, name) if name else dict(ATTESTATION_ARGUMENT_SPEC)
    validator = ArgumentSpecValidator(spec)
    result = validator.validate(dict(base, **{new: value}))
    assert not result.error_messages and not result._deprecations  # pylint: disable=protected-access
    result = validator.validate(dict(base, **{old: value}))
    assert not result.error_messages
    assert result.validated_parameters[new] == value
    assert [(d["msg"].split("'")[1], d["version"]) for d in result._deprecations] == [(old, "2.0.0")]  # pylint: disable=protected-access
    # Both: Ansible's aliases do not refuse the pair, they warn (as for activate_nodes' coordinator_endpoint).
    result = validator.validate(dict(base, **{old: value, new: value}))
    assert result._warnings == [{"option": new, "alias": old}]  # pylint: disable=protected-access


RETURN_RENAMES = [  # module, old return key, new return key
    ("measurements_signature", "signature_path", "signature_file"),
    ("kubeadm_init", "kubeconfig_path", "kubeconfig_file"),
    ("kubeadm_init", "admin_kubeconfig_path", "admin_kubeconfig_file"),
    ("kubeadm_join", "kubelet_kubeconfig_path", "kubelet_kubeconfig_file"),
    ("kubeadm_join", "kubelet_cert_path", "kubelet_cert_file"),
]


@pytest.mark.parametrize("name, old, new", RETURN_RENAMES)
def test_module_returns_the_new_and_the_deprecated_key(name, old, new):
    module = importlib.import_module("ansible_collections.constellation.cluster.plugins.modules." + name)
    returns = yaml.safe_load(module.RETURN)
    assert "deprecated" in returns[old]["description"] and "2.0.0" in returns[old]["description"]
    assert "deprecated" not in str(returns[new]["description"])
    source = inspect.getsource(module)
    assert source.count(old) > 1 and source.count(new) > 1  # documented and returned


ROLE_RENAMES = [  # role, old variable, new variable
    ("node_agent", "node_agent_measurements_path", "node_agent_measurements_file"),
    ("node_agent", "node_agent_measurements_public_key", "node_agent_measurements_pub_key"),
    ("node_agent", "node_agent_wg_interface", "node_agent_vpn_interface"),
    ("node_agent", "node_agent_wg_listen_port", "node_agent_vpn_listen_port"),
    ("node_agent", "node_agent_vpn_api_port", "node_agent_vpnapi_port"),
    ("node", "node_coordinator_vpn_api_port", "node_coordinator_vpnapi_port"),
    ("wireguard", "wireguard_private_key_file", "wireguard_priv_key_file"),
]


def _role_file(role, *path):
    return yaml.safe_load((ROOT / "roles" / role / os.path.join(*path)).read_text())


@pytest.mark.parametrize("role, old, new", ROLE_RENAMES)
def test_role_variables_renamed(role, old, new):
    defaults = _role_file(role, "defaults", "main.yml")
    assert old not in defaults  # unset by default, so that the new variable's default can read it
    assert re.match(r"^\{\{ %s \| default\(" % old, str(defaults[new]))
    options = _role_file(role, "meta", "argument_specs.yml")["argument_specs"]["main"]["options"]
    assert "Deprecated, removed in 2.0.0" in options[old]["description"] and "default" not in options[old]
    assert "deprecated" not in str(options[new]["description"]).lower()
    tasks = (ROOT / "roles" / role / "tasks" / "main.yml").read_text()
    renamed = (_role_file(role, "vars", "main.yml") or {}).get("node_agent_renamed_vars", {}) \
        if (ROOT / "roles" / role / "vars" / "main.yml").exists() else {}
    assert renamed.get(old) == new or ("%s is deprecated (removed in 2.0.0): use %s" % (old, new)) in tasks


CONNECTION_RENAMES = [("constellation_measurements_path", "constellation_measurements_file"),
                      ("constellation_measurements_public_key_path", "constellation_measurements_pub_key_file")]


@pytest.mark.parametrize("old, new", CONNECTION_RENAMES)
def test_connection_variables_renamed(old, new):
    from ansible_collections.constellation.cluster.plugins.connection import atls
    options = yaml.safe_load(atls.DOCUMENTATION)["options"]
    entries = next(o["vars"] for o in options.values() if any(v["name"] == new for v in o.get("vars", [])))
    # The last variable set wins (Ansible's config manager): the new name after the deprecated one.
    assert [v["name"] for v in entries] == [old, new]
    assert entries[0]["deprecated"]["version"] == "2.0.0" and entries[0]["deprecated"]["alternatives"] == new
    assert "deprecated" not in entries[1]
