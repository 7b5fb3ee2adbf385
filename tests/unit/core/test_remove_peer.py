# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Removing a node at the Core and on the admin channel: RemovePeer takes the Node out of the
registry (a new peer-set version, its VPN IP free for the next node), forgets what it held (kubelet names,
control-plane designation, disk UUID and its ownership, an eviction), records it as removed (its rejoin and its
resumption are refused, GetState lists it); check mode changes nothing; a second run changes nothing; a
Coordinator is refused. Attacks on the ADMIN method: no admin key, a Node, the wrong state - refused, nothing
removed. ResetAgent: refused without the admin key, for the wrong host, and for a Coordinator without force."""

from __future__ import annotations

import os

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils import core, kms
from ansible_collections.constellation.cluster.plugins.module_utils.core.records import node_records
from ansible_collections.constellation.cluster.plugins.module_utils.core.kubernetes import KEY_KUBELET_NODE_NAME_PREFIX
from ansible_collections.constellation.cluster.plugins.module_utils.core.removal import removed_peer
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AccessDenied, InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import RemoteError
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import generate_priv_key, pub_key_from_priv_key

from ansible_collections.constellation.cluster.tests.support.admin_channel import _connect, keypair
from ansible_collections.constellation.cluster.tests.support.core_fakes import (
    FakePeerClient,
    FakeRejoinChannel,
    MemoryTPM,
    activate_node,
    pubapi_server,
)

COORDINATOR_IP = "10.42.0.11"


class AnyQuote:
    """A validator that accepts the document it is given (the Core's side of a rejoin, no TPM)."""

    oid = "1.2.3"

    def validate(self, document, nonce):  # pylint: disable=unused-argument
        return type("V", (), {"user_data": document, "pcrs": {}})()


@pytest.fixture
def cluster(make_core):
    """A Coordinator with two recorded Nodes (h2 a designated control plane with a kubelet name)."""
    c, vpn = make_core(MemoryTPM(), public_ip=COORDINATOR_IP)
    c.recovery.load()
    admin_key, admin_pem = keypair()
    c.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), admin_pem)
    nodes = {}
    for octet, control_plane in ((12, True), (13, False)):
        key, uuid = pub_key_from_priv_key(generate_priv_key()), core.new_disk_uuid()
        vpn_ip = c.coordinator.reserve_node_ip()
        c.activation.record_node(vpn_ip, key, "10.42.0.%d" % octet, uuid, control_plane)
        nodes["10.42.0.%d" % octet] = {"vpn_ip": vpn_ip, "vpn_pub_key": key, "disk_uuid": uuid}
    c.context.store.put(KEY_KUBELET_NODE_NAME_PREFIX + "worker-12", nodes["10.42.0.12"]["vpn_ip"].encode())
    c.context.store.put(KEY_KUBELET_NODE_NAME_PREFIX + "worker-13", nodes["10.42.0.13"]["vpn_ip"].encode())
    return c, vpn, nodes, admin_key


def test_check_mode_reports_and_changes_nothing(cluster):
    c, _vpn, nodes, _key = cluster
    before = c.context.peer_registry.current().to_dict()
    result = c.removal.remove_node(public_ip="10.42.0.12", check=True)
    assert result["changed"] is True and result["msg"].startswith("would remove 10.42.0.12")
    assert result["peer"]["vpn_ip"] == nodes["10.42.0.12"]["vpn_ip"]
    assert result["kubernetes_node_names"] == ["worker-12"] and result["control_plane"] is True
    assert result["disk_uuid"] == nodes["10.42.0.12"]["disk_uuid"]
    assert c.context.peer_registry.current().to_dict() == before
    assert removed_peer(c.context.store, nodes["10.42.0.12"]["vpn_pub_key"]) is None


def test_removal_frees_the_ip_forgets_what_it_held_and_a_second_run_changes_nothing(cluster):
    c, vpn, nodes, _key = cluster
    node = nodes["10.42.0.12"]
    version = c.context.peer_registry.current().peers.version
    result = c.removal.remove_node(public_ip="10.42.0.12")
    assert result["changed"] is True and result["resource_version"] == version + 1
    registry = c.context.peer_registry.current()
    assert registry.peers.get(node["vpn_ip"]) is None
    # The update every peer polls says it went; the Coordinator's own WireGuard dropped it.
    assert registry.peers.updates_since(version).removed == (node["vpn_ip"],)
    assert node["vpn_pub_key"] not in {p.vpn_pub_key for p in vpn.peers}
    store = c.context.store
    assert node_records.load_node_disk_uuid(store, node["vpn_ip"]) is None
    assert node_records.disk_uuid_owner(store, node["disk_uuid"]) is None
    assert node_records.load_control_plane(store, node["vpn_ip"]) is None
    assert c.kubernetes.kubernetes_node_names(node["vpn_ip"]) == []
    assert c.kubernetes.kubernetes_node_names(nodes["10.42.0.13"]["vpn_ip"]) == ["worker-13"]  # the other Node keeps its own
    assert removed_peer(store, node["vpn_pub_key"])["vpn_ip"] == node["vpn_ip"]
    assert [r["vpn_ip"] for r in c.status.get_state()["removed"]] == [node["vpn_ip"]]
    # Its VPN IP goes to the next node; its disk UUID may be claimed again (a reused host).
    assert c.coordinator.reserve_node_ip() == node["vpn_ip"]
    # A second run: nothing left to remove.
    again = c.removal.remove_node(public_ip="10.42.0.12")
    assert again["changed"] is False and "no peer of this cluster" in again["msg"]
    assert c.context.peer_registry.current().peers.version == version + 1


def test_a_removed_node_cannot_rejoin_nor_be_resumed(cluster):
    c, _vpn, nodes, _key = cluster
    node = nodes["10.42.0.13"]
    c.removal.remove_node(vpn_ip=node["vpn_ip"])
    channel = FakeRejoinChannel(b"")
    channel.document = channel.user_data(node["vpn_ip"], node["vpn_pub_key"], node["disk_uuid"])
    with pytest.raises(AccessDenied, match="removed from this cluster by the admin.*reset.yml"):
        c.peer_trust.serve_rejoin(node["vpn_ip"], node["vpn_pub_key"], node["disk_uuid"], channel, AnyQuote())
    assert channel.delivered is None
    # add_nodes.yml on the removed host, still locked to us: its resumption is refused, nothing recorded.
    client = FakePeerClient(pcr15=c.context.tpm.pcr15(), state={
        "state": "IsNode", "vpn_ip": node["vpn_ip"], "vpn_pub_key": node["vpn_pub_key"],
        "state_disk_uuid": node["disk_uuid"]})
    row = c.activation.activate_node("10.42.0.13:9000", lambda endpoint: client)
    assert row["ok"] is False and "removed from this cluster by the admin" in row["error"]
    assert c.context.peer_registry.current().peers.get(node["vpn_ip"]) is None


def test_an_evicted_node_is_removed_and_its_reserved_ip_freed(cluster):
    c, _vpn, nodes, _key = cluster
    node = nodes["10.42.0.13"]
    c.peer_trust.evict_peer(node["vpn_ip"], "attestation failed (test)")
    assert c.context.peer_registry.current().allocator.in_use(node["vpn_ip"])  # kept for its re-admission
    result = c.removal.remove_node(public_ip="10.42.0.13")
    assert result["changed"] is True and result["evicted"] is True
    assert node["vpn_ip"] not in c.evictions.evicted
    assert not c.context.peer_registry.current().allocator.in_use(node["vpn_ip"])


def test_coordinators_and_bad_input_are_refused_naming_the_host(cluster):
    c, _vpn, _nodes, _key = cluster
    before = c.context.peer_registry.current().to_dict()
    with pytest.raises(StateError, match="refused to remove 10.42.0.11 .*the cluster's last Coordinator"):
        c.removal.remove_node(public_ip=COORDINATOR_IP)
    with pytest.raises(InputError, match="node_public_ip"):
        c.removal.remove_node()
    with pytest.raises(InputError, match="node_public_ip"):
        c.removal.remove_node(public_ip="10.42.0.12", vpn_ip="10.118.0.11")
    with pytest.raises(InputError, match="an IP address"):
        c.removal.remove_node(public_ip="h2")
    assert c.context.peer_registry.current().to_dict() == before


def test_a_node_refuses_remove_peer(make_core):
    node, _vpn = make_core(MemoryTPM(), public_ip="10.42.0.20")
    node.recovery.load()
    with pytest.raises(StateError, match="RemovePeer"):
        node.removal.remove_node(public_ip="10.42.0.12")


# ------------------------------------------------------------------ attacks on the ADMIN methods


def test_remove_peer_and_reset_agent_need_the_admin_key_on_an_activated_coordinator(make_core):
    fresh, _vpn = make_core(MemoryTPM(), public_ip="127.0.0.1")
    fresh.recovery.load()
    with pubapi_server(fresh) as server:
        endpoint = "127.0.0.1:%d" % server.address[1]
        with _connect(endpoint) as client:  # the wrong state: before activation nothing of the admin channel
            for method, fields in (("RemovePeer", {"node_public_ip": "10.42.0.12"}), ("ResetAgent", {"confirm": "127.0.0.1"})):
                with pytest.raises(RemoteError, match="only after activation") as err:
                    client.invoke(method, **fields)
                assert err.value.kind == "StateError"
        admin_key, admin_pem = keypair()
        fresh.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), admin_pem)
        vpn_ip = fresh.coordinator.reserve_node_ip()
        fresh.activation.record_node(vpn_ip, pub_key_from_priv_key(generate_priv_key()), "10.42.0.12", core.new_disk_uuid())
        before = fresh.context.peer_registry.current().to_dict()
        with _connect(endpoint) as client:
            # No admin key; then another key: refused, nothing removed.
            with pytest.raises(RemoteError, match="AdminAuth first") as err:
                client.invoke("RemovePeer", node_public_ip="10.42.0.12")
            assert err.value.kind == "AccessDenied"
            with pytest.raises(RemoteError):
                client.admin_auth(keypair()[0])
            for method, fields in (("RemovePeer", {"node_public_ip": "10.42.0.12"}), ("ResetAgent", {"confirm": "127.0.0.1"})):
                with pytest.raises(RemoteError, match="AdminAuth first") as err:
                    client.invoke(method, **fields)
                assert err.value.kind == "AccessDenied"
        assert fresh.context.peer_registry.current().to_dict() == before
        with _connect(endpoint) as client:
            client.admin_auth(admin_key)
            # The admin: check mode first, then the removal; a Coordinator's reset only with force.
            assert client.invoke("RemovePeer", node_public_ip="10.42.0.12", check=True)["changed"] is True
            assert fresh.context.peer_registry.current().to_dict() == before
            answer = client.invoke("RemovePeer", node_public_ip="10.42.0.12")
            assert answer["changed"] is True and answer["peer"]["vpn_ip"] == vpn_ip
            assert client.invoke("RemovePeer", node_public_ip="10.42.0.12")["changed"] is False
            with pytest.raises(RemoteError, match="confirm") as err:
                client.invoke("ResetAgent", confirm="10.42.0.99")  # meant for another host
            assert err.value.kind == "InputError"
            with pytest.raises(RemoteError, match="is a Coordinator") as err:
                client.invoke("ResetAgent", confirm="127.0.0.1")
            assert err.value.kind == "StateError"
        assert fresh.state == core.State.ACTIVATING_NODES


def test_a_node_refuses_remove_peer_over_the_admin_channel(make_core):
    coordinator, _vpn = make_core(MemoryTPM(), public_ip="10.42.0.11")
    coordinator.recovery.load()
    admin_key, admin_pem = keypair()
    coordinator.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), admin_pem)
    node, _vpn = make_core(MemoryTPM(), public_ip="127.0.0.1")
    activate_node(coordinator, node, "127.0.0.1")
    with pubapi_server(node) as server, _connect("127.0.0.1:%d" % server.address[1]) as client:
        client.admin_auth(admin_key)  # even the admin: a Node has no registry to remove from
        with pytest.raises(RemoteError, match="RemovePeer") as err:
            client.invoke("RemovePeer", node_public_ip="10.42.0.11")
        assert err.value.kind == "StateError"
        # ResetAgent: this loopback server has no agent behind it to reset (the lab test resets real agents).
        with pytest.raises(RemoteError, match="cannot reset itself") as err:
            client.invoke("ResetAgent", confirm="127.0.0.1")
        assert err.value.kind == "AccessDenied"
    assert node.state == core.State.IS_NODE
