# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The playbooks' shared attestation options live in one place, playbooks/vars/attestation_defaults.yml: every play
that gives module_defaults to the attestation action group loads that file and builds on its
``constellation_attestation_defaults``, and the default variant's name is written there once (equal to the
chooser's default, and to the node_agent role's own default, which a role used alone needs)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import ATTESTATION_ARGUMENT_SPEC

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = ROOT / "playbooks" / "vars" / "attestation_defaults.yml"
GROUP = "group/constellation.cluster.attestation"
PLAYBOOKS = [ROOT / "site.yml"] + sorted((ROOT / "playbooks").glob("*.yml"))


def _plays():
    for path in PLAYBOOKS:
        for play in yaml.safe_load(path.read_text()) or []:
            yield path, play


def test_the_shared_defaults_give_every_attestation_option_from_the_inventory():
    doc = yaml.safe_load(DEFAULTS.read_text())
    assert doc["constellation_default_attestation_variant"] == choose.DEFAULT_VARIANT
    defaults = doc["constellation_attestation_defaults"]
    assert set(defaults) <= set(ATTESTATION_ARGUMENT_SPEC), sorted(set(defaults) - set(ATTESTATION_ARGUMENT_SPEC))
    assert defaults["variant"] == \
        "{{ constellation_attestation_variant | default(constellation_default_attestation_variant) }}"


def test_every_play_with_attestation_defaults_loads_the_shared_file():
    seen = 0
    for path, play in _plays():
        module_defaults = play.get("module_defaults") or {}
        if GROUP not in module_defaults:
            continue
        seen += 1
        where = "%s, play %r" % (path.relative_to(ROOT), play.get("name"))
        value = module_defaults[GROUP]
        assert isinstance(value, str) and re.match(r"\A\{\{ constellation_attestation_defaults[ |]", value), \
            "%s: module_defaults for %s must build on constellation_attestation_defaults, got %r" % (where, GROUP, value)
        files = [(path.parent / name).resolve() for name in play.get("vars_files") or []]
        assert DEFAULTS.resolve() in files, "%s: vars_files must load %s" % (where, DEFAULTS.relative_to(ROOT))
    assert seen >= 20  # site.yml's four plays and the day-2 playbooks' plays


def test_the_default_variant_name_is_written_once_for_the_playbooks_and_roles():
    name = choose.DEFAULT_VARIANT
    literal = re.compile(r"default\(\s*['\"]%s['\"]\s*\)" % re.escape(name))
    written = []
    for path in PLAYBOOKS + sorted((ROOT / "playbooks").rglob("*.yml")) + sorted((ROOT / "roles").rglob("*.yml")):
        if literal.search(path.read_text()):
            written.append(path.relative_to(ROOT).as_posix())
    # The node_agent role, used alone (Molecule), cannot read the playbooks' vars file: its own default must agree.
    assert sorted(set(written)) == ["roles/node_agent/defaults/main.yml"], sorted(set(written))
    role_defaults = yaml.safe_load((ROOT / "roles" / "node_agent" / "defaults" / "main.yml").read_text())
    assert role_defaults["node_agent_variant"] == "{{ constellation_attestation_variant | default('%s') }}" % name


def test_the_pod_network_defaults_are_the_cores_wherever_the_inventory_variable_is_read():
    """constellation_pod_network and friends have no shared vars file (the roles are used alone too): every read of
    the inventory variable gives the same default, the Core's for the pod range and the prefix length."""
    from ansible_collections.constellation.cluster.plugins.module_utils import constants

    read = re.compile(r"\bconstellation_(pod_network|pod_network_masquerade|cluster_pod_cidr|node_pod_cidr_mask_size)"
                      r"\s*\|\s*default\(([^)]*)\)")
    defaults = {}
    for path in PLAYBOOKS + sorted((ROOT / "playbooks").rglob("*.yml")) + sorted((ROOT / "roles").rglob("*.yml")):
        for match in read.finditer(path.read_text()):
            defaults.setdefault(match.group(1), set()).add(match.group(2).strip())
    assert defaults == {
        "pod_network": {"true"},
        "pod_network_masquerade": {"true"},
        "cluster_pod_cidr": {"'%s'" % constants.CLUSTER_POD_CIDR},
        "node_pod_cidr_mask_size": {str(constants.NODE_POD_CIDR_MASK_SIZE)},
    }, defaults


def test_the_roles_apply_the_pod_network_before_kubeadm_and_tag_it_podnet():
    """The kubelet reports Ready once the conflist is there: the pod network comes before kubeadm in both roles."""
    for role, kubeadm in (("coordinator", "constellation.cluster.kubeadm_control_plane"),
                          ("node", "constellation.cluster.kubeadm_worker")):
        tasks = yaml.safe_load((ROOT / "roles" / role / "tasks" / "main.yml").read_text())
        names = [(task.get("ansible.builtin.include_role") or {}).get("name") for task in tasks]
        assert names.index("constellation.cluster.pod_network") < names.index(kubeadm), role
        task = tasks[names.index("constellation.cluster.pod_network")]
        assert task["tags"] == ["podnet"] and task["ansible.builtin.include_role"]["apply"]["tags"] == ["podnet"]
