# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""verify.yml's table is readable whatever Ansible's configuration: its task (taken from playbooks/verify.yml as it
is) runs in a small playbook beside playbooks/templates/ with the default stdout callback, once with Ansible's own
defaults (result_format json: no repository ansible.cfg, as for an installed collection) and once with the result
format yaml the repository's ansible.cfg sets. Either way every line of the table is a line of the output, and no
line break is printed escaped (``\\n`` inside one JSON string)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
VENV_BIN = ROOT / ".venv" / "bin"
TASK = "Peer x PCR, expected, found, verdict, state; then every problem"
ROW = {"endpoint": "192.0.2.1:9000", "state": "IsNode", "membership": "ours", "state_disk": {"encrypted": False},
       "deployment_mode": "host", "host_root_trusted": False,
       "pcrs": [{"index": 4, "expected": "ab" * 32, "found": "ab" * 32, "ok": True, "warn_only": False},
                {"index": 13, "expected": "cd" * 32, "found": "ef" * 32, "ok": False, "warn_only": False}]}


def _verify_table_task():
    for play in yaml.safe_load((ROOT / "playbooks" / "verify.yml").read_text()):
        for task in play.get("tasks") or ():
            if task.get("name") == TASK:
                return task
    raise AssertionError("playbooks/verify.yml has no task %r" % TASK)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A playbook running verify.yml's table task for one peer with one problem, beside the real templates."""
    root = tmp_path_factory.mktemp("verify_table")
    (root / "templates").symlink_to(ROOT / "playbooks" / "templates")
    play = {"name": "The table", "hosts": "h1", "gather_facts": False, "vars": {"verify_peers": ["h1"]},
            "tasks": [_verify_table_task()]}
    (root / "table.yml").write_text(yaml.safe_dump([play], sort_keys=False))
    (root / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"h1": {
        "ansible_connection": "local", "constellation_peer": ROW,
        "constellation_problems": ["h1: PCR 13: found efefefefef.., wanted cdcdcdcdcd.."]}}}}))
    (root / "ansible.cfg").write_text("[defaults]\n")  # Ansible's own defaults, not the repository's
    return root


def _run(project, **env):
    environment = {key: value for key, value in os.environ.items() if not key.startswith("ANSIBLE_")}
    environment.update(ANSIBLE_CONFIG=str(project / "ansible.cfg"), ANSIBLE_STDOUT_CALLBACK="default",
                       ANSIBLE_NOCOLOR="1", ANSIBLE_LOCAL_TEMP=str(project / "tmp"), **env)
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", "hosts.yml", "table.yml"], cwd=project,
                          env=environment, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _table_lines(stdout):
    """The table's lines as printed: the header, the peer's rows, the problems."""
    lines = stdout.splitlines()
    header = [line for line in lines if "peer" in line and "endpoint" in line and "verdict" in line]
    rows = [line for line in lines if "192.0.2.1:9000" in line]
    problems = [line for line in lines if "1 problem:" in line or "h1: PCR 13: found" in line]
    return header, rows, problems


@pytest.mark.parametrize("result_format", [None, "json", "yaml"])
def test_the_table_prints_one_line_per_line_with_the_default_callback(project, result_format):
    stdout = _run(project, **({"ANSIBLE_CALLBACK_RESULT_FORMAT": result_format} if result_format else {}))
    assert "\\n" not in stdout, stdout
    header, rows, problems = _table_lines(stdout)
    assert len(header) == 1 and len(rows) == 2 and len(problems) == 2, stdout
    assert any(" 4 " in row and " yes " in row for row in rows), rows
    assert any(" 13 " in row and " NO " in row for row in rows), rows
