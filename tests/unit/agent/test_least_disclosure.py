# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Least disclosure (GetState): a stranger who reaches a peer's pubapi learns its state and role only, not
its VPN key, disk UUID or the Coordinator's evicted peers. The admin (AdminAuth) and the Coordinators
(AdminAuth role coordinator, with their signing key) get the details; the Coordinators' key opens nothing else.
The real pubapi and admin channel servers on loopback (dummy attestation), real Cores."""

from __future__ import annotations

import json
import os

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import DummyIssuer, DummyValidator
from ansible_collections.constellation.cluster.plugins.module_utils.core import signing
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import RemoteError
from ansible_collections.constellation.cluster.plugins.module_utils.agent.remote_exec import RemoteExec
from ansible_collections.constellation.cluster.plugins.module_utils.agent.wiring import admin_handlers, pubapi_handlers
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import AgentServerContext, FrameServer
from ansible_collections.constellation.cluster.tests.support.core_fakes import MemoryTPM, activate_node
from ansible_collections.constellation.cluster.plugins.module_utils.agent.peer_view import CorePeerView

DETAILS = ("vpn_ip", "vpn_pub_key", "state_disk_uuid", "evicted")


def serve(core):
    admin = admin_handlers(core)
    handlers = dict(pubapi_handlers(core, DummyValidator()).handlers())
    handlers.update(admin.handlers(), **RemoteExec(warm_interpreters=False).handlers())
    tls = AgentServerContext(DummyIssuer(), key_pool_size=0)
    server = FrameServer("pubapi", ("127.0.0.1", 0), handlers, tls=tls, peer_view=CorePeerView(core)).start()
    return server, tls, "127.0.0.1:%d" % server.address[1]


@pytest.fixture
def cluster(make_core):
    """An activated Coordinator (with one evicted Node) and an activated Node, each behind its real servers."""
    admin_key = ed25519.Ed25519PrivateKey.generate()
    admin_pem = admin_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                    serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    coordinator, _vpn = make_core(MemoryTPM(), public_ip="10.42.0.11")
    coordinator.recovery.load()
    coordinator.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), admin_pem)
    node, _vpn = make_core(MemoryTPM(), public_ip="10.42.0.12")
    activate_node(coordinator, node, "10.42.0.12")
    other = coordinator.coordinator.reserve_node_ip()
    coordinator.activation.record_node(other, "x" * 43 + "=", "10.42.0.13", "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
    coordinator.peer_trust.evict_peer(other, "test: failed re-attestation")
    running = [serve(coordinator), serve(node)]
    yield coordinator, node, admin_key, running[0][2], running[1][2]
    for server, tls, _endpoint in running:
        server.stop()
        tls.close()


def connect(endpoint):
    return AgentClient.connect(endpoint, [DummyValidator()])


def test_a_strangers_getstate_tells_state_and_role_only(cluster):
    coordinator, node, _admin_key, coordinator_endpoint, node_endpoint = cluster
    secrets_of = {coordinator_endpoint: [coordinator.context.vpn_pub_key, coordinator.context.disk_uuid, "10.42.0.13"],
                  node_endpoint: [node.context.vpn_pub_key, node.context.disk_uuid]}
    for endpoint, state, role in ((coordinator_endpoint, "ActivatingNodes", "coordinator"),
                                  (node_endpoint, "IsNode", "node")):
        with connect(endpoint) as c:
            answer = c.get_state()
        assert (answer["state"], answer["role"]) == (state, role)
        assert not any(answer.get(k) for k in DETAILS), answer
        text = json.dumps(answer)
        assert not any(value in text for value in secrets_of[endpoint]), answer


def test_a_wrong_admin_key_or_a_forged_coordinator_key_unlocks_nothing(cluster):
    _coordinator, node, _admin_key, coordinator_endpoint, node_endpoint = cluster
    forged = signing.Signer(kms.ClusterKMS(kms.MasterSecret.generate()))  # another cluster's Coordinators
    for endpoint in (coordinator_endpoint, node_endpoint):
        with connect(endpoint) as c:
            with pytest.raises(RemoteError) as err:
                c.admin_auth(ed25519.Ed25519PrivateKey.generate())
            assert err.value.kind == "AccessDenied"
            with pytest.raises(RemoteError) as err:
                c.coordinator_auth(forged.sign_auth)
            assert err.value.kind == "AccessDenied"
            answer = c.get_state()
            assert not any(answer.get(k) for k in DETAILS), answer
            assert node.context.vpn_pub_key not in json.dumps(answer)


def test_the_admin_gets_the_details(cluster):
    coordinator, node, admin_key, coordinator_endpoint, node_endpoint = cluster
    with connect(coordinator_endpoint) as c:
        c.admin_auth(admin_key)
        answer = c.get_state()
    assert answer["vpn_pub_key"] == coordinator.context.vpn_pub_key and [e["public_ip"] for e in answer["evicted"]] == ["10.42.0.13"]
    with connect(node_endpoint) as c:
        c.admin_auth(admin_key)
        answer = c.get_state()
    assert (answer["vpn_ip"], answer["vpn_pub_key"], answer["state_disk_uuid"]) == (node.context.vpn_ip, node.context.vpn_pub_key,
                                                                                    node.context.disk_uuid)


def test_the_coordinators_key_unlocks_the_details_but_no_command(cluster):
    coordinator, node, _admin_key, coordinator_endpoint, node_endpoint = cluster
    with connect(node_endpoint) as c:
        coordinator.signing.authenticate_as_coordinator(c)  # as re-attestation does
        assert c.get_state()["vpn_pub_key"] == node.context.vpn_pub_key
        with pytest.raises(RemoteError) as err:
            c.exec_command(argv=["/bin/true"])
        assert err.value.kind == "AccessDenied"
        with pytest.raises(RemoteError) as err:
            c.fetch_file(os.path.join(node.context.state_dir, "state_disk.key"), lambda data: pytest.fail("a file left"))
        assert err.value.kind == "AccessDenied"
    # Every Coordinator of the cluster derives the same key: another Coordinator's details too.
    with connect(coordinator_endpoint) as c:
        coordinator.signing.authenticate_as_coordinator(c)
        assert c.get_state()["vpn_pub_key"] == coordinator.context.vpn_pub_key
