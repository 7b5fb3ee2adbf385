# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rooms stay what docs/architecture.md says (each room imports only what it may; the Core knows no
Ansible, transport or agent), and no file grows past the safety cap."""

from __future__ import annotations

import ast
from pathlib import Path

from ansible_collections.constellation.cluster.tests.support import citations

ROOT = Path(__file__).resolve().parents[2]
MODULE_UTILS = ROOT / "plugins" / "module_utils"
RPC = "ansible_collections.constellation.cluster.plugins.module_utils.rpc"
# The agent (wiring, daemon, config, the servers' handlers) is the composition root: it wires the Core to the RPC servers.
MAY_IMPORT_RPC = ("agent/", "rpc/")
# A module holds one concern (docs/architecture.md, "One concern per module"); its length is no rule. This cap is
# only a safety net against a file that grew several concerns unnoticed.
MAX_LINES = 800


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


def test_no_product_file_is_over_the_safety_cap():
    long_files = sorted(path.relative_to(ROOT).as_posix() for path in (ROOT / "plugins").rglob("*.py")
                        if len(path.read_text().splitlines()) > MAX_LINES)
    assert not long_files, "over %d lines, split by concern (docs/architecture.md): %s" % (MAX_LINES, long_files)


# The Core knows no transport (atls, rpc), no agent and no kubeadm adapter: they come in as ports.
CORE_MUST_NOT_IMPORT = tuple("ansible_collections.constellation.cluster.plugins.module_utils." + room
                             for room in ("atls", "rpc", "agent", "kubeadm"))


def test_the_core_imports_no_transport_and_is_composed_not_a_mixin_tower():
    offenders = []
    for path in sorted((MODULE_UTILS / "core").rglob("*.py")):
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
LIBRARIES = {"attestation", "kms", "wireguard", "kubeadm", "disk", "atls", "pod_network"}
MODULE_UTILS_ROOMS = FOUNDATION | LIBRARIES | {"store", "core", "rpc", "agent", "controller_options", "verify_problems"}
_BELOW_CORE = {"foundation"} | {"mu." + name for name in ("attestation", "kms", "wireguard", "disk", "store", "pod_network")}
_ALL_MODULE_UTILS = {"foundation"} | {"mu." + name for name in MODULE_UTILS_ROOMS - FOUNDATION}
_CONTROLLER = _ALL_MODULE_UTILS - {"mu.agent"}
# What each room may import (docs/architecture.md says why); a room always imports itself.
MAY_IMPORT = {
    "foundation": set(),
    **{"mu." + name: {"foundation"} for name in LIBRARIES | {"controller_options", "verify_problems"}},
    "mu.atls": {"foundation", "mu.attestation"},
    "mu.pod_network": {"foundation", "mu.wireguard"},
    "mu.store": {"foundation", "mu.attestation", "mu.kms", "mu.wireguard", "mu.disk"},
    "mu.core": _BELOW_CORE,
    "mu.rpc": {"foundation", "mu.atls", "mu.attestation", "mu.wireguard"},
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
    ("plugins.filter", "plugins.plugin_utils.launch_measurement"): "sev-snp-measure is a controller-only package",
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


def _imported_files(rel: str, path: Path):
    """(dotted name, file of this repository it names) of each import in ``path``, a function's body included."""
    package = Path(rel).parent.parts
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package[:len(package) - node.level + 1]
                module = ".".join(base + ((module,) if module else ()))
            names = [module] + ["%s.%s" % (module, alias.name) for alias in node.names]
        else:
            continue
        for name in names:
            parts = (name[len(PKG):] if name.startswith(PKG) else name).split(".")
            target = ROOT.joinpath(*parts).with_suffix(".py")
            if parts[0] in ("tests", "bench") and target.is_file():
                yield name, target.relative_to(ROOT).as_posix()


def test_tests_share_helpers_only_through_the_kit_and_conftest():
    """A test module is no library: what several test modules share lives in the kit (tests/support/) or a
    conftest.py. A helper module inside a room of the unit tests (tests/unit/<room>/) serves that room only."""
    offenders = []
    for rel, path in _python_files():
        if not rel.startswith(("tests/", "bench/")):
            continue
        for name, target in _imported_files(rel, path):
            if target == rel:
                continue
            if Path(target).name.startswith("test_"):
                offenders.append("%s imports the test module %s" % (rel, name))
            parts = target.split("/")
            if parts[:2] == ["tests", "unit"] and len(parts) > 3 and not rel.startswith("/".join(parts[:3]) + "/"):
                offenders.append("%s imports %s, a helper of the room %s" % (rel, name, "/".join(parts[:3])))
    assert not offenders, offenders


def _takes_the_attestation_options(names) -> bool:
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import ATTESTATION_ARGUMENT_SPEC

    return set(ATTESTATION_ARGUMENT_SPEC) <= set(names)


def _plugins_taking_the_attestation_options():
    """{name: why} of every action plugin and module that takes the shared attestation options."""
    import importlib

    found = {}
    for path in sorted((ROOT / "plugins" / "action").glob("*.py")):
        action = importlib.import_module(PKG + "plugins.action." + path.stem).ActionModule
        if _takes_the_attestation_options(getattr(action, "_VALID_ARGS", ())):
            found[path.stem] = "plugins/action/%s.py's _VALID_ARGS" % path.stem
    for path in sorted((ROOT / "plugins" / "modules").glob("*.py")):
        if path.stem in found:
            continue
        if any(isinstance(node, ast.Name) and node.id == "ATTESTATION_ARGUMENT_SPEC" for node in ast.walk(ast.parse(path.read_text()))):
            found[path.stem] = "plugins/modules/%s.py's argument_spec" % path.stem
    return found


def test_every_plugin_that_takes_the_attestation_options_is_in_the_action_group():
    """The rule: a plugin takes the shared attestation options when the arguments it accepts include every option
    of attestation/policy.py's ATTESTATION_ARGUMENT_SPEC. For an action plugin that is its ActionModule's
    ``_VALID_ARGS`` (what Ansible passes through to it: every ClusterAction, and verify_attestation); for a module
    without an action plugin, its argument_spec built from ATTESTATION_ARGUMENT_SPEC (constellation_verify).
    Every such plugin is in meta/runtime.yml's ``action_groups.attestation``, so a play's ``module_defaults`` for
    ``group/constellation.cluster.attestation`` (playbooks/vars/attestation_defaults.yml) reaches it, and the group
    lists nothing else."""
    import yaml

    group = yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text())["action_groups"]["attestation"]
    takers = _plugins_taking_the_attestation_options()
    missing = sorted("%s (%s)" % (name, why) for name, why in takers.items() if name not in group)
    assert not missing, "not in meta/runtime.yml's action_groups.attestation: %s" % missing
    extra = sorted(set(group) - set(takers))
    assert not extra, "in action_groups.attestation but taking no attestation options: %s" % extra
    assert len(group) == len(set(group)), "listed twice: %s" % sorted({n for n in group if group.count(n) > 1})
    assert "activate_nodes" in takers and "master_secret" not in takers  # the rule sees both kinds


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


# ------------------------------------------------------------------ authentication is the server's alone

# What the server checks before a handler runs (rpc/access.py over the PeerView, agent/peer_view.py): a handler
# calling one of these, or reading what AdminAuth or PeerAuth proved from the connection instead of from the
# authenticated caller the server hands it (``conn.caller``), keeps a second copy of a method's caller rule.
SERVER_CHECKS = {"authorise", "check_peer", "check_verified", "check_control_plane", "check_not_evicted",
                 "require_not_evicted", "require_verified", "require_designated_control_plane", "vpn_peer_record",
                 "is_evicted", "is_unverified", "is_designated_control_plane"}
CONNECTION_PROOFS = {"admin", "coordinator", "authenticated_peer", "vpn_peer_pub_key"}


def _handler_methods(cls: ast.ClassDef):
    """The methods of a handler class (it has ``handlers()`` returning ``{name: self.method}``) that serve a
    request: the handlers and every ``self._helper`` they call, transitively."""
    methods = {node.name: node for node in cls.body if isinstance(node, ast.FunctionDef)}
    listed = methods.get("handlers")
    if listed is None:
        return []
    todo = [node.attr for node in ast.walk(listed)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"]
    seen = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in methods:
            continue
        seen.add(name)
        todo.extend(node.func.attr for node in ast.walk(methods[name]) if isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "self")
    return [methods[name] for name in sorted(seen)]


def test_no_handler_checks_what_the_schema_declares():
    offenders = []
    for path in sorted((MODULE_UTILS / "agent").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for cls in (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)):
            for method in _handler_methods(cls):
                for node in ast.walk(method):
                    called = node.func.attr if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        else node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else None
                    if called in SERVER_CHECKS:
                        offenders.append("%s:%d %s.%s calls %s" % (rel, node.lineno, cls.name, method.name, called))
                    if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and node.attr in CONNECTION_PROOFS
                            and isinstance(node.value, ast.Name) and node.value.id == "conn"):
                        offenders.append("%s:%d %s.%s reads conn.%s (the server hands conn.caller)"
                                         % (rel, node.lineno, cls.name, method.name, node.attr))
    assert not offenders, offenders


class _View:
    """A PeerView that admits (``admit``) or refuses every check, in the state a declaration is served in."""

    def __init__(self, state: str, admit: bool):
        self._state, self._admit = state, admit

    def state(self):
        return self._state

    def admin_key_pinned(self):
        return True

    def _check(self, method, *_args):
        from ansible_collections.constellation.cluster.plugins.module_utils.errors import AccessDenied

        if not self._admit:
            raise AccessDenied("%s: refused by the view" % method)

    check_not_evicted = check_peer = check_verified = check_control_plane = _check


def test_every_method_declares_a_caller_rule_the_server_enforces():
    """Each declaration's caller rule is one the server knows: it admits a caller that proved everything and
    refuses one that proved nothing (unless the rule is open to anyone, the init proof being the Core's)."""
    from types import SimpleNamespace

    from ansible_collections.constellation.cluster.plugins.module_utils.errors import AccessDenied
    from ansible_collections.constellation.cluster.plugins.module_utils.rpc import access, schema

    open_rules = (access.CALLER_ANYONE, access.CALLER_INIT_SECRET)
    wrong = []
    for name, method in sorted(schema.METHODS.items()):
        declared = method.access
        if declared.caller not in access.CALLERS or declared.served not in access.SERVED:
            wrong.append("%s: %s, %s" % (name, declared.caller, declared.served))
            continue
        state = "AcceptingInit" if declared.served == access.SERVED_ACCEPTING_INIT else "ActivatingNodes"
        proven = SimpleNamespace(peer_ip="10.118.0.2", admin=True, coordinator=True, authenticated_peer=True,
                                 vpn_peer_pub_key="key")
        caller = access.authorise(name, declared, proven, _View(state, True))
        if caller.peer_ip != "10.118.0.2" or (declared.caller in access.PEER_CALLERS and caller.vpn_pub_key != "key"):
            wrong.append("%s: the handler would not get the authenticated caller (%r)" % (name, caller))
        stranger = SimpleNamespace(peer_ip="10.118.0.3", admin=False, coordinator=False, authenticated_peer=False)
        try:
            access.authorise(name, declared, stranger, _View(state, False))
        except AccessDenied:
            if declared.caller in open_rules:
                wrong.append("%s: %s refused a stranger" % (name, declared.caller))
        else:
            if declared.caller not in open_rules:
                wrong.append("%s: %s let a stranger through" % (name, declared.caller))
    assert not wrong, wrong


# ---------------------------------------------------------------------------------------------- citations
def test_every_cited_path_exists_and_nothing_cites_what_the_repository_lacks():
    """The repository is self-contained. In every text file we keep (not what .gitignore ignores; the changelog
    excepted, it is history by design):

    * no text names the upstream spec or the design notes, by file or by section (neither is in the
      repository: cite the doc under docs/ that states the fact), and none says "issue" followed by a number
      (history goes to the changelog; docs/bench.md, a log of measurements named by the code they measured,
      excepted);
    * every path cited in prose - all of a .md/.rst/.txt document, the comments and docstrings of a .py file,
      the ``#`` comments of any other file - names a file or folder that exists. A cited path is a relative path
      with at least one folder whose file name ends in .py, .md, .rst, .yml, .yaml or .sh, not preceded by
      ``/``, ``~``, ``$``, ``<``, ``{``, ``}``, ``-``, ``.`` or a word character (so absolute paths, URLs,
      templates and placeholders are not citations). It is resolved against the repository root,
      plugins/module_utils (the modules' relative form, ``core/status.py``), plugins/, playbooks/, the citing
      file's folder and a role's folder: the bases in which its first folder exists. In none of them, it is
      not a path of ours (an operator's ``group_vars/all.yml``, Kubernetes' ``manifests/``); in one of them,
      it must name an existing file or folder there, or lie in a folder .gitignore names (generated, such as
      the lab's inventory) or in an inventory under inventories/ other than the ones kept (an operator's).
      A bare upper-case document name (``README.md``) must exist at the root or beside the citing file;
    * a cited section, ``docs/<name>.md, "Title"`` (comma optional), names the beginning of a Markdown heading or of
      a paragraph's bold lead-in of that document (backticks ignored).

    Whatever the files are named, the rules hold.
    """
    unknown_notes, issue_numbers, missing = [], [], []
    ignored = citations.ignored_folders(ROOT)
    for path, rel in citations.repository_text_files(ROOT):
        if rel.startswith(citations.HISTORY):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if citations.UPSTREAM_NOTES.search(line):
                unknown_notes.append("%s:%d: %s" % (rel, number, line.strip()[:120]))
            if citations.ISSUE_NUMBER.search(line) and rel not in citations.MEASUREMENT_LOG:
                issue_numbers.append("%s:%d: %s" % (rel, number, line.strip()[:120]))
        for prose in citations.prose(path, rel):
            for cited in citations.CITED_PATH.findall(prose):
                if citations.cited_path_missing(ROOT, cited, rel, ignored):
                    missing.append("%s cites %s" % (rel, cited))
            for cited in citations.BARE_DOCUMENT.findall(prose):
                if not (ROOT / cited).exists() and not ((ROOT / rel).parent / cited).exists():
                    missing.append("%s cites %s" % (rel, cited))
            for doc, title in citations.CITED_SECTION.findall(prose):
                if citations.cited_section_missing(ROOT, doc, title, rel):
                    missing.append('%s cites %s, "%s"' % (rel, doc, title))
    problems = (["cites a file the repository does not contain: " + line for line in unknown_notes]
                + ["narrates history (say why, not which issue): " + line for line in issue_numbers]
                + ["cites a path that does not exist: " + line for line in sorted(set(missing))])
    assert not problems, "\n".join(problems)
