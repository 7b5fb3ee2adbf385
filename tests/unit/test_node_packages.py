# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a node needs (docs/agent.md, "What a node needs"): every package the agent's code imports is a Debian 12
package that the node_agent role installs and scripts/setup.sh installs here, and Debian's Python imports it."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"
# Each top-level package the agent's code imports -> the Debian package that provides it.
DEBIAN_PACKAGE = {
    "cryptography": "python3-cryptography",
    "yaml": "python3-yaml",
    "tpm2_pytss": "python3-tpm2-pytss",
    "grpc": "python3-grpcio",
    "google": "python3-protobuf",
    "etcd3gw": "python3-etcd3gw",
    "kubernetes": "python3-kubernetes",
    "urllib3": "python3-kubernetes",  # the kubernetes client's HTTP library, its dependency
}


def _imported_packages():
    """The third-party top-level packages imported anywhere in the code the role installs (module_utils)."""
    found = set()
    for path in (ROOT / "plugins" / "module_utils").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            found |= {name.split(".")[0] for name in names}
    return sorted(found - set(sys.stdlib_module_names) - {"ansible_collections", "__future__"})


def _role_packages():
    defaults = yaml.safe_load((ROOT / "roles" / "node_agent" / "defaults" / "main.yml").read_text())
    return {package for name, value in defaults.items() if name.endswith("_packages") and isinstance(value, list)
            for package in value}


def _setup_packages():
    text = (ROOT / "scripts" / "setup.sh").read_text()
    return set(re.search(r'^AGENT_PACKAGES="([^"]*)"', text, re.M).group(1).split())


def test_every_package_the_agent_imports_is_a_debian_package_of_the_role_and_of_setup():
    imported = _imported_packages()
    unknown = [name for name in imported if name not in DEBIAN_PACKAGE]
    assert not unknown, "the agent's code imports %s: add its Debian 12 package to the node_agent role" % unknown
    needed = {DEBIAN_PACKAGE[name] for name in imported}
    assert needed <= _role_packages(), needed - _role_packages()
    assert needed == _setup_packages(), needed ^ _setup_packages()


def test_debians_python_imports_each_of_them_from_debians_packages():
    if not os.path.exists(SYSTEM_PYTHON):
        pytest.skip("no %s (make setup installs Debian's packages)" % SYSTEM_PYTHON)
    probe = ("import importlib, json, sys\n"
             "modules = {name: importlib.import_module(name) for name in sys.argv[1:]}\n"
             "print(json.dumps({name: m.__file__ or list(m.__path__)[0] for name, m in modules.items()}))")
    proc = subprocess.run([SYSTEM_PYTHON, "-I", "-c", probe] + _imported_packages(), capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    files = yaml.safe_load(proc.stdout)
    assert all(path.startswith("/usr/lib/python3/dist-packages/") for path in files.values()), files
