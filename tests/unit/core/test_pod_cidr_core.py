"""Pod CIDRs through the Core (docs/wireguard.md, "Pod CIDRs"): the first Coordinator's activation turns them on,
every Node gets one with its VPN IP (activation and ticket join), the node keeps it in its state and routes the
cluster's pod range into wg0, the signed peer sets carry them, eviction withdraws and removal frees them."""

from __future__ import annotations

import os

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils import core, kms
from ansible_collections.constellation.cluster.plugins.module_utils.core.records.tickets import NodeActivationRequest
from ansible_collections.constellation.cluster.plugins.module_utils.core.removal import _remove_and_free
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AccessDenied, InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import generate_priv_key, pub_key_from_priv_key
from ansible_collections.constellation.cluster.tests.support.core_fakes import MemoryTPM, admin_pem

POD_CONFIG = {"cluster_pod_cidr": "10.244.0.0/16", "node_pod_cidr_mask_size": 24}


@pytest.fixture
def secret():
    return kms.MasterSecret.generate()


def _coordinator(make_core, secret, config=None):
    c, vpn = make_core(MemoryTPM())
    c.recovery.load()
    result = c.coordinator.activate_as_coordinator(secret.to_uri(), os.urandom(32), admin_pem(),
                                                   cluster_config=POD_CONFIG if config is None else config)
    return c, vpn, result


def _join(coord, make_core, secret):
    ip = coord.coordinator.reserve_node_ip()
    node, vpn = make_core(MemoryTPM())
    node.recovery.load()
    ticket = coord.signing.signed_join_ticket(coord.join_service.issue_join_ticket(node.context.disk_uuid, ip), b"binding")
    node.context.join_coordinator_pub_key = kms.coordinator_pub_key(kms.ClusterKMS(secret))
    node.node.join(core.JoinTicket.from_dict(ticket.to_dict()), b"binding")
    coord.coordinator.add_node_peer(ip, node.context.vpn_pub_key, node.context.public_ip)
    return node, vpn, ip, ticket


def test_first_coordinator_gets_the_first_block_and_routes_the_range(make_core, secret):
    c, vpn, result = _coordinator(make_core, secret)
    assert result.to_dict()["cluster_pod_cidr"] == "10.244.0.0/16"
    assert result.to_dict()["coordinator_pod_cidr"] == "10.244.0.0/24"
    assert vpn.pod_route == "10.244.0.0/16"
    state = c.get_state()
    assert (state["node_pod_cidr"], state["cluster_pod_cidr"]) == ("10.244.0.0/24", "10.244.0.0/16")
    assert c.context.peer_registry.current().peers.get("10.118.0.1").pod_cidr == "10.244.0.0/24"


def test_without_a_pod_range_nobody_gets_one(make_core, secret):
    c, vpn, result = _coordinator(make_core, secret, config={})
    assert "cluster_pod_cidr" not in result.to_dict() and vpn.pod_route is None
    node, node_vpn, ip, ticket = _join(c, make_core, secret)
    assert ticket.node_pod_cidr is None and node_vpn.pod_route is None
    assert c.context.peer_registry.current().peers.get(ip).pod_cidr is None
    assert node.get_state()["node_pod_cidr"] is None


@pytest.mark.parametrize("config, field", [
    ({"cluster_pod_cidr": "10.118.0.0/15"}, "cluster_config.cluster_pod_cidr"),
    ({"cluster_pod_cidr": "10.244.0.0/16", "node_pod_cidr_mask_size": 8}, "cluster_config.node_pod_cidr_mask_size"),
])
def test_a_bad_pod_range_is_refused_before_the_node_lock(make_core, secret, config, field):
    c, _vpn = make_core(MemoryTPM())
    c.recovery.load()
    with pytest.raises(InputError) as err:
        c.coordinator.activate_as_coordinator(secret.to_uri(), os.urandom(32), admin_pem(), cluster_config=config)
    assert err.value.field == field
    assert c.state == core.State.ACCEPTING_INIT


def test_ticket_join_hands_the_node_its_block_and_peer_sets_carry_it_signed(make_core, secret):
    coord, coord_vpn, _result = _coordinator(make_core, secret)
    node, node_vpn, ip, ticket = _join(coord, make_core, secret)
    assert (ticket.node_pod_cidr, ticket.cluster_pod_cidr) == ("10.244.1.0/24", "10.244.0.0/16")
    assert node_vpn.pod_route == "10.244.0.0/16"
    assert node.get_state()["node_pod_cidr"] == "10.244.1.0/24"
    assert node.context.stored_node().pod_cidr == "10.244.1.0/24"
    # The Node got the Coordinator's pod CIDR in the ticket's peers, the Coordinator the Node's in its registry.
    assert [(p.vpn_ip, p.pod_cidr) for p in node_vpn.peers] == [("10.118.0.1", "10.244.0.0/24")]
    assert [(p.vpn_ip, p.pod_cidr) for p in coord_vpn.peers] == [(ip, "10.244.1.0/24")]
    _other, other_vpn, other_ip, _ticket = _join(coord, make_core, secret)
    assert node.node.apply_update(coord.coordinator.get_update(node.context.resource_version))  # signature checked
    assert {p.vpn_ip: p.pod_cidr for p in node_vpn.peers} == {"10.118.0.1": "10.244.0.0/24", other_ip: "10.244.2.0/24"}
    # A peer set whose pod CIDR was changed in transit does not verify: the Node keeps its peers.
    _join(coord, make_core, secret)
    update = coord.coordinator.get_update(node.context.resource_version)
    tampered = dict(update, added=[dict(p, pod_cidr="10.244.9.0/24") for p in update["added"]])
    with pytest.raises(AccessDenied, match="signature"):
        node.node.apply_update(tampered)
    assert len(node_vpn.peers) == 2
    assert node.node.apply_update(update) and len(node_vpn.peers) == 3
    assert other_vpn.pod_route == "10.244.0.0/16"


def test_node_activation_request_carries_both_or_neither(make_core, secret):
    coord, _vpn, _result = _coordinator(make_core, secret)
    ip = coord.coordinator.reserve_node_ip()
    request = coord.coordinator.node_activation_request(ip)
    assert (request.node_pod_cidr, request.cluster_pod_cidr) == ("10.244.1.0/24", "10.244.0.0/16")
    params = request.to_dict()
    assert NodeActivationRequest.from_dict(params) == request
    for bad, field in (({"node_pod_cidr": None}, "node_pod_cidr"),
                       ({"node_pod_cidr": "10.245.0.0/24"}, "node_pod_cidr"),
                       ({"cluster_pod_cidr": "pods"}, "cluster_pod_cidr")):
        changed = dict(params, **bad)
        if changed["node_pod_cidr"] is None:
            del changed["node_pod_cidr"]
        with pytest.raises(InputError) as err:
            NodeActivationRequest.from_dict(changed)
        assert err.value.field == field


def test_node_activation_keeps_the_block_and_a_restart_routes_again(make_core, secret):
    coord, _vpn, _result = _coordinator(make_core, secret)
    ip = coord.coordinator.reserve_node_ip()
    request = coord.coordinator.node_activation_request(ip)
    node, node_vpn = make_core(MemoryTPM())
    node.recovery.load()
    params = dict(request.to_dict(), **coord.coordinator.init_proof_for(node.context.public_ip))
    step = node.node.activate_as_node_begin(params)
    node.node.activate_as_node_finish(kms.ClusterKMS(secret).state_disk_key(step.state_disk_uuid))
    assert node_vpn.pod_route == "10.244.0.0/16" and node.get_state()["node_pod_cidr"] == "10.244.1.0/24"
    again, again_vpn = make_core(node.context.tpm, store=node.context.local_store)
    again.recovery.load()
    assert again_vpn.pod_route == "10.244.0.0/16" and again.get_state()["node_pod_cidr"] == "10.244.1.0/24"


def test_eviction_withdraws_readmission_gives_back_and_removal_frees(make_core, secret):
    coord, coord_vpn, _result = _coordinator(make_core, secret)
    _node, _node_vpn, ip, _ticket = _join(coord, make_core, secret)
    key = coord.context.peer_registry.current().peers.get(ip).vpn_pub_key
    coord.context.peer_registry.update(lambda r: r.withdraw(ip))  # what evict_peer does (core/eviction/peer_trust.py)
    coord.coordinator.apply_registry_peers()
    assert coord_vpn.peers == []
    registry = coord.context.peer_registry.current()
    assert registry.pod_cidrs.in_use("10.244.1.0/24") and registry.pod_cidr_of(ip) == "10.244.1.0/24"
    coord.coordinator.add_node_peer(ip, key, "10.42.0.40")  # re-admitted: the same block
    assert [(p.vpn_ip, p.pod_cidr) for p in coord_vpn.peers] == [(ip, "10.244.1.0/24")]
    coord.context.peer_registry.update(lambda r: r.withdraw(ip))
    coord.context.peer_registry.update(lambda r: _remove_and_free(r, ip))  # remove_node of the evicted node
    registry = coord.context.peer_registry.current()
    assert not registry.pod_cidrs.in_use("10.244.1.0/24") and not registry.allocator.in_use(ip)
    new_ip = coord.coordinator.reserve_node_ip()
    assert coord.coordinator.node_activation_request(new_ip).node_pod_cidr == "10.244.1.0/24"
    coord.coordinator.add_node_peer(new_ip, pub_key_from_priv_key(generate_priv_key()), "10.42.0.41")
    coord.coordinator.remove_peer(new_ip)
    assert not coord.context.peer_registry.current().pod_cidrs.in_use("10.244.1.0/24")


def test_a_failed_activation_gives_the_block_back(make_core, secret):
    coord, _vpn, _result = _coordinator(make_core, secret)
    ip = coord.coordinator.reserve_node_ip()
    coord.coordinator.release_node_ip(ip)
    assert not coord.context.peer_registry.current().pod_cidrs.in_use("10.244.1.0/24")
    assert coord.coordinator.node_activation_request(coord.coordinator.reserve_node_ip()).node_pod_cidr == "10.244.1.0/24"


def test_a_cluster_activated_without_pod_cidrs_gets_them_later_through_signed_updates(make_core, secret):
    """UsePodCIDRs (activate_coordinator on an activated Coordinator): a 0.4.0 cluster turns the pod network on;
    the Nodes learn their block and the range from the next signed peer set and route the range into wg0."""
    coord, coord_vpn, _result = _coordinator(make_core, secret, config={})
    node, node_vpn, ip, _ticket = _join(coord, make_core, secret)
    node.node.apply_update(coord.coordinator.get_update(node.context.resource_version))
    version = coord.coordinator.peer_version()
    check = coord.coordinator.use_pod_cidrs("10.244.0.0/16", 24, check=True)
    assert check["changed"] and [a["pod_cidr"] for a in check["allocated"]] == ["10.244.0.0/24", "10.244.1.0/24"]
    assert coord.coordinator.peer_version() == version and coord_vpn.pod_route is None  # check: nothing changed
    done = coord.coordinator.use_pod_cidrs("10.244.0.0/16", 24)
    assert (done["changed"], done["coordinator_pod_cidr"], done["resource_version"]) == (True, "10.244.0.0/24", version + 1)
    assert coord_vpn.pod_route == "10.244.0.0/16"
    assert coord.get_state()["node_pod_cidr"] == "10.244.0.0/24"
    assert [(p.vpn_ip, p.pod_cidr) for p in coord_vpn.peers] == [(ip, "10.244.1.0/24")]
    update = coord.coordinator.get_update(node.context.resource_version)
    assert update["cluster_pod_cidr"] == "10.244.0.0/16"
    with pytest.raises(AccessDenied):  # the range is signed with the set: another one does not verify
        node.node.apply_update(dict(update, cluster_pod_cidr="10.245.0.0/16"))
    assert node.node.apply_update(update)
    assert node_vpn.pod_route == "10.244.0.0/16"
    assert (node.get_state()["node_pod_cidr"], node.get_state()["cluster_pod_cidr"]) == ("10.244.1.0/24", "10.244.0.0/16")
    assert [(p.vpn_ip, p.pod_cidr) for p in node_vpn.peers] == [("10.118.0.1", "10.244.0.0/24")]
    # Again: nothing changes; another range is refused.
    assert not coord.coordinator.use_pod_cidrs("10.244.0.0/16", 24)["changed"]
    with pytest.raises(StateError, match="cannot change"):
        coord.coordinator.use_pod_cidrs("10.245.0.0/16", 24)
    with pytest.raises(InputError) as err:
        coord.coordinator.use_pod_cidrs("10.118.0.0/16", 24)
    assert err.value.field == "cluster_pod_cidr"


class _Client:
    """What ``activate_coordinator`` sends an activated Coordinator (plugin_utils/controller.py)."""

    def __init__(self):
        self.calls = []

    def invoke(self, name, **fields):
        self.calls.append((name, fields))
        return {"changed": True, "cluster_pod_cidr": fields["cluster_pod_cidr"],
                "coordinator_pod_cidr": "10.244.0.0/24", "allocated": [{"vpn_ip": "10.118.0.1", "pod_cidr": "10.244.0.0/24"}]}


@pytest.mark.parametrize("has, key, config, sent", [
    (None, object(), POD_CONFIG, True),  # an activated Coordinator without pod CIDRs: UsePodCIDRs
    ("10.244.0.0/16", object(), POD_CONFIG, False),  # it has the range: nothing is sent
    (None, None, POD_CONFIG, False),  # without the admin key nothing is read or changed
    (None, object(), {"cluster_pod_cidr": ""}, False),  # the pod network off
])
def test_activate_coordinator_turns_the_pod_network_on_only_where_it_is_missing(has, key, config, sent):
    from ansible_collections.constellation.cluster.plugins.plugin_utils.controller import PeerReport, _use_pod_cidrs

    client, result = _Client(), {"changed": False}
    report = PeerReport(endpoint="10.42.0.11:9000", state="ActivatingNodes", role="coordinator", membership="ours",
                        cluster_pod_cidr=has)
    _use_pod_cidrs(client, report, config, key, True, result)
    assert bool(client.calls) == sent
    if sent:
        assert client.calls == [("UsePodCIDRs", {"cluster_pod_cidr": "10.244.0.0/16", "node_pod_cidr_mask_size": 24,
                                                 "check": True})]
        assert result["changed"] and result["pod_cidrs_allocated"] == [{"vpn_ip": "10.118.0.1", "pod_cidr": "10.244.0.0/24"}]
    else:
        assert result == {"changed": False}
