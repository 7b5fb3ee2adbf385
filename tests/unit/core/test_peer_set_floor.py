# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A Node never takes a peer set older than the one it applied (core/node.py ``apply_update``).

The attacker sits on the path to the Coordinator (or answers at its VPN address) and replays GetUpdate answers
the real Coordinator signed earlier, through the real client (rpc/client.py) against a server on loopback: a set
that still lists an evicted peer, and another set signed at the Node's own version. The real Node Core refuses
both, naming both versions, and keeps its peers; the evicted peer does not come back. A Coordinator restored
from an older backup continues above the version its Nodes hold (core/coordinator.py), so they keep updating."""

from __future__ import annotations

import os

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from ansible_collections.constellation.cluster.plugins.module_utils import core, kms
from ansible_collections.constellation.cluster.plugins.module_utils.core import signing
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_record import PeerRecord
from ansible_collections.constellation.cluster.plugins.module_utils.errors import StateError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import FrameServer
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import generate_priv_key, pub_key_from_priv_key
from ansible_collections.constellation.cluster.tests.support.core_fakes import MemoryTPM, activate_node

State = core.State


def admin_pem(key) -> str:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


@pytest.fixture
def cluster(make_core):
    """A real Coordinator, a Node it activated (its events recorded), and a second Node's entry ("evictee")."""
    secret, admin_key = kms.MasterSecret.generate(), ed25519.Ed25519PrivateKey.generate()
    coordinator, _vpn = make_core(MemoryTPM(), public_ip="10.42.0.11")
    coordinator.recovery.load()
    coordinator.coordinator.activate_as_coordinator(secret.to_uri(), os.urandom(32), admin_pem(admin_key))
    node, node_vpn = make_core(MemoryTPM(), public_ip="10.42.0.12")
    events = []
    node.context.log = lambda event, **fields: events.append(dict(fields, event=event))
    activate_node(coordinator, node, "10.42.0.12")
    evictee = PeerRecord.parse(coordinator.coordinator.reserve_node_ip(), pub_key_from_priv_key(generate_priv_key()),
                               "10.42.0.13", "node")
    coordinator.coordinator.add_node_peer(evictee.vpn_ip, evictee.vpn_pub_key, evictee.public_ip)
    assert node.node.apply_update(coordinator.coordinator.get_update(node.context.resource_version))
    return {"coordinator": coordinator, "node": node, "node_vpn": node_vpn, "events": events, "evictee": evictee,
            "secret": secret, "admin_key": admin_key}


def replay(node, answer):
    """``answer`` served at a VPN address the Node asks, through the real client."""
    server = FrameServer("vpnapi", ("127.0.0.1", 0),
                         {"GetUpdate": lambda conn, request: conn.stream.send_result(answer)},
                         insecure_skip_access_checks=True).start()  # a stand-in Coordinator
    try:
        with AgentClient.connect_plain("127.0.0.1:%d" % server.address[1]) as client:
            return node.node.apply_update(client.get_update(node.context.resource_version))
    finally:
        server.stop()


def wg_keys(vpn):
    return sorted(p.vpn_pub_key for p in vpn.peers)


def test_a_replayed_older_signed_peer_set_is_refused_and_the_evicted_peer_stays_out(cluster):
    coordinator, node, node_vpn, evictee = cluster["coordinator"], cluster["node"], cluster["node_vpn"], cluster["evictee"]
    # Recorded on the path while the evictee was a peer: the Coordinators' genuine signature over that set.
    old = coordinator.coordinator.get_update(-1)
    assert old["signature"] and evictee.vpn_pub_key in [p["vpn_pub_key"] for p in old["added"]]
    coordinator.coordinator.remove_peer(evictee.vpn_ip)  # the eviction
    assert node.node.apply_update(coordinator.coordinator.get_update(node.context.resource_version))
    version, peers = node.context.resource_version, list(node.context.stored_node().peers)
    assert old["resource_version"] < version and evictee.vpn_pub_key not in wg_keys(node_vpn)
    wg_before = wg_keys(node_vpn)
    with pytest.raises(StateError) as refused:
        replay(node, old)
    message = str(refused.value)
    assert "version %d is older than the one this Node applied (version %d)" % (old["resource_version"], version) \
        in message
    assert node.context.resource_version == version and list(node.context.stored_node().peers) == peers
    assert wg_keys(node_vpn) == wg_before and evictee.vpn_pub_key not in wg_keys(node_vpn)
    assert node.context.state == State.IS_NODE
    logged = [e for e in cluster["events"] if e["event"] == "update_refused"]
    assert logged and logged[-1]["resource_version"] == old["resource_version"]
    assert logged[-1]["applied_resource_version"] == version
    # The Coordinator's next genuine answer is still taken.
    coordinator.coordinator.add_node_peer(coordinator.coordinator.reserve_node_ip(),
                                          pub_key_from_priv_key(generate_priv_key()), "10.42.0.14")
    assert node.node.apply_update(coordinator.coordinator.get_update(node.context.resource_version))
    assert node.context.resource_version == version + 1 and evictee.vpn_pub_key not in wg_keys(node_vpn)


def test_another_signed_set_at_the_nodes_own_version_is_refused(cluster):
    """A set at the Node's version with other peers (signed with the Coordinators' key, as two diverging
    histories of one cluster would be): refused too."""
    node, node_vpn, evictee = cluster["node"], cluster["node_vpn"], cluster["evictee"]
    cluster["coordinator"].coordinator.remove_peer(evictee.vpn_ip)
    assert node.node.apply_update(cluster["coordinator"].coordinator.get_update(node.context.resource_version))
    version, peers, wg_before = node.context.resource_version, list(node.context.stored_node().peers), wg_keys(node_vpn)
    other = [p.to_dict() for p in peers] + [evictee.to_dict()]
    priv_key = kms.coordinator_signing_priv_key(kms.open_kms(cluster["secret"].to_uri()))
    answer = {"resource_version": version, "full": True, "added": other,
              "signature": signing.sign(priv_key, signing.CONTEXT_PEERS, signing.peers_payload(version, other))}
    with pytest.raises(StateError, match="version %d differs from the one this Node applied" % version):
        replay(node, answer)
    assert node.context.resource_version == version and list(node.context.stored_node().peers) == peers
    assert wg_keys(node_vpn) == wg_before and evictee.vpn_pub_key not in wg_before
    # The same set at the same version again changes nothing and is no error.
    assert node.node.apply_update(cluster["coordinator"].coordinator.get_update(-1)) is False


def test_a_coordinator_restored_from_an_older_backup_continues_above_the_nodes_version(cluster, make_core):
    coordinator, node, node_vpn, evictee = cluster["coordinator"], cluster["node"], cluster["node_vpn"], cluster["evictee"]
    exported = coordinator.backup.export_state()  # lists the evictee
    backup_version = coordinator.context.peer_registry.current().peers.version
    coordinator.coordinator.remove_peer(evictee.vpn_ip)
    assert node.node.apply_update(coordinator.coordinator.get_update(node.context.resource_version))
    version = node.context.resource_version
    assert version > backup_version
    # The admin restores that backup explicitly (restore.yml -e constellation_backup=...) onto a fresh host.
    restored, _vpn = make_core(MemoryTPM(), public_ip="10.42.0.11")
    restored.recovery.load()
    restored.backup.restore(cluster["secret"].to_uri(), admin_pem(cluster["admin_key"]), exported)
    answer = restored.coordinator.get_update(version)
    assert answer["resource_version"] == version + 1 and answer["full"] and answer["signature"]
    assert node.node.apply_update(answer)  # the restored set, above the Node's floor
    assert node.context.resource_version == version + 1 and evictee.vpn_pub_key in wg_keys(node_vpn)
    assert restored.context.peer_registry.reload().peers.version == version + 1  # stored, not only answered
    # Asked again at that version: nothing new; at an older one: the same set at the same version.
    assert restored.coordinator.get_update(version + 1) == {"resource_version": version + 1}
    assert restored.coordinator.get_update(backup_version)["resource_version"] == version + 1


def test_a_restore_given_the_nodes_version_continues_above_it_even_at_another_address(cluster, make_core):
    """A named backup one change older than the Nodes, restored onto a host at another address: its own registry
    entry makes one new version, the very version the Nodes hold. Given the Nodes' version (restore.yml asks them),
    the restored set continues above it and the Nodes take the new address; without it they would see "nothing
    new" at their version and keep the old one."""
    coordinator, node, evictee = cluster["coordinator"], cluster["node"], cluster["evictee"]
    exported = coordinator.backup.export_state()
    coordinator.coordinator.remove_peer(evictee.vpn_ip)
    assert node.node.apply_update(coordinator.coordinator.get_update(node.context.resource_version))
    version = node.context.resource_version
    restored, _vpn = make_core(MemoryTPM(), public_ip="10.42.0.99")  # another address
    restored.recovery.load()
    restored.backup.restore(cluster["secret"].to_uri(), admin_pem(cluster["admin_key"]), exported,
                            peer_version_floor=version)
    assert restored.context.peer_registry.current().peers.version > version
    assert node.node.apply_update(restored.coordinator.get_update(version))
    coordinator_entry = [p for p in node.context.stored_node().peers if p.vpn_ip == coordinator.context.vpn_ip]
    assert [p.public_ip for p in coordinator_entry] == ["10.42.0.99"]
    with pytest.raises(Exception, match="peer_resource_version_floor"):
        fresh, _vpn = make_core(MemoryTPM(), public_ip="10.42.0.98")
        fresh.recovery.load()
        fresh.backup.restore(cluster["secret"].to_uri(), admin_pem(cluster["admin_key"]), exported,
                             peer_version_floor=-5)
