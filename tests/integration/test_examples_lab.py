# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The attesting examples run as printed against a lab: verify_attestation's, agent_state's and the
verify_problems filter's EXAMPLES tasks, taken from the plugins' docs unchanged, run on a fresh lab (agents
running, nothing activated) with the lab's inventory; then master_secret's, measurement_salt's and
activate_coordinator's activate the lab's Coordinator. The play adds only what is the lab's, not the examples':
the controller runs the tasks locally, and opens its sockets in the lab's network namespace (``netns`` through the
attestation group's module_defaults). tests/unit/test_examples.py checks every example statically."""

from __future__ import annotations

import ast
import sys

import pytest
import yaml

from lab.lab import Lab
from tests.support import ROOT
from tests.support.playbook import run_playbook

pytestmark = pytest.mark.lab

# (plugin file, how many of its example tasks run here): the attesting examples that need no secret and no
# activated cluster.
EXAMPLES = (("plugins/modules/verify_attestation.py", 1), ("plugins/modules/agent_state.py", 1),
            ("plugins/filter/verify_problems.yml", 2))


def _example_tasks(rel, count):
    path = ROOT / rel
    if path.suffix == ".py":
        text = next(node.value.value for node in ast.parse(path.read_text()).body
                    if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "EXAMPLES")
    else:
        text = yaml.safe_load(path.read_text())["EXAMPLES"]
    return yaml.safe_load(text)[:count]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    inv = tmp_path_factory.mktemp("examples") / "inventory"
    made = Lab("dcex", inventory_dir=inv)
    made.up(hosts=2, tpm=True, agents=True)
    try:
        yield made, inv
    finally:
        made.down()


def _run(inv, tmp_path, hosts, examples):
    """The example tasks in one play on ``hosts``, run on the controller in the lab's namespace."""
    tasks = [task for rel, count in examples for task in _example_tasks(rel, count)]
    play = {"name": "The examples", "hosts": hosts, "gather_facts": False,
            "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
            "module_defaults": {"group/constellation.cluster.attestation": {"netns": "{{ constellation_atls_netns }}"}},
            "tasks": tasks}
    playbook = tmp_path / "examples.yml"
    playbook.write_text(yaml.safe_dump([play], sort_keys=False))
    return run_playbook(playbook, str(inv / "hosts.yml"), tmp_path / "runs",
                        ["--vault-password-file", str(inv / "vault_pass")])


def test_the_attesting_examples_run_as_printed(lab, tmp_path):
    _lab, inv = lab
    run = _run(inv, tmp_path, "coordinators:nodes", EXAMPLES)
    assert run.ok, run.stdout[-4000:]
    for host in ("h1", "h2"):
        results = run.results(host)
        assert not results["Attest the coordinator before anything is sent to it"].get("failed"), results
        peer = results["Attest a peer and read its state"]
        assert not peer.get("failed") and peer.get("state"), peer
        assert "What is wrong with it (an empty list when nothing is)" in results, sorted(results)


def test_the_secrets_and_activation_examples_activate_the_coordinator(lab, tmp_path):
    _lab, inv = lab
    run = _run(inv, tmp_path, "coordinators[0]", (
        ("plugins/modules/master_secret.py", 1), ("plugins/modules/measurement_salt.py", 1),
        ("plugins/modules/activate_coordinator.py", 1), ("plugins/modules/agent_state.py", 1)))
    assert run.ok, run.stdout[-4000:]
    assert (inv / "constellation-mastersecret.json").read_text().startswith("$ANSIBLE_VAULT")
    assert (inv / "constellation-measurement-salt.json").read_text().startswith("$ANSIBLE_VAULT")
    results = run.results("h1")
    assert not results["Activate the Coordinator"]["failed"]  # its result is no_log
    assert results["Attest a peer and read its state"]["state"] == "ActivatingNodes", results
    assert run.changed("h1") >= 3  # the two secret files and the activation
