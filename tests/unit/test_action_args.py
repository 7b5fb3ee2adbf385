# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The action plugins' task arguments (plugins/plugin_utils/action_args.py: ansible-core's
ActionBase.validate_argument_spec()): a bad argument fails the task naming the option, nothing else runs; a
deprecated alias or option works and is shown as a deprecation; a no_log value never appears in an error."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.constellation.cluster.plugins.plugin_utils.action_args import ArgSpecAction, deprecations
from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import (
    ACTIVATE_COORDINATOR_ARGS, ACTIVATE_NODES_ARGS)
from tests.support.playbook import run_tasks

ACTIONS = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "plugins" / "action").glob("*.py"))
SECRET = "kms://cluster-kms?key=S3CRET-never-shown"


def _task(title, action, **options):
    return {"name": title, "constellation.cluster." + action: options, "ignore_errors": True}


def test_every_action_validates_through_action_args():
    """No action plugin builds an ArgumentSpecValidator itself or reads a validation result's private fields."""
    root = Path(__file__).resolve().parents[2]
    for name in ACTIONS:
        source = (root / "plugins" / "action" / (name + ".py")).read_text()
        assert "ArgumentSpecValidator" not in source and "_deprecations" not in source, name
    for name in ("cluster_action", "action_args"):
        source = (root / "plugins" / "plugin_utils" / (name + ".py")).read_text()
        assert "ArgumentSpecValidator" not in source and "_deprecations" not in source, name


def test_bad_arguments_fail_naming_the_option_and_deprecated_names_warn(tmp_path):
    tasks = [
        _task("missing", "activate_nodes", admin_priv_key_file="/nonexistent/k", node_public_endpoints=[]),
        _task("unknown", "agent_state", endpoint="127.0.0.1:1", not_an_option=1),
        _task("choice", "verify_attestation", endpoint="127.0.0.1:1", variant="no-such-variant"),
        _task("exclusive", "verify_attestation", endpoint="127.0.0.1:1", measurements={}, measurements_file="/m"),
        _task("type", "activate_coordinator", endpoint="127.0.0.1:1", kms_uri=SECRET, measurement_salt=SECRET,
              timeout="soon"),
        _task("secret file", "master_secret", path=str(tmp_path / "ms.json"), vault="perhaps"),
        _task("image", "image_measurements", name="x", dest=str(tmp_path / "m.json")),
        # Deprecated names: validated, converted and used (here: the measurements file they name is read).
        _task("old alias", "verify_attestation", endpoint="127.0.0.1:1", timeout=0.5,
              measurements_path=str(tmp_path / "absent.json")),
        _task("old option", "activate_coordinator", endpoint="127.0.0.1:1", kms_uri=SECRET, measurement_salt=SECRET,
              vpn_interface="wg0", measurements_file=str(tmp_path / "absent.json"), timeout=0.5),
    ]
    # ansible-test units turns deprecation warnings off (ANSIBLE_DEPRECATION_WARNINGS=false); an operator's run shows them.
    run = run_tasks(tmp_path, tasks, env={"ANSIBLE_DEPRECATION_WARNINGS": "true"})
    results = run.results()
    expected = {"missing": "coordinator_public_endpoint", "unknown": "not_an_option", "choice": "variant",
                "exclusive": "measurements|measurements_file", "type": "timeout", "secret file": "vault",
                "image": "uki"}
    for title, option in expected.items():
        assert results[title]["failed"], title
        assert option in results[title]["msg"], (title, results[title]["msg"])
    assert "absent.json" in results["old alias"]["msg"]  # the alias's value was used
    assert "absent.json" in results["old option"]["msg"]
    assert "Alias 'measurements_path' is deprecated" in run.stdout
    assert "Param 'vpn_interface' is deprecated" in run.stdout
    assert SECRET not in run.stdout


class _Action(ArgSpecAction):
    def run(self, tmp=None, task_vars=None):  # pragma: no cover - not run here
        raise NotImplementedError


def _action(**args):
    return _Action(SimpleNamespace(args=args, action="x"), None, None, None, None)


def test_a_no_log_value_is_masked_in_the_error():
    spec = dict(pin=dict(type="int", no_log=True), mode=dict(type="str", choices=["a"], no_log=True))
    with pytest.raises(AnsibleActionFail) as err:
        _action(pin="S3CRET").validated_args(spec)
    assert "pin" in err.value.message and "S3CRET" not in err.value.message
    with pytest.raises(AnsibleActionFail) as err:
        _action(mode="S3CRET").validated_args(spec)
    assert "mode" in err.value.message and "S3CRET" not in err.value.message


def test_deprecations_of_the_real_specs():
    assert list(deprecations(ACTIVATE_NODES_ARGS, {"coordinator_public_endpoint": "a"})) == []
    assert [d[0].split("'")[1] for d in deprecations(ACTIVATE_NODES_ARGS, {"node_endpoints": []})] == ["node_endpoints"]
    assert list(deprecations(ACTIVATE_COORDINATOR_ARGS, {"vpn_interface": "wg0"})) == [
        ("Param 'vpn_interface' is deprecated. See the module docs for more information", "2.0.0",
         "constellation.cluster")]
