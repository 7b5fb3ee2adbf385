# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every module's and plugin's EXAMPLES works as printed (what ``ansible-doc`` shows):

* it is YAML without a duplicated key: a list of tasks (modules, and filters shown in tasks), a mapping of
  variables (filters shown as ``vars:``) or, for the connection plugin, an inventory;
* wrapped in a playbook, ``ansible-playbook --syntax-check`` accepts it (the connection plugin's inventory is the
  inventory of that run);
* every option it gives a module of ours is one of the module's options (or aliases), every filter of ours it
  calls exists, every group it reads (``groups['coordinators']``) is a group of inventories/example, and every
  variable its templates read is defined: by Ansible (``inventory_hostname``, ``hostvars``, ...), by the example
  itself (``register``, ``set_fact``, ``vars``, ``loop``), by inventories/example, by a role's defaults or
  argument spec, by playbooks/vars/ or by the atls connection plugin's options;
* a task of an attesting module (meta/runtime.yml's ``action_groups.attestation``) gives ``ek_ca_path`` unless it
  names a variant that has no EK chain, and the connection plugin's inventory sets ``constellation_ek_ca_path``:
  the default variant, qemu-vtpm-ek, refuses to run without it; a task of a module that takes ``init_secret`` gives
  it (an agent the node_agent role installed refuses an activation or restore without its proof).

Every ``seealso`` link into a GitHub repository points at galaxy.yml's ``repository``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import jinja2
import jinja2.meta
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = ROOT / ".venv" / "bin"
COLLECTION = "constellation.cluster"

# What Ansible defines in every play (special variables, Jinja's and Ansible's template globals).
ANSIBLE_DEFINES = frozenset("""
    inventory_hostname inventory_hostname_short inventory_dir inventory_file playbook_dir role_path hostvars groups
    group_names ansible_host ansible_play_hosts ansible_play_batch ansible_check_mode ansible_facts omit item
    lookup query q now undef range dict lipsum cycler joiner namespace true false none True False None
""".split())
# Task keywords whose value is a bare Jinja expression.
BARE_EXPRESSIONS = ("when", "that", "failed_when", "changed_when", "until")
# Variants whose peers present no EK certificate chain (attestation/choose.py's SEV-SNP variants).
VARIANTS_WITHOUT_EK = ("sev-snp", "azure-sev-snp", "aws-sev-snp")


class _StrictLoader(yaml.SafeLoader):  # pylint: disable=too-many-ancestors
    """yaml.SafeLoader that refuses a duplicated mapping key (the last would silently win)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, "duplicated key %r" % (key,), key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _ansible_doc(plugin_type, names):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([str(VENV_BIN / "ansible-doc"), "--json", "-t", plugin_type]
                          + ["%s.%s" % (COLLECTION, name) for name in names],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return {name.split(".")[-1]: entry for name, entry in json.loads(proc.stdout).items()}


@pytest.fixture(scope="module")
def docs():
    """(plugin type, name) -> ansible-doc's JSON entry (doc fragments resolved), for every module, filter and
    connection plugin of the collection."""
    found = {}
    for plugin_type, folder, pattern in (("module", "modules", "*.py"), ("filter", "filter", "*.yml"),
                                         ("connection", "connection", "*.py")):
        names = sorted(path.stem for path in (ROOT / "plugins" / folder).glob(pattern) if path.stem != "__init__")
        for name, entry in _ansible_doc(plugin_type, names).items():
            found[(plugin_type, name)] = entry
    return found


def _option_names(doc):
    names = set()
    for name, option in (doc.get("options") or {}).items():
        names.add(name)
        names.update(option.get("aliases") or ())
    return names


def _yaml_keys(path):
    data = yaml.safe_load(path.read_text()) if path.exists() else None
    return set(data) if isinstance(data, dict) else set()


def _inventory(data):
    """(variables, groups) of an inventory in YAML form, loaded."""
    variables, groups = set(), {"all", "ungrouped"}

    def walk(group):
        variables.update((group or {}).get("vars") or {})
        for host_vars in ((group or {}).get("hosts") or {}).values():
            variables.update(host_vars or {})
        for name, child in ((group or {}).get("children") or {}).items():
            groups.add(name)
            walk(child)

    for name, group in (data or {}).items():
        groups.add(name)
        walk(group)
    return variables, groups


@pytest.fixture(scope="module")
def defined(docs):
    """(variables the collection defines, groups of inventories/example)."""
    inventory = ROOT / "inventories" / "example"
    variables, groups = _inventory(yaml.safe_load((inventory / "hosts.yml").read_text()))
    for path in sorted(inventory.glob("*_vars/**/*.yml")):
        variables |= _yaml_keys(path)
    for role in sorted((ROOT / "roles").iterdir()):
        variables |= _yaml_keys(role / "defaults" / "main.yml")
        specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text()) if \
            (role / "meta" / "argument_specs.yml").exists() else {}
        for spec in ((specs or {}).get("argument_specs") or {}).values():
            variables |= set(spec.get("options") or {})
    for path in sorted((ROOT / "playbooks" / "vars").glob("*.yml")):
        variables |= _yaml_keys(path)
    for option in docs[("connection", "atls")]["doc"]["options"].values():
        variables |= {var["name"] for var in option.get("vars") or ()}
    return variables, groups


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _templates(task):
    """Every Jinja source a task evaluates: its templated strings and its bare expressions."""
    for key, value in task.items():
        if key in BARE_EXPRESSIONS:
            for expression in value if isinstance(value, list) else [value]:
                yield "{{ %s }}" % expression
        else:
            yield from (text for text in _strings(value) if "{{" in text or "{%" in text)


def _action(task):
    actions = [key for key in task if "." in key]
    assert len(actions) == 1, "a task names one module by its FQCN, found %s" % actions
    return actions[0]


class _AnyName(dict):
    """Jinja's filter and test tables for the parse: every name is known there (the filters of ours are checked
    by name below; Ansible's own are Ansible's)."""

    def __contains__(self, name):
        return True

    def get(self, name, default=None):
        return super().get(name, _any_filter)


def _any_filter(value, *args, **kwargs):  # pylint: disable=unused-argument
    return value


class _Check:
    """The variable, filter and group rules for one example; ``problems`` collects what breaks them."""

    def __init__(self, where, defined, filters):
        self.where, self.problems = where, []
        self.variables, self.groups = set(defined[0]) | ANSIBLE_DEFINES, defined[1]
        self.filters = filters
        self.environment = jinja2.Environment()
        self.environment.filters, self.environment.tests = _AnyName(), _AnyName()

    def template(self, source, local=()):
        try:
            tree = self.environment.parse(source)
        except jinja2.TemplateSyntaxError as exc:
            self.problems.append("%s: %r is not valid Jinja: %s" % (self.where, source, exc))
            return
        for name in sorted(jinja2.meta.find_undeclared_variables(tree) - self.variables - set(local)):
            self.problems.append("%s: %r reads the variable %s, which nothing defines" % (self.where, source, name))
        for node in tree.find_all(jinja2.nodes.Filter):
            if node.name.startswith(COLLECTION + ".") and node.name.split(".")[-1] not in self.filters:
                self.problems.append("%s: no filter %s" % (self.where, node.name))
        for group in re.findall(r"groups\[['\"]([^'\"]+)['\"]\]", source):
            if group not in self.groups:
                self.problems.append("%s: no group %r in inventories/example (it has %s)"
                                     % (self.where, group, sorted(self.groups)))


def _examples(docs):
    for (plugin_type, name), entry in sorted(docs.items()):
        yield plugin_type, name, entry.get("examples") or ""


def test_every_module_filter_and_connection_plugin_has_examples(docs):
    missing = ["%s %s" % (plugin_type, name) for plugin_type, name, text in _examples(docs) if not text.strip()]
    assert not missing, "no EXAMPLES: %s" % missing


def _load(check, text):
    try:
        return yaml.load(text, Loader=_StrictLoader)  # nosec B506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        check.problems.append("%s: EXAMPLES is not YAML: %s" % (check.where, exc))
    return None


def _check_tasks(check, tasks, docs, attesting):
    local = set()
    for task in tasks:
        action = _action(task)
        local |= set((task.get("vars") or {}))
        loop_var = (task.get("loop_control") or {}).get("loop_var")
        for source in _templates(task):
            check.template(source, local | ({loop_var} if loop_var else set()))
        if task.get("register"):
            local.add(task["register"])
        if action == "ansible.builtin.set_fact":
            local |= set(task[action]) - {"cacheable"}
        if not action.startswith(COLLECTION + "."):
            continue
        module = action.split(".")[-1]
        args = task[action] or {}
        unknown = sorted(set(args) - _option_names(docs[("module", module)]["doc"]))
        if unknown:
            check.problems.append("%s: %s has no option %s" % (check.where, action, unknown))
        if "init_secret" in _option_names(docs[("module", module)]["doc"]) and "init_secret" not in args:
            check.problems.append("%s: task %r gives no init_secret: an agent the node_agent role installed refuses it"
                                  % (check.where, task.get("name")))
        if module in attesting and "ek_ca_path" not in args and args.get("variant") not in VARIANTS_WITHOUT_EK:
            check.problems.append("%s: task %r attests with the default variant (qemu-vtpm-ek) but gives no ek_ca_path"
                                  % (check.where, task.get("name")))


def _wrap(plugin_type, name, data):
    """A playbook that runs the example as printed: its tasks, or its variables as a play's vars."""
    play = {"name": "%s %s's EXAMPLES" % (plugin_type, name), "hosts": "all", "gather_facts": False}
    if isinstance(data, list):
        play["tasks"] = data
    else:
        play["vars"] = data
        play["tasks"] = [{"name": "Show %s" % key, "ansible.builtin.debug": {"var": key}} for key in data]
    return [play]


def test_every_example_is_valid_names_what_exists_and_passes_the_syntax_check(docs, defined, tmp_path):
    attesting = set(yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text())["action_groups"]["attestation"])
    filters = {name for plugin_type, name in docs if plugin_type == "filter"}
    problems, playbooks, inventory = [], [], None
    for plugin_type, name, text in _examples(docs):
        check = _Check("%s %s" % (plugin_type, name), defined, filters)
        data = _load(check, text)
        if data is None:
            problems += check.problems
            continue
        if plugin_type == "connection":
            if not (isinstance(data, dict) and "all" in data):
                problems.append("connection %s's EXAMPLES: not an inventory in YAML form" % name)
                continue
            variables, _groups = _inventory(data)
            unknown = sorted(variables - check.variables)
            if unknown:
                problems.append("connection %s: the inventory sets %s, which nothing reads" % (name, unknown))
            if "constellation_ek_ca_path" not in variables:
                problems.append("connection %s: the inventory sets no constellation_ek_ca_path" % name)
            for source in (text for text in _strings(data) if "{{" in text):
                check.template(source)
            inventory = tmp_path / ("%s-inventory.yml" % name)
            inventory.write_text(text)
        elif isinstance(data, list):
            _check_tasks(check, data, docs, attesting)
        elif isinstance(data, dict):
            for source in _templates(data):
                check.template(source, set(data))
        else:
            problems.append("%s %s's EXAMPLES: neither tasks nor variables but %s" % (plugin_type, name, type(data)))
            continue
        problems += check.problems
        if plugin_type != "connection":
            path = tmp_path / ("%s-%s.yml" % (plugin_type, name))
            path.write_text(yaml.safe_dump(_wrap(plugin_type, name, data), sort_keys=False))
            playbooks.append(path)
    assert not problems, "\n".join(problems)
    assert inventory is not None, "the atls connection plugin's EXAMPLES were not seen"
    site = tmp_path / "examples.yml"
    site.write_text(yaml.safe_dump([{"ansible.builtin.import_playbook": str(path)} for path in playbooks]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_INVENTORY_UNPARSED_FAILED="1", ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"))
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), "--syntax-check", "-i", str(inventory), str(site)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_seealso_link_into_github_points_at_the_collections_repository(docs):
    repository = yaml.safe_load((ROOT / "galaxy.yml").read_text())["repository"].rstrip("/") + "/"
    wrong = []
    for (plugin_type, name), entry in sorted(docs.items()):
        for see in entry["doc"].get("seealso") or ():
            link = see.get("link") or ""
            if link.startswith("https://github.com/") and not link.startswith(repository):
                wrong.append("%s %s: %s" % (plugin_type, name, link))
    assert not wrong, "seealso links outside %s:\n%s" % (repository, "\n".join(wrong))


def test_every_module_and_plugin_reference_in_the_docs_names_one_of_ours_that_exists(docs):
    """``M(constellation.cluster.x)`` names a module and ``P(constellation.cluster.x#type)`` a plugin of that type
    (antsibull-docs refuses a filter cited as a module)."""
    plugins = set(docs)
    plugins |= {("module", path.stem) for path in (ROOT / "plugins" / "modules").glob("*.py")}
    plugins |= {(folder, path.stem) for folder in ("callback", "lookup", "inventory", "test")
                for path in (ROOT / "plugins" / folder).glob("*.py")}
    plugins |= {("role", path.name) for path in (ROOT / "roles").iterdir() if path.is_dir()}
    wrong = []
    for (plugin_type, name), entry in sorted(docs.items()):
        text = json.dumps(entry)
        for module in re.findall(r"\bM\(%s\.(\w+)\)" % re.escape(COLLECTION), text):
            if ("module", module) not in plugins:
                wrong.append("%s %s: M(%s.%s) is no module of ours" % (plugin_type, name, COLLECTION, module))
        for plugin, kind in re.findall(r"\bP\(%s\.(\w+)#(\w+)\)" % re.escape(COLLECTION), text):
            if (kind, plugin) not in plugins:
                wrong.append("%s %s: P(%s.%s#%s) names no such plugin" % (plugin_type, name, COLLECTION, plugin, kind))
    assert not wrong, "\n".join(wrong)


def _version(text):
    return tuple(int(part) for part in str(text).split("."))


def test_version_added_is_the_release_that_added_each_plugin_and_option(docs):
    """changelogs/changelog.yaml lists the plugins each release added (antsibull-changelog reads their
    ``version_added``): a listed plugin says that release. An unlisted one says galaxy.yml's version (it comes with
    the next release) or an older release (the early releases' lists are incomplete), never the newest release,
    whose list is complete. No option says a version after galaxy.yml's."""
    version = str(yaml.safe_load((ROOT / "galaxy.yml").read_text())["version"])
    releases = yaml.safe_load((ROOT / "changelogs" / "changelog.yaml").read_text())["releases"]
    listed = {}
    newest = max(releases, key=_version)
    unlisted = (set(releases) | {version}) - {newest} if version != newest else set(releases) - {newest}
    for release, entry in releases.items():
        for module in entry.get("modules") or ():
            listed[("module", module["name"])] = release
        for plugin_type, plugins in (entry.get("plugins") or {}).items():
            for plugin in plugins:
                listed[(plugin_type, plugin["name"])] = release
    wrong = []
    for (plugin_type, name), entry in sorted(docs.items()):
        added = str(entry["doc"].get("version_added"))
        expected = {listed[(plugin_type, name)]} if (plugin_type, name) in listed else unlisted
        if added not in expected:
            wrong.append("%s %s: version_added %s, expected %s" % (plugin_type, name, added, " or ".join(sorted(expected))))
        for option, spec in (entry["doc"].get("options") or {}).items():
            if spec.get("version_added") and _version(spec["version_added"]) > _version(version):
                wrong.append("%s %s: option %s added in %s, after galaxy.yml's %s"
                             % (plugin_type, name, option, spec["version_added"], version))
    assert not wrong, "\n".join(wrong)
