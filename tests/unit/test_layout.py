# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rooms stay what docs/architecture.md says (each room imports only what it may; the Core knows no
Ansible, transport or agent), and files stay small."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULE_UTILS = ROOT / "plugins" / "module_utils"
RPC = "ansible_collections.constellation.cluster.plugins.module_utils.rpc"
# The agent (wiring, daemon, config, the servers' handlers) is the composition root: it wires the Core to the RPC servers.
MAY_IMPORT_RPC = ("agent/", "rpc/")
# Over ~500 lines, each with its reason.
LONG_FILES = {
    "plugins/module_utils/attestation/vtpm.py": "the strict validator is one ordered procedure (DESIGN.md 4, "
                                                "steps 1-7) next to the issuer it must match byte for byte",
    "plugins/module_utils/rpc/schema.py": "the ONE method table: a request and an answer record per method, "
                                          "which the server, the clients, the relay and the docs read",
    "plugins/module_utils/rpc/server.py": "one server: the connection policy (admission, the handshake rate, the "
                                          "budgets, the Coordinators' room, replacement, deadlines) and the dispatch "
                                          "of each request (authorise, decode, handler) share the connection's phases",
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


# The Core knows no transport (atls, rpc), no agent and no kubeadm adapter: they come in as ports.
CORE_MUST_NOT_IMPORT = tuple("ansible_collections.constellation.cluster.plugins.module_utils." + room
                             for room in ("atls", "rpc", "agent", "kubeadm"))


def test_the_core_imports_no_transport_and_is_composed_not_a_mixin_tower():
    offenders = []
    for path in sorted((MODULE_UTILS / "core").glob("*.py")):
        rel = path.relative_to(MODULE_UTILS).as_posix()
        for name in _imports(path):
            if any(name == room or name.startswith(room + ".") for room in CORE_MUST_NOT_IMPORT):
                offenders.append("%s imports %s" % (rel, name))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(base) for base in node.bases]
                others = [b for b in bases if b not in ("object", "Protocol") and not b.endswith(".Protocol")]
                # A Protocol may refine another port (``KMS(kms_backends.KMS, Protocol)``); nothing else has two bases.
                if len(others) > 1 and "Protocol" not in bases:
                    offenders.append("%s: class %s(%s): a service holds its collaborators, it is not mixed from them"
                                     % (rel, node.name, ", ".join(bases)))
    assert not offenders, offenders


# --------------------------------------------------------------------------- rooms (docs/architecture.md)
PKG = "ansible_collections.constellation.cluster."
FOUNDATION = {"errors", "constants", "encoding", "fileutil", "command", "netns", "x509compat"}
LIBRARIES = {"attestation", "kms", "wireguard", "kubeadm", "disk", "atls", "admin_key", "init_secret"}
MODULE_UTILS_ROOMS = FOUNDATION | LIBRARIES | {"store", "core", "rpc", "agent", "controller_options", "verify_problems"}
_BELOW_CORE = {"foundation"} | {"mu." + name for name in ("attestation", "kms", "wireguard", "disk", "init_secret", "store")}
_ALL_MODULE_UTILS = {"foundation"} | {"mu." + name for name in MODULE_UTILS_ROOMS - FOUNDATION}
_CONTROLLER = _ALL_MODULE_UTILS - {"mu.agent"}
# What each room may import (docs/architecture.md says why); a room always imports itself.
MAY_IMPORT = {
    "foundation": set(),
    **{"mu." + name: {"foundation"} for name in LIBRARIES | {"controller_options", "verify_problems"}},
    "mu.atls": {"foundation", "mu.attestation"},
    "mu.store": {"foundation", "mu.attestation", "mu.kms", "mu.wireguard", "mu.disk", "mu.init_secret"},
    "mu.core": _BELOW_CORE,
    "mu.rpc": {"foundation", "mu.admin_key", "mu.atls", "mu.attestation", "mu.wireguard"},
    "mu.agent": _ALL_MODULE_UTILS,
    "plugins.plugin_utils": (_CONTROLLER - {"mu.core"}) | {"ansible"},
    "plugins.modules": _CONTROLLER | {"ansible"},
    "plugins.action": _CONTROLLER | {"plugins.plugin_utils", "ansible"},
    "plugins.filter": _CONTROLLER | {"ansible"},
    "plugins.connection": (_CONTROLLER - {"mu.core"}) | {"plugins.plugin_utils", "ansible"},
    "plugins.callback": {"ansible", "plugins.connection", "plugins.plugin_utils"},
    "plugins.doc_fragments": set(),
    "lab": _ALL_MODULE_UTILS,
    "tests.support": _ALL_MODULE_UTILS | {"lab", "ansible"},
}
# Single files of a room another room may use, each with its reason (docs/architecture.md, "The agent").
MAY_IMPORT_FILES = {
    ("plugins.filter", "plugins.module_utils.agent.config"): "agent_config_error checks an agent configuration",
    ("plugins.modules", "plugins.module_utils.agent.verify_service"): "constellation_verify is the service's client",
}


def _room_of(rel: str) -> str:
    parts = rel.split("/")
    if parts[:2] == ["plugins", "module_utils"] and len(parts) > 2:
        name = parts[2][:-3] if parts[2].endswith(".py") else parts[2]
        return "foundation" if name in FOUNDATION else "mu." + name
    if parts[0] == "plugins" and len(parts) > 1:
        return "plugins." + parts[1]
    if parts[0] == "tests" and len(parts) > 2:
        return "tests." + parts[1]
    return parts[0]


def _imported_rooms(path: Path):
    """(room, dotted name below the collection) of each import of a room of this repository."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = ["%s.%s" % (node.module, alias.name) for alias in node.names]
        else:
            continue
        for name in names:
            if name.startswith(PKG):
                yield _room_of(name[len(PKG):].replace(".", "/")), name[len(PKG):]
            elif name.split(".")[0] in ("lab", "bench", "tests", "ansible"):
                yield _room_of(name.replace(".", "/")), name


def _python_files():
    for pattern in ("plugins/**/*.py", "lab/**/*.py", "bench/*.py", "tests/**/*.py"):
        for path in sorted(ROOT.glob(pattern)):
            rel = path.relative_to(ROOT).as_posix()
            if not rel.startswith(("tests/output/",)):
                yield rel, path


def test_each_room_imports_only_what_docs_architecture_md_allows():
    offenders = []
    for rel, path in _python_files():
        room = _room_of(rel)
        for imported, name in _imported_rooms(path):
            if imported == room:
                continue
            if room in MAY_IMPORT:
                if imported in MAY_IMPORT[room] or any(room == r and name.startswith(f) for r, f in MAY_IMPORT_FILES):
                    continue
                offenders.append("%s (%s) imports %s (%s)" % (rel, room, name, imported))
            elif room == "bench" and imported.startswith("tests.") and imported != "tests.support":
                offenders.append("%s: a bench imports the test module %s" % (rel, name))
    assert not offenders, offenders


def test_nothing_imports_the_tests_or_the_benches_but_tests():
    offenders = ["%s imports %s" % (rel, name) for rel, path in _python_files() if not rel.startswith(("tests/", "bench/"))
                 for imported, name in _imported_rooms(path) if imported.startswith(("tests", "bench"))]
    assert not offenders, offenders


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
