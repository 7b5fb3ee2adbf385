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
