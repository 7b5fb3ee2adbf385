# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The steps of a Kubernetes upgrade (module kubeadm_upgrade): read the cluster (``roll.py``) and the host
(its kube-apiserver static pod, ``kubeadm version``), ask the rules (``upgrade.py``) and run kubeadm through the
command seam (``command.py``) only when something must change. Check mode reads and predicts, and runs no
kubeadm command that changes anything."""

from __future__ import annotations

import os
from typing import Optional

from ansible_collections.constellation.cluster.plugins.module_utils.errors import StateError
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.command import Kubeadm
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.roll import read_cluster_versions, read_node_versions
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.upgrade import (
    RULE_DOWNGRADE,
    Refusal,
    UpgradeRefused,
    Version,
    check_kubeadm_version,
    check_node_step,
    parse_upgrade_plan,
    plan_upgrade,
)
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.validate import validate_node_name

try:
    import yaml
except ImportError:  # pragma: no cover - the kubeadm modules require PyYAML
    yaml = None


def local_control_plane_version(kubernetes_dir: str) -> Optional[Version]:
    """The version of this host's kube-apiserver static pod (its image tag); None on a worker."""
    path = os.path.join(kubernetes_dir, "manifests", "kube-apiserver.yaml")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as handle:
        pod = yaml.safe_load(handle) or {}
    containers = ((pod.get("spec") or {}).get("containers") or []) if isinstance(pod, dict) else []
    image = next((c.get("image") for c in containers if isinstance(c, dict) and c.get("name") == "kube-apiserver"), None)
    version = Version.from_image(image) if image else None
    if version is None:
        raise StateError("%s: the kube-apiserver image %r carries no version tag" % (path, image))
    return version


def _check_kubeadm(cli: Kubeadm, node: str, target: Version) -> None:
    refusals = check_kubeadm_version(node, Version.parse(cli.version(), "kubeadm version"), target)
    if refusals:
        raise UpgradeRefused(refusals)


def step_plan(cli: Kubeadm, target: Version, kubeconfig: str, node_name: Optional[str],
              first_control_plane: Optional[str]) -> dict:
    plan = plan_upgrade(read_cluster_versions(kubeconfig), target, first_control_plane)
    result = dict(plan.as_dict(), changed=False, node=None, kubeadm_plan=[])
    first = plan.node(first_control_plane) if first_control_plane else None
    if first is not None and "control-plane" in first.needs(target):
        result["kubeadm_plan"] = [c.as_dict() for c in parse_upgrade_plan(cli.upgrade_plan(str(target)))]
    if node_name:
        refusals = check_node_step(plan, node_name, first_control_plane)
        if refusals:
            raise UpgradeRefused(refusals)
        result["node"] = plan.node(node_name).as_dict(target)
    return result


def step_apply(cli: Kubeadm, target: Version, kubeconfig: str, node_name: Optional[str], check_mode: bool) -> dict:
    local = local_control_plane_version(cli.kubernetes_dir)
    if local is None:
        raise StateError("kubeadm upgrade apply runs on the first control plane: %s has no kube-apiserver static pod "
                         "(manifests/kube-apiserver.yaml)" % cli.kubernetes_dir)
    plan_upgrade(read_cluster_versions(kubeconfig), target)  # the skew rules, before anything changes
    result = {"changed": local != target, "control_plane": True, "from_version": str(local),
              "to_version": str(target), "command": None}
    if local == target:
        return result
    if local > target:
        raise UpgradeRefused([_downgrade(node_name or "this control plane", local, target)])
    _check_kubeadm(cli, node_name or "this control plane", target)
    result["command"] = ["kubeadm", "upgrade", "apply", str(target), "--yes"]
    if check_mode:
        return result
    cli.upgrade_apply(str(target))
    after = local_control_plane_version(cli.kubernetes_dir)
    if after != target:
        raise StateError("kubeadm upgrade apply %s left the kube-apiserver at %s" % (target, after))
    return result


def step_node(cli: Kubeadm, target: Version, kubeconfig: Optional[str], node_name: str, check_mode: bool) -> dict:
    validate_node_name(node_name, "node_name")
    local = local_control_plane_version(cli.kubernetes_dir)
    control_plane = local is not None
    if control_plane:
        found = local
    else:
        record = read_node_versions(kubeconfig or os.path.join(cli.kubernetes_dir, "kubelet.conf"), node_name)
        if record is None:
            raise StateError("node_name: the API server lists no Node %s (is this the name kubeadm registered?)"
                             % node_name)
        found = record.kubelet_version
        if found is not None and found > target:
            raise UpgradeRefused([_downgrade(node_name, found, target)])
    result = {"changed": found != target, "control_plane": control_plane, "from_version": str(found) if found else None,
              "to_version": str(target), "command": None}
    if found == target:
        return result
    if control_plane and found > target:
        raise UpgradeRefused([_downgrade(node_name, found, target)])
    _check_kubeadm(cli, node_name, target)
    result["command"] = ["kubeadm", "upgrade", "node"]
    if check_mode:
        return result
    cli.upgrade_node(control_plane)
    if control_plane:
        after = local_control_plane_version(cli.kubernetes_dir)
        if after != target:
            raise StateError("kubeadm upgrade node left the control plane of %s at %s, the cluster is not at %s yet: "
                             "run kubeadm upgrade apply on the first control plane first (apply-first)"
                             % (node_name, after, target))
    return result


def _downgrade(node_name: str, found: Version, target: Version) -> Refusal:
    return Refusal(node_name, str(found), str(target), RULE_DOWNGRADE)


def run_step(step: str, kubernetes_version: str, kubernetes_dir: str, kubeadm_path: Optional[str] = None,
             kubeconfig: Optional[str] = None, node_name: Optional[str] = None,
             first_control_plane: Optional[str] = None, check_mode: bool = False, runner=None) -> dict:
    """One step of module kubeadm_upgrade: ``plan``, ``apply`` or ``node``."""
    target = Version.parse(kubernetes_version)
    if node_name is not None:
        validate_node_name(node_name, "node_name")
    if first_control_plane is not None:
        validate_node_name(first_control_plane, "first_control_plane")
    cli = Kubeadm(kubeadm_path, kubernetes_dir, runner=runner) if runner else Kubeadm(kubeadm_path, kubernetes_dir)
    admin = kubeconfig or cli.admin_kubeconfig_path
    if step == "plan":
        return step_plan(cli, target, admin, node_name, first_control_plane)
    if step == "apply":
        return step_apply(cli, target, admin, node_name, check_mode)
    if step == "node":
        return step_node(cli, target, kubeconfig, node_name, check_mode)
    raise StateError("step: expected plan, apply or node, got %r" % step)
