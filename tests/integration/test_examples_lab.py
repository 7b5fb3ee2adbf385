# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The attesting examples run as printed against a lab: verify_attestation's, agent_state's and the
verify_problems filter's EXAMPLES tasks, taken from the plugins' docs unchanged, run on a fresh lab (agents
running, nothing activated) with the lab's inventory. The play adds only what is the lab's, not the examples':
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


def test_the_attesting_examples_run_as_printed(lab, tmp_path):
    _lab, inv = lab
    tasks = [task for rel, count in EXAMPLES for task in _example_tasks(rel, count)]
    play = {"name": "The examples", "hosts": "coordinators:nodes", "gather_facts": False,
            "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
            "module_defaults": {"group/constellation.cluster.attestation": {"netns": "{{ constellation_atls_netns }}"}},
            "tasks": tasks}
    playbook = tmp_path / "examples.yml"
    playbook.write_text(yaml.safe_dump([play], sort_keys=False))
    run = run_playbook(playbook, str(inv / "hosts.yml"), tmp_path / "runs")
    assert run.ok, run.stdout[-4000:]
    for host in ("h1", "h2"):
        results = run.results(host)
        assert not results["Attest the coordinator before anything is sent to it"].get("failed"), results
        peer = results["Attest a peer and read its state"]
        assert not peer.get("failed") and peer.get("state"), peer
        assert "What is wrong with it (an empty list when nothing is)" in results, sorted(results)
