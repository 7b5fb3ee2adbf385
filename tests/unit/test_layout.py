# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rooms stay what DESIGN.md says: the Core knows no Ansible and no RPC, and files stay small."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULE_UTILS = ROOT / "plugins" / "module_utils"
RPC = "ansible_collections.constellation.cluster.plugins.module_utils.rpc"
# The agent (daemon, config, the servers' handlers) is the composition root: it wires the Core to the RPC servers.
MAY_IMPORT_RPC = ("agent/", "rpc/")
# Over ~500 lines, each with its reason.
LONG_FILES = {
    "plugins/module_utils/attestation/vtpm.py": "the strict validator is one ordered procedure (DESIGN.md 4, "
                                                "steps 1-7) next to the issuer it must match byte for byte",
}


def _imports(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            for alias in node.names:
                yield "%s.%s" % (node.module, alias.name)


def test_no_module_utils_file_imports_ansible_or_the_rpc_package():
    offenders = []
    for path in sorted(MODULE_UTILS.rglob("*.py")):
        rel = path.relative_to(MODULE_UTILS).as_posix()
        for name in _imports(path):
            if name == "ansible" or name.startswith("ansible."):
                offenders.append("%s imports %s" % (rel, name))
            if name.startswith(RPC) and not rel.startswith(MAY_IMPORT_RPC):
                offenders.append("%s imports %s" % (rel, name))
    assert not offenders, offenders


def test_no_plugin_file_is_over_500_lines_without_a_reason():
    long_files = {path.relative_to(ROOT).as_posix() for path in (ROOT / "plugins").rglob("*.py")
                  if len(path.read_text().splitlines()) > 500}
    assert long_files <= set(LONG_FILES), sorted(long_files - set(LONG_FILES))


def _lab_imports():
    """lab/<module> -> the lab modules it imports (anywhere in the file, a function's body included)."""
    graph = {}
    for path in sorted((ROOT / "lab").glob("*.py")):
        name = path.stem
        deps = set()
        for imported in _imports(path):
            parts = imported.split(".")
            if parts[0] == "lab" and len(parts) > 1 and (ROOT / "lab" / (parts[1] + ".py")).exists():
                deps.add(parts[1])
        graph[name] = deps - {name}
    return graph


def test_the_lab_has_no_import_cycle_and_imports_no_test_kit():
    graph = _lab_imports()
    cycles = []

    def visit(name, path):
        for dep in sorted(graph.get(name, ())):
            if dep in path:
                cycles.append(" -> ".join(path[path.index(dep):] + [dep]))
            elif len(path) < len(graph):
                visit(dep, path + [dep])

    for start in sorted(graph):
        visit(start, [start])
    assert not cycles, sorted(set(cycles))
    kit = ["lab/%s imports %s" % (path.name, name) for path in sorted((ROOT / "lab").glob("*.py"))
           for name in _imports(path) if name == "tests" or name.startswith("tests.")]
    assert not kit, kit
