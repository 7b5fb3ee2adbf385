# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""activate_nodes' decision (plugin_utils/peer_plan.py) as a table: every membership x state x role the
controller distinguishes, for a further Coordinator and for a node, and what activate_nodes makes of a plan."""

from __future__ import annotations

import itertools

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.errors import StateError
from ansible_collections.constellation.cluster.plugins.plugin_utils import controller
from ansible_collections.constellation.cluster.plugins.plugin_utils.controller import PeerReport
from ansible_collections.constellation.cluster.plugins.plugin_utils.peer_plan import Action, plan_peer

FRESH, OURS, OTHER = "fresh", "ours", "other"
MEMBERSHIPS = (FRESH, OURS, OTHER)
STATES = ("Uninitialized", "AcceptingInit", "ActivatingNodes", "NodeWaitingForClusterJoin", "IsNode", "Failed")
ROLES = ("unknown", "coordinator", "node")
A = Action

# (membership, state, role) -> Action for a further Coordinator: only an activated Coordinator of ours is one,
# only a fresh peer accepting init is activated, anything else is refused.
COORDINATOR = {
    (OURS, "ActivatingNodes", "coordinator"): A.MEMBER,
    (FRESH, "AcceptingInit", "unknown"): A.ACTIVATE,
    (FRESH, "AcceptingInit", "coordinator"): A.ACTIVATE,
    (FRESH, "AcceptingInit", "node"): A.ACTIVATE,
}

# (membership, state) -> Action for a node (the cluster ID known, neither evicted nor removed); the role does not
# decide. A fresh peer in another state than AcceptingInit is reported as locked to another cluster.
NODE = {
    (FRESH, "Uninitialized"): A.REFUSE_OTHER_CLUSTER,
    (FRESH, "AcceptingInit"): A.ACTIVATE,
    (FRESH, "ActivatingNodes"): A.REFUSE_OTHER_CLUSTER,
    (FRESH, "NodeWaitingForClusterJoin"): A.REFUSE_OTHER_CLUSTER,
    (FRESH, "IsNode"): A.REFUSE_OTHER_CLUSTER,
    (FRESH, "Failed"): A.REFUSE_OTHER_CLUSTER,
    (OURS, "Uninitialized"): A.REFUSE_STATE,
    (OURS, "AcceptingInit"): A.REFUSE_STATE,
    (OURS, "ActivatingNodes"): A.REFUSE_STATE,
    (OURS, "NodeWaitingForClusterJoin"): A.RESUME,
    (OURS, "IsNode"): A.MEMBER,
    (OURS, "Failed"): A.REFUSE_STATE,
    (OTHER, "Uninitialized"): A.REFUSE_OTHER_CLUSTER,
    (OTHER, "AcceptingInit"): A.REFUSE_OTHER_CLUSTER,
    (OTHER, "ActivatingNodes"): A.REFUSE_OTHER_CLUSTER,
    (OTHER, "NodeWaitingForClusterJoin"): A.REFUSE_OTHER_CLUSTER,
    (OTHER, "IsNode"): A.REFUSE_OTHER_CLUSTER,
    (OTHER, "Failed"): A.REFUSE_OTHER_CLUSTER,
}


@pytest.mark.parametrize("membership, state, role", list(itertools.product(MEMBERSHIPS, STATES, ROLES)))
def test_a_further_coordinator(membership, state, role):
    expected = COORDINATOR.get((membership, state, role), A.REFUSE_NOT_OUR_COORDINATOR)
    assert plan_peer("coordinator", membership, state, role) is expected
    # What the Coordinator holds about Nodes, and whether the cluster ID is known, does not decide for a Coordinator.
    assert plan_peer("coordinator", membership, state, role, cluster_id_known=False, evicted=True,
                     removed=True) is expected


@pytest.mark.parametrize("membership, state", sorted(NODE))
@pytest.mark.parametrize("role", ROLES)
def test_a_node(membership, state, role):
    assert plan_peer("node", membership, state, role) is NODE[membership, state]


@pytest.mark.parametrize("membership, state", list(itertools.product(MEMBERSHIPS, STATES)))
def test_a_node_without_the_cluster_id(membership, state):
    """Without the cluster ID a locked peer is OTHER (cluster_membership): it is refused with its state."""
    expected = A.REFUSE_STATE if membership == OTHER else NODE[membership, state]
    assert plan_peer("node", membership, state, "node", cluster_id_known=False) is expected


@pytest.mark.parametrize("membership, state", list(itertools.product(MEMBERSHIPS, STATES)))
def test_an_evicted_node(membership, state):
    """An evicted Node of ours that attests again is readmitted; eviction changes nothing else."""
    expected = A.READMIT if (membership, state) == (OURS, "IsNode") else NODE[membership, state]
    assert plan_peer("node", membership, state, "node", evicted=True) is expected


@pytest.mark.parametrize("membership, state", list(itertools.product(MEMBERSHIPS, STATES)))
def test_a_removed_node(membership, state):
    """A Node of ours the admin removed is refused whatever its state (and before its eviction is looked at)."""
    expected = A.REFUSE_REMOVED if membership == OURS else NODE[membership, state]
    assert plan_peer("node", membership, state, "node", evicted=True, removed=True) is expected


def test_every_action_is_planned_somewhere():
    planned = set(COORDINATOR.values()) | set(NODE.values()) | {A.READMIT, A.REFUSE_REMOVED, A.REFUSE_NOT_OUR_COORDINATOR}
    assert planned == set(Action)


@pytest.mark.parametrize("action, row, sent", [
    (A.MEMBER, "none", False), (A.ACTIVATE, "activate", True), (A.RESUME, "resume", True),
    (A.READMIT, "readmit", True), (A.REFUSE_NOT_OUR_COORDINATOR, "refused", False),
    (A.REFUSE_REMOVED, "refused", False), (A.REFUSE_STATE, "refused", False),
    (A.REFUSE_OTHER_CLUSTER, "refused", False)])
def test_the_row_and_what_is_sent(action, row, sent):
    assert (action.row, action.sent, action.refused) == (row, sent, row == "refused")


def report(endpoint, membership, state, role="node", vpn_ip=None, vpn_pub_key=None):
    return PeerReport(endpoint=endpoint, state=state, role=role, membership=membership, pcr15="ab" * 32,
                      vpn_ip=vpn_ip, vpn_pub_key=vpn_pub_key)


@pytest.mark.parametrize("action, peer, reason", [
    (A.REFUSE_NOT_OUR_COORDINATOR, report("10.0.0.2:9000", OTHER, "ActivatingNodes", "coordinator"),
     "10.0.0.2:9000 is ActivatingNodes (role coordinator, PCR 15 other): not a Coordinator of this cluster; "
     "reset it and run again"),
    (A.REFUSE_REMOVED, report("10.0.0.3:9000", OURS, "IsNode"),
     "10.0.0.3:9000 was removed from this cluster (remove_node.yml): reset it (reset.yml), reboot it, then run "
     "add_nodes.yml again"),
    (A.REFUSE_STATE, report("10.0.0.4:9000", OURS, "ActivatingNodes", "coordinator"),
     "10.0.0.4:9000 is ActivatingNodes (role coordinator)"),
    (A.REFUSE_STATE, report("10.0.0.5:9000", OURS, "Failed"),
     "10.0.0.5:9000 is Failed (role node): it cannot be resumed; its agent log says why. Reset the node (wipe its "
     "agent state, reboot) and run add_nodes.yml"),
    (A.REFUSE_OTHER_CLUSTER, report("10.0.0.6:9000", OTHER, "IsNode"),
     "10.0.0.6:9000 is locked to another cluster (PCR 15 %s)" % ("ab" * 32)),
])
def test_a_refusal_says_why(action, peer, reason):
    assert action.reason(peer) == reason


def test_only_a_refusal_has_a_reason():
    with pytest.raises(ValueError):
        A.ACTIVATE.reason(report("10.0.0.2:9000", FRESH, "AcceptingInit"))


@pytest.fixture
def attested(monkeypatch):
    """activate_nodes over these reports (no network), the Coordinator holding ``outcasts``."""
    peers = {}
    outcasts = {"evicted": [], "removed": []}
    monkeypatch.setattr(controller, "_reports", lambda endpoints, *_: {e: peers[e] for e in endpoints})
    monkeypatch.setattr(controller, "_coordinator_outcasts", lambda *_: (outcasts["evicted"], outcasts["removed"]))
    return peers, outcasts


def test_activate_nodes_plans_every_peer_and_sends_nothing_in_check_mode(attested):
    peers, outcasts = attested
    peers.update({"c2:9000": report("c2:9000", FRESH, "AcceptingInit", "unknown"),
                  "n1:9000": report("n1:9000", FRESH, "AcceptingInit", "unknown"),
                  "n2:9000": report("n2:9000", OURS, "IsNode", vpn_ip="10.42.0.2"),
                  "n3:9000": report("n3:9000", OURS, "NodeWaitingForClusterJoin", vpn_ip="10.42.0.3"),
                  "n4:9000": report("n4:9000", OURS, "IsNode", vpn_ip="10.42.0.4")})
    outcasts["evicted"].append({"vpn_ip": "10.42.0.4"})
    out = controller.activate_nodes("c1:9000", ["n1:9000", "n2:9000", "n3:9000", "n4:9000", "n1:9000"], None, None,
                                    cluster_id=b"\0" * 32, check_mode=True,
                                    coordinator_public_endpoints=["c1:9000", "c2:9000"])
    assert out["changed"] is True
    assert [(r["endpoint"], r["role"], r["state_before"], r["action"], r["node_vpn_ip"]) for r in out["nodes"]] == [
        ("c2:9000", "coordinator", "AcceptingInit", "activate", None),
        ("n1:9000", "node", "AcceptingInit", "activate", None),
        ("n2:9000", "node", "IsNode", "none", "10.42.0.2"),
        ("n3:9000", "node", "NodeWaitingForClusterJoin", "resume", "10.42.0.3"),
        ("n4:9000", "node", "IsNode", "readmit", "10.42.0.4")]


def test_activate_nodes_refuses_the_run_with_every_reason(attested):
    peers, outcasts = attested
    peers.update({"c2:9000": report("c2:9000", OURS, "IsNode", "node"),
                  "n1:9000": report("n1:9000", FRESH, "AcceptingInit", "unknown"),
                  "n2:9000": report("n2:9000", OURS, "IsNode", vpn_pub_key="key2"),
                  "n3:9000": report("n3:9000", OTHER, "IsNode")})
    outcasts["removed"].append({"vpn_pub_key": "key2"})
    with pytest.raises(StateError) as refused:
        controller.activate_nodes("c1:9000", ["n1:9000", "n2:9000", "n3:9000"], None, None, cluster_id=b"\0" * 32,
                                  coordinator_public_endpoints=["c2:9000"])
    assert str(refused.value) == (
        "cannot activate these peers: c2:9000 is IsNode (role node, PCR 15 ours): not a Coordinator of this cluster; "
        "reset it and run again; n2:9000 was removed from this cluster (remove_node.yml): reset it (reset.yml), "
        "reboot it, then run add_nodes.yml again; n3:9000 is locked to another cluster (PCR 15 %s)" % ("ab" * 32))


def test_activate_nodes_with_nothing_to_do_is_unchanged(attested):
    peers = attested[0]
    peers["n2:9000"] = report("n2:9000", OURS, "IsNode", vpn_ip="10.42.0.2")
    out = controller.activate_nodes("c1:9000", ["n2:9000"], None, None, cluster_id=b"\0" * 32)
    assert out == {"changed": False, "resource_version": None, "nodes": [
        {"endpoint": "n2:9000", "role": "node", "state_before": "IsNode", "node_vpn_ip": "10.42.0.2", "action": "none"}]}
