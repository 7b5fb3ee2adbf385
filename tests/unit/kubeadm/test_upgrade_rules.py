"""The rules of a Kubernetes upgrade (plugins/module_utils/kubeadm/upgrade.py), plain Python: versions, the
version-skew policy, the roll order and the parser of ``kubeadm upgrade plan -o json``."""

from __future__ import annotations

import json

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.upgrade import (
    NodeVersions,
    UpgradeRefused,
    Version,
    check_kubeadm_version,
    check_node_step,
    parse_upgrade_plan,
    plan_upgrade,
)

V = Version.parse


def cp(name, api, kubelet=None):
    return NodeVersions(name, V(kubelet or api), control_plane=True, control_plane_version=V(api))


def worker(name, kubelet):
    return NodeVersions(name, V(kubelet))


def refusals(nodes, target, first=None):
    with pytest.raises(UpgradeRefused) as refused:
        plan_upgrade(nodes, V(target), first)
    return [(r.node, r.found, r.wanted, r.rule) for r in refused.value.refusals], str(refused.value)


@pytest.mark.parametrize("text, parsed", [
    ("v1.31.1", (1, 31, 1)), ("1.31.1", (1, 31, 1)), ("v1.32.0-rc.1", (1, 32, 0)), ("v1.30.4+k3s1", (1, 30, 4)),
    (" v1.31.10\n", (1, 31, 10)),
])
def test_versions_parse_as_kubeadm_and_the_kubelet_print_them(text, parsed):
    version = V(text)
    assert (version.major, version.minor, version.patch) == parsed
    assert str(version) == "v%d.%d.%d" % parsed


@pytest.mark.parametrize("text", ["", "v1.31", "latest", "v1.31.x", "v01.31.1", None, 131])
def test_a_bad_version_names_the_field(text):
    with pytest.raises(InputError, match="kubernetes_version: expected a Kubernetes version vMAJOR.MINOR.PATCH"):
        V(text)


def test_versions_compare_numerically():
    assert V("v1.9.0") < V("v1.10.0") < V("v1.10.1") < V("v2.0.0")
    assert V("v1.31.1").minors_behind(V("v1.33.0")) == 2 and V("v1.32.0").minors_behind(V("v1.31.9")) == -1
    assert V("v1.31.1").minors_behind(V("v2.31.1")) > 100  # another major version is far away


@pytest.mark.parametrize("image, version", [
    ("registry.k8s.io/kube-apiserver:v1.31.1", "v1.31.1"), ("localhost:5000/kube-apiserver:v1.30.2", "v1.30.2"),
    ("registry.k8s.io/kube-apiserver:v1.31.1@sha256:" + "a" * 64, "v1.31.1"),
])
def test_the_version_of_an_image_tag(image, version):
    assert str(Version.from_image(image)) == version


@pytest.mark.parametrize("image", ["registry.k8s.io/kube-apiserver", "localhost:5000/kube-apiserver", "x:latest", ""])
def test_an_image_without_a_version_tag_has_none(image):
    assert Version.from_image(image) is None


def test_a_patch_release_rolls_control_planes_first_then_workers():
    nodes = [worker("w-b", "v1.31.1"), cp("cp-1", "v1.31.1"), worker("w-a", "v1.31.1"), cp("cp-0", "v1.31.1")]
    plan = plan_upgrade(nodes, V("v1.31.4"), "cp-1")
    assert plan.order == ["cp-1", "cp-0", "w-a", "w-b"]
    assert str(plan.cluster_version) == "v1.31.1"
    assert plan.as_dict()["upgrades"][0] == {"node": "cp-1", "role": "control-plane", "parts": ["control-plane", "kubelet"],
                                             "from": "v1.31.1", "kubelet_from": "v1.31.1", "to": "v1.31.4"}
    assert plan.as_dict()["upgrades"][2]["role"] == "worker"


def test_one_minor_up_is_allowed_and_a_node_at_the_version_is_left_alone():
    nodes = [cp("cp-0", "v1.32.0"), worker("w-0", "v1.32.0"), worker("w-1", "v1.31.1")]
    plan = plan_upgrade(nodes, V("v1.32.0"), "cp-0")
    assert [n.name for n in plan.pending] == ["w-1"]
    assert plan.node("cp-0").needs(V("v1.32.0")) == []


def test_the_same_version_everywhere_plans_nothing():
    plan = plan_upgrade([cp("cp-0", "v1.31.1"), worker("w-0", "v1.31.1")], V("v1.31.1"), "cp-0")
    assert plan.pending == [] and plan.as_dict()["upgrades"] == []


def test_two_minors_at_once_are_refused_naming_host_versions_and_rule():
    found, message = refusals([cp("cp-0", "v1.30.5"), worker("w-0", "v1.30.5")], "v1.32.0")
    assert found == [("cp-0", "API server v1.30.5", "v1.32.0", "one-minor")]
    assert message == ("upgrade refused: cp-0: found API server v1.30.5, wanted v1.32.0: one minor version at a time "
                       "(one-minor): upgrade to v1.31 first")


def test_a_downgrade_is_refused_for_control_planes_and_kubelets():
    found, _message = refusals([cp("cp-0", "v1.31.2"), worker("w-0", "v1.31.3")], "v1.31.1")
    assert found == [("cp-0", "API server v1.31.2", "v1.31.1", "downgrade"),
                     ("cp-0", "kubelet v1.31.2", "v1.31.1", "downgrade"),
                     ("w-0", "kubelet v1.31.3", "v1.31.1", "downgrade")]


def test_another_major_version_is_refused():
    found, message = refusals([cp("cp-0", "v1.31.1")], "v2.0.0")
    assert found[0] == ("cp-0", "API server v1.31.1", "v2.0.0", "one-minor") and "a different major version" in message


def test_a_kubelet_too_far_behind_the_new_api_server_is_refused():
    found, message = refusals([cp("cp-0", "v1.31.1"), worker("old", "v1.28.9"), worker("ok", "v1.29.0")], "v1.32.0")
    assert found == [("old", "kubelet v1.28.9", "v1.32.0", "kubelet-skew")]
    assert "a kubelet may be at most 3 minor versions older than the API server" in message


def test_every_broken_rule_is_named_at_once():
    found, _message = refusals([cp("cp-0", "v1.29.0"), cp("cp-1", "v1.33.0"), worker("w", "v1.27.0")], "v1.31.0")
    assert {r[3] for r in found} == {"one-minor", "downgrade", "kubelet-skew"} and len(found) == 4


def test_a_control_plane_whose_version_is_unknown_is_refused():
    node = NodeVersions("cp-0", V("v1.31.1"), control_plane=True, control_plane_version=None)
    found, message = refusals([node], "v1.31.2")
    assert found == [("cp-0", "no kube-apiserver version", "v1.31.2", "one-minor")]
    assert "its kube-apiserver static pod was not found" in message


def test_the_first_control_plane_must_be_a_control_plane():
    found, _message = refusals([cp("cp-0", "v1.31.1"), worker("w-0", "v1.31.1")], "v1.31.2", first="w-0")
    assert found == [("w-0", "a worker", "v1.31.2", "apply-first")]


def test_a_worker_waits_for_every_control_plane():
    nodes = [cp("cp-0", "v1.32.0"), cp("cp-1", "v1.31.1"), worker("w-0", "v1.31.1")]
    plan = plan_upgrade(nodes, V("v1.32.0"), "cp-0")
    (refusal,) = check_node_step(plan, "w-0", "cp-0")
    assert (refusal.node, refusal.found, refusal.wanted, refusal.rule) == (
        "w-0", "kubelet v1.31.1", "v1.32.0", "control-planes-first")
    assert str(refusal).endswith("control planes first: a kubelet is never newer than the API server "
                                 "(control-planes-first): API server of cp-1 at v1.31.1")
    assert check_node_step(plan, "cp-1", "cp-0") == []  # the further control plane may go now
    nodes[1] = cp("cp-1", "v1.32.0")
    assert check_node_step(plan_upgrade(nodes, V("v1.32.0"), "cp-0"), "w-0", "cp-0") == []


def test_a_further_control_plane_waits_for_apply_on_the_first():
    plan = plan_upgrade([cp("cp-0", "v1.31.1"), cp("cp-1", "v1.31.1")], V("v1.32.0"), "cp-0")
    (refusal,) = check_node_step(plan, "cp-1", "cp-0")
    assert refusal.rule == "apply-first" and "the first control plane cp-0 is at v1.31.1" in str(refusal)
    assert check_node_step(plan, "cp-0", "cp-0") == []


def test_a_node_with_nothing_to_do_breaks_no_order_rule_and_an_unknown_node_is_named():
    plan = plan_upgrade([cp("cp-0", "v1.31.1"), worker("w-0", "v1.32.0")], V("v1.32.0"), "cp-0")
    assert check_node_step(plan, "w-0", "cp-0") == []
    (refusal,) = check_node_step(plan, "ghost", "cp-0")
    assert refusal.node == "ghost" and "the API server lists no Node of this name" in str(refusal)


def test_kubeadm_must_be_at_least_the_wanted_version():
    (refusal,) = check_kubeadm_version("h2", V("v1.31.1"), V("v1.32.0"))
    assert str(refusal) == ("h2: found kubeadm v1.31.1, wanted v1.32.0: kubeadm must be at least the wanted version: "
                            "install it first (kubeadm-version)")
    assert check_kubeadm_version("h2", V("v1.32.1"), V("v1.32.0")) == []


PLAN = {"kind": "UpgradePlan", "apiVersion": "output.kubeadm.k8s.io/v1alpha3", "availableUpgrades": [
    {"description": "remote version", "components": [
        {"name": "kubelet", "currentVersion": "v1.31.1", "newVersion": "v1.32.0", "nodeName": "cp-0"},
        {"name": "kube-apiserver", "currentVersion": "v1.31.1", "newVersion": "v1.32.0", "nodeName": "cp-0"},
        {"name": "kubeadm", "currentVersion": "v1.32.0", "newVersion": "v1.32.0"}]}], "configVersions": []}


def test_kubeadm_plan_json_is_parsed_per_component_and_node():
    components = parse_upgrade_plan("[upgrade/config] Reading configuration\n" + json.dumps(PLAN, indent=4))
    assert [c.as_dict() for c in components] == [
        {"name": "kubelet", "current_version": "v1.31.1", "new_version": "v1.32.0", "node_name": "cp-0"},
        {"name": "kube-apiserver", "current_version": "v1.31.1", "new_version": "v1.32.0", "node_name": "cp-0"},
        {"name": "kubeadm", "current_version": "v1.32.0", "new_version": "v1.32.0", "node_name": None}]
    assert parse_upgrade_plan(json.dumps(dict(PLAN, availableUpgrades=[]))) == []  # up to date


@pytest.mark.parametrize("text, message", [
    ("Awesome, you're up-to-date!", "printed no UpgradePlan object"),
    ('{"kind": "CertificateExpirationInfo"}', "printed no UpgradePlan object"),
    ('{"kind": "UpgradePlan", "apiVersion": "output.kubeadm.k8s.io/v1alpha2"}', "printed output.kubeadm.k8s.io/v1alpha2"),
    ("{not json", "printed no UpgradePlan object"),
])
def test_anything_else_than_a_plan_is_an_error(text, message):
    with pytest.raises(ConstellationError, match=message):
        parse_upgrade_plan(text)
