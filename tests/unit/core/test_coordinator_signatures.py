# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tickets and peer lists are the Coordinators' (core/signing.py).

The attacker is a Node of the cluster: it holds the measurement secret, the cluster ID and salt, and passes
the policy a rebooted or joining node checks its Coordinator with (no PCR 15), but it does not hold the KMS.
It answers a rebooted Node's IssueRejoinTicket, a fresh node's IssueJoinTicket and a Node's GetUpdate as if
it were the Coordinator, through the real clients (rpc/client.py) against attacker servers in-process, and
the real Cores must refuse every forgery and keep their state."""

from __future__ import annotations

import base64
import os

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from ansible_collections.constellation.cluster.plugins.module_utils import core, kms
from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import AgentConfig
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import DummyIssuer, DummyValidator
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import expected_pcr15
from ansible_collections.constellation.cluster.plugins.module_utils.core import signing
from ansible_collections.constellation.cluster.plugins.module_utils.core.records.tickets import JoinTicket, RejoinTicket
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AccessDenied, InputError
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_record import PeerRecord
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import b64e
from ansible_collections.constellation.cluster.plugins.module_utils.agent.pubapi import join_cluster, rejoin_cluster
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import AgentServerContext, FrameServer
from ansible_collections.constellation.cluster.plugins.module_utils.store import MemoryStore
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import generate_priv_key, pub_key_from_priv_key
from ansible_collections.constellation.cluster.tests.support.core_fakes import MemoryTPM, activate_node, admin_pem

State = core.State
ATTACKER_PEER = PeerRecord.parse("10.118.0.66", pub_key_from_priv_key(generate_priv_key()), "10.42.0.66", "coordinator")


@pytest.fixture
def secret():
    return kms.MasterSecret.generate()


@pytest.fixture
def cluster(make_core, secret):
    """A real Coordinator and a Node it activated (two-step ActivateAsNode through the Core)."""
    coordinator, _vpn = make_core(MemoryTPM(), public_ip="10.42.0.11")
    coordinator.recovery.load()
    coordinator.coordinator.activate_as_coordinator(secret.to_uri(), os.urandom(32), admin_pem())
    store, tpm = MemoryStore(), MemoryTPM()
    node, node_vpn = make_core(tpm, store=store, public_ip="10.42.0.12")
    activate_node(coordinator, node, "10.42.0.12")
    return coordinator, node, node_vpn, store, tpm


class Attacker:
    """A pubapi-like server the attacking Node runs (aTLS with an attestation the victim accepts)."""

    def __init__(self, handlers):
        self.tls = AgentServerContext(DummyIssuer(), key_pool_size=0)
        self.server = FrameServer("attacker", ("127.0.0.1", 0), handlers, tls=self.tls,
                                  insecure_skip_access_checks=True).start()
        self.endpoint = "127.0.0.1:%d" % self.server.address[1]
        self.confirmed = []

    def close(self):
        self.server.stop()
        self.tls.close()


def ticket_handler(make_ticket, confirmed, confirm_key):
    """Answers an Issue(Re)JoinTicket as the Coordinator would: a nonce, the node's attestation, a ticket."""

    def handle(conn, request):
        conn.stream.send_msg({"nonce": b64e(os.urandom(32))})
        conn.stream.recv_msg("the node's attestation")
        conn.stream.send_msg({"ticket": make_ticket(conn, request)})
        done = conn.stream.recv_msg("the node's confirmation")
        confirmed.append(done.get(confirm_key))
        conn.stream.send_result({"resource_version": 99, "node_vpn_ip": "10.118.0.70"})

    return handle


def expected_pub_key(secret) -> str:
    """The Coordinators' key as the docs define it: Ed25519 from HKDF(master secret, "key-coordinator_signing_key")."""
    seed = kms.ClusterKMS(secret).derive_key("coordinator_signing_key")
    raw = ed25519.Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def other_key():
    return ed25519.Ed25519PrivateKey.generate()


# ------------------------------------------------------------------ rejoin


def forged(ticket, forgery, context: str, coordinator_signed) -> dict:
    """``ticket`` as the ``forgery`` hands it over: unsigned, signed with a Node's key (for ``context``), or with
    a genuine Coordinator signature (``coordinator_signed(ticket, binding)``) for another connection's request
    (a replay)."""
    if forgery == "signed_by_a_node_key":
        ticket = ticket.signed(signing.sign(other_key(), context, signing.ticket_payload(ticket.to_dict(), b"x" * 32)))
    elif forgery == "coordinator_signature_of_another_connection":
        ticket = coordinator_signed(ticket, os.urandom(32))
    return ticket.to_dict()


def rebooted(make_core, node, store, tpm):
    """The Node after a reboot: PCR 15 reset, its state stored, its disk locked (no disk key readable yet)."""
    tpm.pcr = bytes(32)
    again, vpn = make_core(tpm, store=store, public_ip="10.42.0.12", disk_uuid=node.context.disk_uuid)
    assert again.recovery.load() == State.ACCEPTING_INIT and again.context.recovery_pending
    return again, vpn


@pytest.mark.parametrize("forgery", ["unsigned", "signed_by_a_node_key", "coordinator_signature_of_another_connection"])
def test_a_node_cannot_answer_another_nodes_rejoin_and_rewrite_its_peers(make_core, secret, cluster, forgery):
    coordinator, node, _vpn, store, tpm = cluster
    peers_before = [p.to_dict() for p in node.context.stored_node().peers]
    victim, victim_vpn = rebooted(make_core, node, store, tpm)
    measurement_secret = kms.ClusterKMS(secret).measurement_secret()  # what every Node holds
    attacker_disk_key = os.urandom(32)

    def forge(conn, request):
        ticket = RejoinTicket(attacker_disk_key, measurement_secret, (ATTACKER_PEER,), 99)
        return forged(ticket, forgery, signing.CONTEXT_REJOIN_TICKET, coordinator.signing.signed_rejoin_ticket)

    attacker = Attacker({})
    attacker.server.handlers["IssueRejoinTicket"] = ticket_handler(forge, attacker.confirmed, "rejoined")
    try:
        with pytest.raises(AccessDenied, match="IssueRejoinTicket|Rejoin"):
            rejoin_cluster(victim.recovery, [attacker.endpoint], [DummyValidator()], DummyIssuer())
    finally:
        attacker.close()
    # Refused before the node lock: PCR 15 still reset, no disk key taken, peers as before, still waiting.
    assert attacker.confirmed == []
    assert tpm.pcr15() == bytes(32) and victim.context.recovery_pending and victim.state == State.ACCEPTING_INIT
    assert victim.context.read_disk_key() is None
    assert [p.to_dict() for p in victim.context.stored_node().peers] == peers_before
    assert ATTACKER_PEER.vpn_pub_key not in [p.vpn_pub_key for p in victim_vpn.peers]


def test_the_coordinators_signed_rejoin_ticket_is_taken(make_core, cluster):
    coordinator, node, _vpn, store, tpm = cluster
    victim, _victim_vpn = rebooted(make_core, node, store, tpm)

    def request_ticket(vpn_ip, pub_key, disk_uuid, on_ticket):
        binding = os.urandom(32)  # stands for the user data of this connection

        class Channel:
            peer_ip = "10.42.0.12"

            def user_data(self, *_args):
                return binding

            def challenge(self, nonce):  # pylint: disable=unused-argument
                return DummyValidator.oid, b""

            def deliver(self, ticket):
                on_ticket(ticket.to_dict(), binding)

        validator = type("V", (), {"oid": DummyValidator.oid,
                                   "validate": lambda self, d, n: type("R", (), {"user_data": binding})()})()
        return coordinator.peer_trust.serve_rejoin(vpn_ip, pub_key, disk_uuid, Channel(), validator)

    assert victim.recovery.rejoin(request_ticket)["state"] == "IsNode"
    assert tpm.pcr15() == expected_pcr15(coordinator.context.cluster_id)


# ------------------------------------------------------------------ join


@pytest.mark.parametrize("forgery", ["unsigned", "signed_by_a_node_key", "coordinator_signature_of_another_connection"])
def test_a_node_cannot_hand_a_fresh_node_a_join_ticket(make_core, secret, cluster, forgery):
    """Join: a fresh node checks the join service with the policy without PCR 15, which any Node
    passes. (Without an init secret, as with the explicit insecure option: the signature is what is left.)"""
    coordinator, node, _vpn, _store, _tpm = cluster
    fresh, fresh_vpn = make_core(MemoryTPM(), public_ip="10.42.0.20")
    fresh.recovery.load()
    fresh.context.join_coordinator_pub_key = expected_pub_key(secret)  # agent config
    stolen = node.context.stored_node()  # what the attacking Node knows

    def forge(conn, request):
        ticket = JoinTicket(stolen.cluster_id, stolen.measurement_salt, kms.ClusterKMS(secret).measurement_secret(),
                            os.urandom(32), "10.118.0.70", (ATTACKER_PEER,), ATTACKER_PEER.vpn_ip, admin_pem())
        return forged(ticket, forgery, signing.CONTEXT_JOIN_TICKET, coordinator.signing.signed_join_ticket)

    attacker = Attacker({})
    attacker.server.handlers["IssueJoinTicket"] = ticket_handler(forge, attacker.confirmed, "joined")
    try:
        with pytest.raises(AccessDenied, match="IssueJoinTicket"):
            join_cluster(fresh.node, attacker.endpoint, [DummyValidator()], DummyIssuer())
    finally:
        attacker.close()
    assert attacker.confirmed == []
    assert fresh.state == State.ACCEPTING_INIT and fresh.context.tpm.pcr15() == bytes(32)
    assert fresh.context.read_disk_key() is None and fresh_vpn.peers == []


def test_a_joining_node_without_a_pinned_key_takes_no_ticket(make_core, cluster):
    coordinator, _node, _vpn, _store, _tpm = cluster
    fresh, _fresh_vpn = make_core(MemoryTPM(), public_ip="10.42.0.21")
    fresh.recovery.load()
    ticket = coordinator.signing.signed_join_ticket(
        coordinator.join_service.issue_join_ticket(fresh.context.disk_uuid, coordinator.coordinator.reserve_node_ip()), b"b")
    with pytest.raises(AccessDenied, match="no pinned Coordinator key"):
        fresh.node.join(JoinTicket.from_dict(ticket.to_dict()), b"b")
    assert fresh.state == State.ACCEPTING_INIT and fresh.context.tpm.pcr15() == bytes(32)


def test_the_agent_refuses_join_mode_without_the_coordinator_key(tmp_path):
    config = {"state_dir": str(tmp_path), "public_endpoint": "127.0.0.1:9000", "variant": "dummy",
              "coordinator_public_endpoint": "127.0.0.2:9000", "init_secret_hash": "ab" * 32}
    with pytest.raises(InputError, match="coordinator_pub_key"):
        AgentConfig.from_mapping(config)
    with pytest.raises(InputError, match="coordinator_pub_key"):
        AgentConfig.from_mapping(dict(config, coordinator_pub_key="not base64 of 32 bytes"))
    pub = kms.coordinator_pub_key(kms.ClusterKMS(kms.MasterSecret.generate()))
    assert AgentConfig.from_mapping(dict(config, coordinator_pub_key=pub)).coordinator_pub_key == pub


# ------------------------------------------------------------------ GetUpdate


def update_server(answer):
    """What answers at the Coordinator's VPN address (plain framing, as the vpnapi)."""
    server = FrameServer("vpnapi", ("127.0.0.1", 0), {"GetUpdate": lambda conn, request: conn.stream.send_result(answer)},
                         insecure_skip_access_checks=True)
    return server.start()


@pytest.mark.parametrize("forgery", ["unsigned", "signed_by_a_node_key", "coordinator_signature_of_another_version"])
def test_a_forged_peer_update_is_refused_and_the_peers_stay(cluster, forgery):
    coordinator, node, node_vpn, _store, _tpm = cluster
    assert node.node.apply_update(coordinator.coordinator.get_update(node.context.resource_version))  # the genuine one is taken
    version, peers_before, wg_before = node.context.resource_version, list(node.context.stored_node().peers), list(node_vpn.peers)
    forged_peers = [p.to_dict() for p in peers_before] + [ATTACKER_PEER.to_dict()]
    answer = {"resource_version": version + 1, "full": True, "added": forged_peers}
    if forgery == "signed_by_a_node_key":
        answer["signature"] = signing.sign(other_key(), signing.CONTEXT_PEERS,
                                           signing.peers_payload(version + 1, forged_peers))
    elif forgery == "coordinator_signature_of_another_version":
        answer["signature"] = coordinator.coordinator.get_update(-1)["signature"]
    server = update_server(answer)
    try:
        with AgentClient.connect_plain("127.0.0.1:%d" % server.address[1]) as client:
            with pytest.raises(AccessDenied, match="GetUpdate"):
                node.node.apply_update(client.get_update(node.context.resource_version))
    finally:
        server.stop()
    assert node.context.resource_version == version and list(node.context.stored_node().peers) == peers_before
    assert node_vpn.peers == wg_before and ATTACKER_PEER.vpn_pub_key not in [p.vpn_pub_key for p in node_vpn.peers]


def test_peer_updates_are_signed_once_per_version_and_verify(cluster):
    coordinator, node, _vpn, _store, _tpm = cluster
    first = coordinator.coordinator.get_update(-1)
    assert first["signature"] and coordinator.coordinator.get_update(-1)["signature"] == first["signature"]
    assert coordinator.coordinator.get_update(first["resource_version"]) == {"resource_version": first["resource_version"]}
    coordinator.coordinator.add_node_peer(coordinator.coordinator.reserve_node_ip(), pub_key_from_priv_key(generate_priv_key()), "10.42.0.31")
    assert node.node.apply_update(coordinator.coordinator.get_update(node.context.resource_version))
    changed = coordinator.coordinator.get_update(first["resource_version"])
    assert "signature" in changed and changed["signature"] != first["signature"]
    assert node.node.apply_update(coordinator.coordinator.get_update(first["resource_version"])) is False  # nothing new for it


# ------------------------------------------------------------------ the key


def test_every_coordinator_derives_the_same_key_and_getdatakey_never_hands_out_its_seed(secret, cluster):
    coordinator, node, _vpn, _store, _tpm = cluster
    uri = secret.to_uri()
    assert kms.coordinator_pub_key(kms.open_kms(uri)) == coordinator.signing.coordinator_pub_key() == expected_pub_key(secret)
    assert node.context.stored_node().coordinator_pub_key == coordinator.signing.coordinator_pub_key()  # pinned at activation
    seed = kms.ClusterKMS(secret).derive_key(kms.COORDINATOR_SIGNING_KEY_ID)
    with pytest.raises(InputError, match="reserved"):
        coordinator.peer_access.get_data_key(kms.COORDINATOR_SIGNING_KEY_ID, 32)
    raw = base64.b64decode(coordinator.signing.coordinator_pub_key())
    assert len(raw) == 32 and seed not in raw
    assert kms.coordinator_pub_key(kms.ClusterKMS(kms.MasterSecret.generate())) != coordinator.signing.coordinator_pub_key()


def test_a_node_activation_without_the_coordinator_key_is_refused_before_the_lock(make_core, cluster):
    coordinator, _node, _vpn, _store, _tpm = cluster
    fresh, _fresh_vpn = make_core(MemoryTPM(), public_ip="10.42.0.22")
    fresh.recovery.load()
    params = coordinator.coordinator.node_activation_request(coordinator.coordinator.reserve_node_ip()).to_dict()
    params.pop("coordinator_pub_key")
    with pytest.raises(InputError, match="coordinator_pub_key"):
        fresh.node.activate_as_node_begin(params)
    assert fresh.context.tpm.pcr15() == bytes(32) and fresh.state == State.ACCEPTING_INIT
