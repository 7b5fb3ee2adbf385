# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kubernetes upgrades with kubeadm, as plain rules: versions, the version-skew policy, the order of a roll,
and the parser of ``kubeadm upgrade plan -o json``. No I/O here: the module ``kubeadm_upgrade`` reads the
cluster (``nodes.read_cluster_versions``) and the host (static pod manifests, ``kubeadm version``) and asks
these functions what may change.

The rules (Kubernetes' version skew policy and kubeadm's upgrade rules), each refusal naming the node, the
version found, the version wanted and the rule:

* ``downgrade``: no control plane and no kubelet is newer than the wanted version (kubeadm refuses downgrades);
* ``one-minor``: every control plane is at most one minor version below the wanted one (kubeadm upgrades one
  minor version at a time; a different major version is refused);
* ``kubelet-skew``: no kubelet would be more than three minor versions older than the upgraded API server;
* ``control-planes-first``: a worker's kubelet is upgraded only once every control plane (every API server)
  is at the wanted version - a kubelet is never newer than the API server;
* ``apply-first``: a further control plane runs ``kubeadm upgrade node`` only after ``kubeadm upgrade apply``
  brought the cluster (the first control plane) to the wanted version;
* ``kubeadm-version``: the kubeadm on the host is at least the wanted version (install it first).

A control plane's own kubelet follows right after its API server, as kubeadm's documented procedure does.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Iterable, List, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError

# A version as kubeadm, the kubelet and image tags print it: v1.31.1, 1.31.1, v1.31.1-rc.0, v1.31.1+k3s1.
_VERSION_RE = re.compile(r"\Av?(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)([-+][0-9A-Za-z.+-]*)?\Z")
# The kubelet may be up to three minor versions older than the API server (since v1.28).
KUBELET_MAX_MINOR_LAG = 3
PLAN_API_VERSION = "output.kubeadm.k8s.io/v1alpha3"

RULE_DOWNGRADE = "downgrade"
RULE_ONE_MINOR = "one-minor"
RULE_KUBELET_SKEW = "kubelet-skew"
RULE_CONTROL_PLANES_FIRST = "control-planes-first"
RULE_APPLY_FIRST = "apply-first"
RULE_KUBEADM_VERSION = "kubeadm-version"
_RULE_TEXT = {
    RULE_DOWNGRADE: "a downgrade is refused",
    RULE_ONE_MINOR: "one minor version at a time",
    RULE_KUBELET_SKEW: "a kubelet may be at most %d minor versions older than the API server" % KUBELET_MAX_MINOR_LAG,
    RULE_CONTROL_PLANES_FIRST: "control planes first: a kubelet is never newer than the API server",
    RULE_APPLY_FIRST: "kubeadm upgrade apply on the first control plane first",
    RULE_KUBEADM_VERSION: "kubeadm must be at least the wanted version: install it first",
}


@dataclass(frozen=True, order=True)
class Version:
    """A Kubernetes version; compared by (major, minor, patch), printed as ``vMAJOR.MINOR.PATCH``."""

    major: int
    minor: int
    patch: int

    @classmethod
    def parse(cls, value: object, field_name: str = "kubernetes_version") -> "Version":
        match = _VERSION_RE.match(value.strip()) if isinstance(value, str) else None
        if not match:
            raise InputError(field_name, "a Kubernetes version vMAJOR.MINOR.PATCH, e.g. v1.31.1", value)
        return cls(*(int(part) for part in match.groups()[:3]))

    @classmethod
    def from_image(cls, image: str) -> Optional["Version"]:
        """The version of an image reference's tag (``registry.k8s.io/kube-apiserver:v1.31.1``), or None."""
        tag = image.rsplit("@", 1)[0].rsplit("/", 1)[-1].partition(":")[2] if isinstance(image, str) else ""
        try:
            return cls.parse(tag) if tag else None
        except InputError:
            return None

    def minors_behind(self, other: "Version") -> int:
        """How many minor versions ``self`` is older than ``other`` (negative when newer); a major
        version apart counts as far apart."""
        if self.major != other.major:
            return 1000 * (other.major - self.major)
        return other.minor - self.minor

    def __str__(self) -> str:
        return "v%d.%d.%d" % (self.major, self.minor, self.patch)


class UpgradeRefused(ConstellationError):
    """The skew rules forbid the upgrade; ``refusals`` holds every reason (the message names them all)."""

    def __init__(self, refusals: List["Refusal"]):
        self.refusals = list(refusals)
        super().__init__("upgrade refused: " + "; ".join(str(r) for r in self.refusals))


@dataclass(frozen=True)
class Refusal:
    """One broken rule: the node, what was found there, what is wanted, the rule and a detail."""

    node: str
    found: str
    wanted: str
    rule: str
    detail: str = ""

    def __str__(self) -> str:
        text = "%s: found %s, wanted %s: %s (%s)" % (self.node, self.found, self.wanted, _RULE_TEXT[self.rule],
                                                     self.rule)
        return text + (": " + self.detail if self.detail else "")

    def as_dict(self) -> dict:
        return {"node": self.node, "found": self.found, "wanted": self.wanted, "rule": self.rule,
                "message": str(self)}


@dataclass
class NodeVersions:
    """One Kubernetes node: its kubelet's version and, for a control plane, its API server's version
    (the image of its kube-apiserver static pod; None when none was found)."""

    name: str
    kubelet_version: Optional[Version]
    control_plane: bool = False
    control_plane_version: Optional[Version] = None
    unschedulable: bool = False

    def needs(self, target: Version) -> List[str]:
        """What of this node is not at ``target`` yet: ``control-plane`` and/or ``kubelet``."""
        parts = []
        if self.control_plane and self.control_plane_version != target:
            parts.append("control-plane")
        if self.kubelet_version != target:
            parts.append("kubelet")
        return parts

    def as_dict(self, target: Optional[Version] = None) -> dict:
        out = {"name": self.name, "control_plane": self.control_plane,
               "control_plane_version": _str(self.control_plane_version),
               "kubelet_version": _str(self.kubelet_version), "unschedulable": self.unschedulable}
        if target is not None:
            out["upgrade"] = self.needs(target)
        return out


@dataclass
class UpgradePlan:
    """What rolling the cluster to ``target`` changes, in order: control planes first (the first one, where
    ``kubeadm upgrade apply`` runs, before the others), then the workers."""

    target: Version
    cluster_version: Optional[Version]
    nodes: List[NodeVersions]
    order: List[str] = field(default_factory=list)

    def node(self, name: str) -> Optional[NodeVersions]:
        return next((n for n in self.nodes if n.name == name), None)

    @property
    def pending(self) -> List[NodeVersions]:
        """The nodes still to upgrade, in roll order."""
        by_name = {n.name: n for n in self.nodes}
        return [by_name[name] for name in self.order if by_name[name].needs(self.target)]

    def as_dict(self) -> dict:
        return {"target": str(self.target), "cluster_version": _str(self.cluster_version),
                "nodes": [n.as_dict(self.target) for n in self.nodes], "order": list(self.order),
                "pending": [n.name for n in self.pending],
                "upgrades": [_upgrade_line(n, self.target) for n in self.pending]}


def _str(version: Optional[Version]) -> Optional[str]:
    return str(version) if version is not None else None


def _upgrade_line(node: NodeVersions, target: Version) -> dict:
    """One predicted step: which node, from which versions, to which."""
    return {"node": node.name, "role": "control-plane" if node.control_plane else "worker",
            "parts": node.needs(target), "from": _str(node.control_plane_version if node.control_plane
                                                      else node.kubelet_version),
            "kubelet_from": _str(node.kubelet_version), "to": str(target)}


def cluster_version(nodes: Iterable[NodeVersions]) -> Optional[Version]:
    """The cluster's version: its oldest API server (None without a control plane whose version is known)."""
    versions = [n.control_plane_version for n in nodes if n.control_plane and n.control_plane_version]
    return min(versions) if versions else None


def check_target(nodes: Iterable[NodeVersions], target: Version) -> List[Refusal]:
    """The cluster-wide rules for rolling to ``target``: ``downgrade``, ``one-minor``, ``kubelet-skew``."""
    nodes = list(nodes)
    refusals = []
    control_planes = [n for n in nodes if n.control_plane]
    if not control_planes:
        refusals.append(Refusal("cluster", "no control plane node", str(target), RULE_ONE_MINOR,
                                "no Node carries the label node-role.kubernetes.io/control-plane"))
    for node in control_planes:
        found = node.control_plane_version
        if found is None:
            refusals.append(Refusal(node.name, "no kube-apiserver version", str(target), RULE_ONE_MINOR,
                                    "its kube-apiserver static pod was not found"))
        elif found > target:
            refusals.append(Refusal(node.name, "API server %s" % found, str(target), RULE_DOWNGRADE))
        elif found.minors_behind(target) > 1:
            refusals.append(Refusal(node.name, "API server %s" % found, str(target), RULE_ONE_MINOR,
                                    "upgrade to v%d.%d first" % (found.major, found.minor + 1)
                                    if found.major == target.major else "a different major version"))
    for node in nodes:
        found = node.kubelet_version
        if found is None:
            continue  # a node without a reported version keeps its kubelet: nothing to compare
        if found > target:
            refusals.append(Refusal(node.name, "kubelet %s" % found, str(target), RULE_DOWNGRADE,
                                    "a kubelet must never be newer than the API server"))
        elif found.minors_behind(target) > KUBELET_MAX_MINOR_LAG:
            refusals.append(Refusal(node.name, "kubelet %s" % found, str(target), RULE_KUBELET_SKEW,
                                    "upgrade this kubelet first"))
    return refusals


def roll_order(nodes: Iterable[NodeVersions], first_control_plane: Optional[str] = None) -> List[str]:
    """Control planes first (``first_control_plane``, where apply runs, at their head), then the workers;
    by name within each group."""
    nodes = sorted(nodes, key=lambda n: n.name)
    planes = [n.name for n in nodes if n.control_plane]
    if first_control_plane in planes:
        planes.remove(first_control_plane)
        planes.insert(0, first_control_plane)
    return planes + [n.name for n in nodes if not n.control_plane]


def plan_upgrade(nodes: Iterable[NodeVersions], target: Version, first_control_plane: Optional[str] = None) -> UpgradePlan:
    """The roll to ``target``, or UpgradeRefused naming every broken rule before anything changes."""
    nodes = list(nodes)
    if first_control_plane is not None and not any(n.name == first_control_plane and n.control_plane for n in nodes):
        found = next((n for n in nodes if n.name == first_control_plane), None)
        raise UpgradeRefused([Refusal(first_control_plane, "a worker" if found else "no such Node", str(target),
                                      RULE_APPLY_FIRST, "the first control plane must be a control-plane Node")])
    refusals = check_target(nodes, target)
    if refusals:
        raise UpgradeRefused(refusals)
    return UpgradePlan(target=target, cluster_version=cluster_version(nodes), nodes=nodes,
                       order=roll_order(nodes, first_control_plane))


def check_node_step(plan: UpgradePlan, node_name: str, first_control_plane: Optional[str] = None) -> List[Refusal]:
    """The order rules for upgrading ``node_name`` now: ``apply-first`` for a further control plane,
    ``control-planes-first`` for a worker. A node with nothing to do breaks no rule."""
    node = plan.node(node_name)
    target = str(plan.target)
    if node is None:
        return [Refusal(node_name, "no such Node", target, RULE_CONTROL_PLANES_FIRST,
                        "the API server lists no Node of this name")]
    if not node.needs(plan.target):
        return []
    if node.control_plane:
        if node.name == first_control_plane:
            return []
        first = plan.node(first_control_plane) if first_control_plane else None
        if first is not None and first.control_plane_version != plan.target:
            return [Refusal(node.name, "API server %s" % _str(node.control_plane_version), target, RULE_APPLY_FIRST,
                            "the first control plane %s is at %s" % (first.name, _str(first.control_plane_version)))]
        return []
    behind = [n for n in plan.nodes if n.control_plane and n.control_plane_version != plan.target]
    if behind and "kubelet" in node.needs(plan.target):
        return [Refusal(node.name, "kubelet %s" % _str(node.kubelet_version), target, RULE_CONTROL_PLANES_FIRST,
                        "API server of %s" % ", ".join("%s at %s" % (n.name, _str(n.control_plane_version))
                                                       for n in behind))]
    return []


def check_kubeadm_version(node_name: str, kubeadm_version: Version, target: Version) -> List[Refusal]:
    """kubeadm cannot upgrade to a version newer than itself (``kubeadm-version``)."""
    if kubeadm_version < target:
        return [Refusal(node_name, "kubeadm %s" % kubeadm_version, str(target), RULE_KUBEADM_VERSION)]
    return []


# --------------------------------------------------------------------------- kubeadm upgrade plan -o json


@dataclass(frozen=True)
class PlannedComponent:
    """One row of kubeadm's plan: a component (on a node, for per-node components), from -> to."""

    name: str
    current_version: str
    new_version: str
    node_name: Optional[str] = None

    def as_dict(self) -> dict:
        return {"name": self.name, "current_version": self.current_version, "new_version": self.new_version,
                "node_name": self.node_name}


def parse_upgrade_plan(text: str) -> List[PlannedComponent]:
    """``kubeadm upgrade plan vX -o json`` (``output.kubeadm.k8s.io/v1alpha3`` ``UpgradePlan``) -> the
    components of its available upgrades; an empty list when kubeadm found the cluster up to date."""
    try:
        doc = json.loads(text[text.index("{"):]) if "{" in text else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("kind") != "UpgradePlan":
        raise ConstellationError("kubeadm upgrade plan -o json printed no UpgradePlan object")
    if doc.get("apiVersion") != PLAN_API_VERSION:
        raise ConstellationError("kubeadm upgrade plan printed %s, this collection reads %s"
                                 % (doc.get("apiVersion"), PLAN_API_VERSION))
    components = []
    for upgrade in doc.get("availableUpgrades") or []:
        for item in (upgrade or {}).get("components") or []:
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                components.append(PlannedComponent(item["name"], str(item.get("currentVersion", "")),
                                                   str(item.get("newVersion", "")), item.get("nodeName")))
    return components
