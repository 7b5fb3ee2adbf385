# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fakes of the Core's ports (``core/ports.py``) that the unit and integration tests share."""

from __future__ import annotations

import contextlib
import hashlib
import os
from typing import Dict, List, Sequence

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import DummyIssuer, DummyValidator
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import extend_digest
from ansible_collections.constellation.cluster.plugins.module_utils import core
from ansible_collections.constellation.cluster.plugins.module_utils.core import ports, signing
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AccessDenied, AttestationError, ConnectionLost
from ansible_collections.constellation.cluster.plugins.module_utils.agent.peer_view import CorePeerView
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import ConnectionClosed
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import generate_priv_key, pub_key_from_priv_key


class RecordingVPN(ports.VPN):
    """Stands in for WireGuard in Core unit tests: remembers what it was told (``ports.VPN``)."""

    vpn_cidr = "10.118.0.0/16"

    def __init__(self):
        self.address = None
        self.priv_key = None
        self.peers: List = []
        self.pod_route = None
        self.setups = 0

    def setup(self, vpn_ip, priv_key, cluster_pod_cidr=None):
        self.address, self.priv_key = vpn_ip, priv_key
        self.pod_route = cluster_pod_cidr
        self.setups += 1

    def set_peers(self, records, own_pub_key):
        self.peers = [r for r in records if r.vpn_pub_key != own_pub_key]
        return True


class MemoryTPM(ports.TPM):
    """A PCR 15 in memory (``ports.TPM``), for Core tests that need no real TPM."""

    def __init__(self):
        self.pcr = bytes(32)
        self.extends = 0

    def mark_initialized(self, cluster_id: bytes) -> None:
        self.pcr = extend_digest(self.pcr, hashlib.sha256(cluster_id).digest())
        self.extends += 1

    def pcr15(self) -> bytes:
        return self.pcr


class FakePeerClient:
    """An aTLS connection to a peer as the Coordinator's re-attestation sees it (``connect_peer``): validated,
    PCR 15 ``pcr15``, GetState's details ``state`` (only after AdminAuth as a Coordinator), or ``error`` on
    connecting."""

    def __init__(self, pcr15=None, state=None, error=None):
        self.pcr15, self.state, self.error = pcr15, state, error
        self.authenticated = False

    def __enter__(self):
        if self.error is not None:
            raise self.error
        return self

    def __exit__(self, *exc):
        return False

    def attested_pcrs(self):
        return {15: self.pcr15}

    def coordinator_auth(self, sign_auth):  # the peer's details need AdminAuth role coordinator (agent/admin.py)
        sign_auth(os.urandom(32), os.urandom(32))
        self.authenticated = True

    def get_state(self):
        assert self.authenticated, "GetState's details before AdminAuth"
        return dict(self.state)


class FakeRejoinChannel:
    """The Coordinator's side of IssueRejoinTicket without a socket (``ports.JoinChannel``): the 'node' answers
    the nonce with ``document``, under the OID of the fake validators (``document_for`` gives the one they
    accept for a peer)."""

    peer_ip = "10.42.0.12"

    def __init__(self, document: bytes = b"", peer_ip: str = ""):
        self.document = document
        self.peer_ip = peer_ip or self.peer_ip
        self.delivered = None

    @staticmethod
    def user_data(vpn_ip, pub_key, disk_uuid):
        return hashlib.sha256(("%s|%s|%s" % (vpn_ip, pub_key, disk_uuid)).encode()).digest()

    def challenge(self, nonce):  # pylint: disable=unused-argument
        return "1.2.3", self.document

    def deliver(self, ticket):
        self.delivered = ticket


@contextlib.contextmanager
def pubapi_server(core, **limits):
    """A peer's pubapi and admin channel on loopback as the agent builds them (dummy attestation; the
    server's default limits unless ``limits`` says otherwise): yields the started ``FrameServer``."""
    from ansible_collections.constellation.cluster.plugins.module_utils.agent.remote_exec import RemoteExec
    from ansible_collections.constellation.cluster.plugins.module_utils.agent.wiring import admin_handlers, pubapi_handlers
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import DummyIssuer, DummyValidator
    from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import AgentServerContext, FrameServer

    admin = admin_handlers(core)
    handlers = dict(pubapi_handlers(core, DummyValidator()).handlers())
    handlers.update(admin.handlers(), **RemoteExec(core.context.state_dir).handlers())
    tls = AgentServerContext(DummyIssuer(), key_pool_size=0)
    server = FrameServer("pubapi", ("127.0.0.1", 0), handlers, tls=tls, peer_view=CorePeerView(core), **limits).start()
    try:
        yield server
    finally:
        server.stop()
        tls.close()


def activate_node(coordinator, node, public_ip: str):
    """Loads ``node`` (a fresh Core) and activates it through ``coordinator`` (an active Coordinator's
    Core) in ActivateAsNode's two steps, as the Coordinator's admission drives them; returns the first
    step's answer."""
    node.recovery.load()
    request = coordinator.coordinator.node_activation_request(coordinator.coordinator.reserve_node_ip())
    step = node.node.activate_as_node_begin(request.to_dict())
    coordinator.activation.record_node(request.node_vpn_ip, step.node_vpn_pub_key, public_ip, step.state_disk_uuid)
    node.node.activate_as_node_finish(coordinator.coordinator.state_disk_key(step.state_disk_uuid))
    return step


def admin_pem() -> str:
    """A fresh admin public key (Ed25519, PEM), as activation takes it."""
    return ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def record_nodes(coordinator, public_ips: Sequence[str]) -> Dict[str, dict]:
    """Records a Node (a fresh key, no Core of its own) at each of ``public_ips`` in ``coordinator``'s
    registry: {public_ip: the peer as the Node's GetState reports it}."""
    nodes = {}
    for public_ip in public_ips:
        key = pub_key_from_priv_key(generate_priv_key())
        vpn_ip = coordinator.coordinator.reserve_node_ip()
        coordinator.activation.record_node(vpn_ip, key, public_ip, core.new_disk_uuid())
        nodes[public_ip] = {"vpn_ip": vpn_ip, "vpn_pub_key": key, "state": "IsNode"}
    return nodes


class RefusingValidator(DummyValidator):
    """A validator that refuses every document that arrives (a PCR 4 mismatch)."""

    def validate(self, document, nonce):
        raise AttestationError("measurements mismatch: PCR 4: expected aa, found bb")


def close_all(socks) -> None:
    """Closes each socket of ``socks``, ignoring one already gone."""
    for s in socks:
        try:
            s.close()
        except OSError:
            pass


def coordinator(make_core, secret):
    c, vpn = make_core(MemoryTPM())
    c.recovery.load()
    c.coordinator.activate_as_coordinator(secret.to_uri(), os.urandom(32), admin_pem())
    return c, vpn


def admitted_issuer(coord, name=None):
    """The joining node's issuer, its (dummy) EK admitted by the admin on ``coord`` (AdmitNodes) under ``name``."""
    ek = os.urandom(32).hex()
    coord.admissions.admit_nodes([{"ek_pub_sha256": ek, "name": name or "node-" + ek[:8]}])
    return DummyIssuer(ek_pub_sha256=ek)


class FakeNodeClient(ports.NodeClient):
    """Stands in for the aTLS connection to a node: hands the request to that node's Core. ``cut``
    drops the connection at a step of ActivateAsNode ('after_lock': the node answered the first step;
    'after_record': the Coordinator recorded the node but the key never arrived)."""

    def __init__(self, node, cut=None):
        self.node = node
        self.cut = cut

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return None

    def attested_pcrs(self):
        return {15: self.node.context.tpm.pcr15()}

    authenticated = False

    def coordinator_auth(self, sign_auth):
        """As the node's admin channel does (AdminAuth role coordinator): its pinned key must verify."""
        challenge, spki = os.urandom(32), os.urandom(32)
        if not signing.verify_auth(self.node.status.pinned_coordinator_pub_key(), sign_auth(challenge, spki), challenge, spki):
            raise AccessDenied("AdminAuth (role coordinator): refused")
        self.authenticated = True

    def get_state(self):
        return self.node.get_state() if self.authenticated else self.node.status.public_state()

    def activate_as_node(self, params, disk_key_for):
        step = self.node.node.activate_as_node_begin(params)
        if self.cut == "after_lock":
            self.node.node.abort_node_activation("connection lost")
            raise ConnectionLost("connection lost after the first step")
        key = disk_key_for(step.state_disk_uuid, step.node_vpn_pub_key)
        if self.cut == "after_record":
            self.node.node.abort_node_activation("connection lost")
            raise ConnectionLost("connection lost before the disk key")
        self.node.node.activate_as_node_finish(key)
        return {"state_disk_uuid": step.state_disk_uuid, "node_vpn_pub_key": step.node_vpn_pub_key}


class FakeJoinChannel(ports.JoinChannel):
    """The Coordinator's end of a join, wired straight to the joining node's ``on_ticket``."""

    def __init__(self, issuer, on_ticket, confirm=True):
        self.peer_ip = "10.42.0.60"
        self.issuer, self.on_ticket, self.confirm = issuer, on_ticket, confirm
        self.node_vpn_pub_key, self.disk_uuid = b"", ""

    def user_data(self, node_vpn_pub_key, disk_uuid):
        return b"bound:" + node_vpn_pub_key + disk_uuid.encode()

    def challenge(self, nonce):
        return self.issuer.oid, self.issuer.issue(self.user_data(self.node_vpn_pub_key, self.disk_uuid), nonce)

    def deliver(self, ticket):
        self.on_ticket(ticket.to_dict(), self.user_data(self.node_vpn_pub_key, self.disk_uuid))
        if not self.confirm:
            raise ConnectionClosed("the node went away")
