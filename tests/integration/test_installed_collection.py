# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a user of the released collection runs: the built tarball, installed into another project,
with a Python environment that holds only ansible-core and the declared requirements
(``requirements.txt``), runs ``site.yml`` against a lab and converges; a second run changes nothing.

Nothing of the checkout is on the path: not its ``ansible.cfg``, not its ``collections/`` link, not its
virtual environment (the new one is made with ``python3 -m venv`` and ``pip install``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from lab.lab import Lab
from tests.support import ROOT

pytestmark = [pytest.mark.lab, pytest.mark.slow]

VENV_BIN = ROOT / ".venv" / "bin"


def _ansible_core_pin() -> str:
    """The ansible-core version pyproject.toml pins (what make test runs with)."""
    match = re.search(r'"ansible-core==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert match, "pyproject.toml pins ansible-core"
    return "ansible-core==%s" % match.group(1)


def _run(argv, **kw):
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 900)
    return subprocess.run(argv, check=False, **kw)


def recap(output: str):
    rows = {}
    for match in re.finditer(r"^(\S+)\s+:\s+((?:\w+=\d+\s*)+)$", output, re.M):
        rows[match.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group(2))}
    return rows


@pytest.fixture(scope="module")
def user_project(tmp_path_factory):
    """A project of a collection user: its own venv (ansible-core + requirements.txt), the tarball
    installed into its collections path, its own ansible.cfg."""
    base = tmp_path_factory.mktemp("user")
    build = _run(["sh", str(ROOT / "scripts" / "build-collection.sh"), str(base)], cwd=ROOT)
    assert build.returncode == 0, build.stdout + build.stderr
    tarball = next(base.glob("constellation-cluster-*.tar.gz"))
    venv = base / "venv"
    made = _run([sys.executable, "-m", "venv", str(venv)])
    assert made.returncode == 0, made.stderr
    pip = _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", _ansible_core_pin(),
                "-r", str(ROOT / "requirements.txt")])
    assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-2000:]
    project = base / "project"
    collections = project / "collections"
    project.mkdir()
    (project / "ansible.cfg").write_text("[defaults]\ncollections_path = %s\nhost_key_checking = False\n"
                                         "retry_files_enabled = False\n" % collections)
    env = {"PATH": "%s:/usr/sbin:/usr/bin:/sbin:/bin" % (venv / "bin"), "HOME": os.environ.get("HOME", "/root"),
           "ANSIBLE_CONFIG": str(project / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1", "LANG": "C.UTF-8"}
    # --no-deps: galaxy.yml's dependencies (kubernetes.core, community.crypto, community.general) come from Galaxy,
    # which this machine cannot reach; the lab's site.yml (constellation_kubernetes false) uses none of them.
    installed = _run([str(venv / "bin" / "ansible-galaxy"), "collection", "install", "--offline", "--no-deps",
                      str(tarball), "-p", str(collections)], cwd=project, env=env)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return {"venv": venv, "project": project, "env": env,
            "collection": collections / "ansible_collections" / "constellation" / "cluster"}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    inv = tmp_path_factory.mktemp("user-inventory")
    lab = Lab("tinst", inventory_dir=inv)
    lab.up(hosts=3, tpm=True, agents=True)
    try:
        yield lab, inv
    finally:
        lab.down()


def test_installed_tarball_runs_site_yml_with_only_the_declared_requirements(user_project, lab):
    the_lab, inv = lab
    venv, project, env = user_project["venv"], user_project["project"], user_project["env"]
    # The user's environment has none of the checkout's development packages.
    probe = _run([str(venv / "bin" / "python"), "-c", "import importlib.util as u; "
                  "print([m for m in ('molecule', 'ansible_runner', 'pytest', 'lab') if u.find_spec(m)])"],
                 cwd=project, env=env)
    assert probe.stdout.strip() == "[]", probe.stdout + probe.stderr
    site = user_project["collection"] / "site.yml"
    argv = [str(venv / "bin" / "ansible-playbook"), "-i", str(inv / "hosts.yml"), str(site),
            "--vault-password-file", str(inv / "vault_pass"),
            "-e", "ansible_python_interpreter=%s" % (venv / "bin" / "python")]
    first = _run(argv, cwd=project, env=env)
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-2000:]
    rows = recap(first.stdout)
    assert set(rows) == {"h1", "h2", "h3"} and all(r["failed"] == 0 and r["unreachable"] == 0 for r in rows.values())
    assert all(rows[h]["changed"] >= 1 for h in ("h1", "h2", "h3")), rows  # each peer activated, credited to it
    assert "Coordinator %s activated" % the_lab.host("h1").public_endpoint in first.stdout
    second = _run(argv, cwd=project, env=env)
    assert second.returncode == 0, second.stdout[-6000:]
    assert all(r["changed"] == 0 and r["failed"] == 0 for r in recap(second.stdout).values()), second.stdout[-3000:]
