# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Authorisation is declared once per method (rpc/schema.py ``access``) and enforced by the server before the
handler runs (rpc/server.py ``_authorise``), so no handler has to remember a check.

The attack list is the schema itself: a stranger (no AdminAuth, no PeerAuth) calls EVERY method of every API on
the agent's real servers on loopback (the pubapi and admin channel of an activated Coordinator, of an activated
Node and of a fresh node provisioned with an init secret; the Coordinator's vpnapi, from a Node's VPN IP as any
process on that Node can) and is refused as the declaration says, with no secret in anything it received. A new
method is attacked without anyone adding it here."""

from __future__ import annotations

import base64
import hashlib
import os
import socket

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from ansible_collections.constellation.cluster.plugins.module_utils.agent.peer_view import CorePeerView
from ansible_collections.constellation.cluster.plugins.module_utils.agent.remote_exec import RemoteExec
from ansible_collections.constellation.cluster.plugins.module_utils.agent.wiring import admin_handlers, vpnapi_handlers
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import DummyIssuer, DummyValidator
from ansible_collections.constellation.cluster.plugins.module_utils.core.records import state_store
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import access, schema
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import (
    CHANNEL_STDIN,
    KIND_END,
    KIND_MSG,
    FrameStream,
)
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import AgentServerContext, FrameServer
from ansible_collections.constellation.cluster.tests.support.core_fakes import MemoryTPM, pubapi_server
from ansible_collections.constellation.cluster.tests.support.join_chain import Cluster
from ansible_collections.constellation.cluster.tests.support.sockets import RecordingSocket

SAMPLE = {"str": "x", "int": 0, "bool": False, "number": 1, "list": [], "strlist": [], "object": {}}
REFUSALS = ("AccessDenied", "StateError")
CALLERS_WITH_A_PROOF_ON_THE_CONNECTION = access.ADMIN_CALLERS + (access.CALLER_COORDINATORS,) + access.PEER_CALLERS


def served_in(declared: str, state: str) -> bool:
    return {access.SERVED_ALWAYS: True, access.SERVED_ACCEPTING_INIT: state == "AcceptingInit",
            access.SERVED_ACTIVATED: state in access.ACTIVATED_STATES,
            access.SERVED_ADMIN_KEY_PINNED: state in access.ACTIVATED_STATES,
            access.SERVED_COORDINATOR: state == "ActivatingNodes"}[declared]


def well_formed(spec: schema.Method, overrides) -> dict:
    """A request of ``spec`` that decodes: every required field with a value of its kind."""
    params = {}
    for field in spec.request.__dataclass_fields__.values():
        meta = field.metadata
        if meta.get("required"):
            params[field.name] = (base64.b64encode(bytes(meta.get("size") or 32)).decode() if meta["kind"] == "b64"
                                  else SAMPLE[meta["kind"]])
    params.update(overrides.get(spec.name, {}))
    return params


def ask(stream: FrameStream, spec: schema.Method, params: dict) -> dict:
    """One request as a stranger sends it: stdin (empty) where the method takes it, a bogus step wherever the
    server asks for one (a signature, a proof, an attestation it cannot make); the END's message."""
    stream.send_request(spec.name, params)
    if spec.stdin:
        stream.send_eof(CHANNEL_STDIN)
    for _step in range(20):
        frame = stream.recv()
        if frame.kind == KIND_END:
            return frame.message
        if frame.kind == KIND_MSG and "log" not in frame.message:
            stream.send_msg({})
    raise AssertionError("%s: no END after 20 frames" % spec.name)


def admin_pem(key) -> str:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


@pytest.fixture
def peers(tmp_path, make_core):
    """An activated Coordinator (its vpnapi on 127.77.0.1 and its pubapi), an activated Node, a fresh node
    provisioned with an init secret; each behind the servers the agent runs."""
    cluster = Cluster(tmp_path, str(tmp_path / "kubernetes"), provider=False)
    coordinator = cluster.core
    node, _vpn = make_core(MemoryTPM(), public_ip="10.42.0.12")
    node.recovery.load()
    request = coordinator.coordinator.node_activation_request(coordinator.coordinator.reserve_node_ip())
    step = node.node.activate_as_node_begin(request.to_dict())
    coordinator.activation.record_node(request.node_vpn_ip, step.node_vpn_pub_key, "10.42.0.12", step.state_disk_uuid,
                                       True)
    node_disk_key = coordinator.coordinator.state_disk_key(step.state_disk_uuid)
    node.node.activate_as_node_finish(node_disk_key)
    fresh_tpm = MemoryTPM()
    fresh, _vpn = make_core(fresh_tpm, public_ip="10.42.0.13")
    fresh.context.init_secret_hash = hashlib.sha256(os.urandom(32)).hexdigest()
    fresh.recovery.load()
    fresh_request = coordinator.coordinator.node_activation_request(coordinator.coordinator.reserve_node_ip())
    secrets = [state_store.load_kms_data(coordinator.context.local_store)["kms_uri"].encode(), node_disk_key,
               base64.b64encode(node_disk_key)]
    for peer in (coordinator, node):
        secrets.append(peer.context.node_state["vpn_priv_key"].encode())
    with pubapi_server(coordinator) as coordinator_pubapi, pubapi_server(node) as node_pubapi, \
            pubapi_server(fresh) as fresh_pubapi:
        overrides = {name: fresh_request.to_dict() for name in ("ActivateAsNode", "ActivateAsAdditionalCoordinator")}
        yield {"cluster": cluster, "node_vpn_ip": request.node_vpn_ip, "secrets": secrets, "fresh_tpm": fresh_tpm,
               "overrides": overrides,
               "pubapi": [(coordinator_pubapi, coordinator), (node_pubapi, node), (fresh_pubapi, fresh)]}
    cluster.server.stop()


@pytest.mark.parametrize("name", sorted(schema.METHODS))
def test_a_stranger_calling_any_method_is_refused_as_declared(peers, name):
    spec = schema.METHODS[name]
    declared = spec.access
    received = []
    if spec.api == schema.VPNAPI:  # the Coordinator's vpnapi, from a Node's VPN IP without its WireGuard key
        sock = socket.create_connection(("127.77.0.1", peers["cluster"].port), timeout=10,
                                        source_address=(peers["node_vpn_ip"], 0))
        targets = [(RecordingSocket(sock), peers["cluster"].core)]
    else:
        targets = []
        for server, core in peers["pubapi"]:
            client = AgentClient.connect("127.0.0.1:%d" % server.address[1], [DummyValidator()])
            targets.append((RecordingSocket(client.sock), core))
    for recording, core in targets:
        state = core.context.state.wire_name
        with recording.sock:
            answer = ask(FrameStream(recording), spec, well_formed(spec, peers["overrides"]))
        received.append(bytes(recording.received))
        error = answer.get("error") or {}
        where = "%s on %s: %s" % (name, state, answer)
        if not served_in(declared.served, state):
            assert error.get("kind") == "StateError" and error["message"].startswith(name), where
        elif declared.caller in CALLERS_WITH_A_PROOF_ON_THE_CONNECTION:
            assert error.get("kind") == "AccessDenied" and error["message"].startswith("%s needs " % name), where
        elif declared.caller == access.CALLER_INIT_SECRET:  # the Core, before the node lock
            # (a peer that cannot take the role at all, e.g. no etcd member for a further Coordinator, says so first)
            assert error.get("kind") in REFUSALS, where
            assert error.get("reason") == "init_proof" or error["kind"] == "StateError", where
            assert peers["fresh_tpm"].pcr == bytes(32) and core.context.state.wire_name == "AcceptingInit"
        elif "error" in answer:  # open to anyone: what it refuses, it refuses as any error
            assert error.get("kind") in REFUSALS + ("InputError", "ProtocolError"), where
        else:  # open to anyone and answered (GetState): the public part only
            assert not any(answer["result"].get(k) for k in ("vpn_ip", "vpn_pub_key", "state_disk_uuid")), where
    everything = b"".join(received)
    for secret in peers["secrets"]:
        assert secret not in everything, name
    assert not peers["cluster"].core.status.get_state().get("evicted")  # no healthy peer paid for it


def test_every_method_declares_who_may_call_it():
    bare = schema.Method("Undeclared", schema.ADMIN, schema.Empty, schema.Empty, schema.STREAMS_NONE, "no rule")
    with pytest.raises(ValueError, match="Undeclared declares no access"):
        schema.register(bare)
    assert "Undeclared" not in schema.METHODS
    with pytest.raises(ValueError, match="caller 'root' is not one of"):
        schema.Access("root", schema.SERVED_ALWAYS)
    assert all(isinstance(m.access, schema.Access) for m in schema.METHODS.values())


# ------------------------------------------------------------------ a handler that checks nothing itself


@pytest.fixture
def vault(make_core):
    """A toy admin method whose handler hands out a secret and checks nothing: only its declaration protects it."""
    secret = os.urandom(16).hex()
    spec = schema.register(schema.Method("OpenVault", schema.ADMIN, schema.Empty, schema.Empty, schema.STREAMS_NONE,
                                         "a test method", access=schema.Access(schema.CALLER_ADMIN,
                                                                               schema.SERVED_ACTIVATED)))
    coordinator, _vpn = make_core(MemoryTPM())
    coordinator.recovery.load()
    key = ed25519.Ed25519PrivateKey.generate()
    from ansible_collections.constellation.cluster.plugins.module_utils import kms

    coordinator.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32),
                                                    admin_pem(key))
    admin = admin_handlers(coordinator)
    handlers = dict(admin.handlers(), **RemoteExec(warm_interpreters=False).handlers(),
                    OpenVault=lambda conn, request: conn.stream.send_result({"secret": secret}))
    tls = AgentServerContext(DummyIssuer(), key_pool_size=0)
    server = FrameServer("pubapi", ("127.0.0.1", 0), handlers, tls=tls, peer_view=CorePeerView(coordinator)).start()
    yield "127.0.0.1:%d" % server.address[1], key, secret, spec
    server.stop()
    tls.close()
    schema.unregister("OpenVault")


def test_a_handler_without_a_check_of_its_own_is_still_protected(vault):
    endpoint, key, secret, spec = vault
    client = AgentClient.connect(endpoint, [DummyValidator()])
    recording = RecordingSocket(client.sock)
    with client:
        answer = ask(FrameStream(recording), spec, {})
        assert answer["error"]["kind"] == "AccessDenied"
        assert answer["error"]["message"].startswith("OpenVault needs AdminAuth (the admin key pinned at activation)")
        client.admin_auth(key)
        assert client.call("OpenVault") == {"secret": secret}  # the admin gets it: the handler itself works
    assert secret.encode() not in bytes(recording.received)


# ------------------------------------------------------------------ one proof does not stand in for another


@pytest.fixture
def mixed(tmp_path):
    """The Coordinator's real admin and vpnapi handlers on ONE server (plain, from a Node's VPN IP, and aTLS): a
    proof on the connection counts only for the methods that declare it."""
    cluster = Cluster(tmp_path, str(tmp_path / "kubernetes"), provider=False)
    key = ed25519.Ed25519PrivateKey.generate()
    cluster.core.context.save_node(admin_pub_key=admin_pem(key))  # the admin key pinned at activation: ours
    admin = admin_handlers(cluster.core)
    handlers = dict(vpnapi_handlers(cluster.core).handlers(), **admin.handlers(),
                    **RemoteExec(warm_interpreters=False).handlers())
    view = CorePeerView(cluster.core)
    plain = FrameServer("mixed", ("127.77.0.1", 0), handlers, apis=(schema.VPNAPI, schema.ADMIN), peer_view=view).start()
    tls = AgentServerContext(DummyIssuer(), key_pool_size=0)
    attested = FrameServer("mixed", ("127.0.0.1", 0), handlers, tls=tls, apis=(schema.VPNAPI, schema.ADMIN),
                           peer_view=view).start()
    yield cluster, key, plain, attested
    for server in (plain, attested, cluster.server):
        server.stop()
    tls.close()


def test_a_peerauthd_peer_gets_no_admin_method(mixed):
    cluster, _key, plain, _attested = mixed
    node_ip = cluster.add_node("10.42.0.11", control_plane=True)
    sock = socket.create_connection(("127.77.0.1", plain.address[1]), timeout=10, source_address=(node_ip, 0))
    with AgentClient.connect_plain("127.77.0.1:%d" % plain.address[1], sock=sock) as client:
        client.peer_auth(cluster.keys[node_ip], cluster.core.context.vpn_pub_key)
        assert len(client.get_data_key("app")) == 32  # its PeerAuth counts where it is declared
        for method in (m.name for m in schema.methods_of(schema.ADMIN) if m.access.caller in access.ADMIN_CALLERS):
            error = ask(client.stream, schema.METHODS[method], well_formed(schema.METHODS[method], {}))["error"]
            assert error["kind"] == "AccessDenied" and error["message"].startswith("%s needs AdminAuth" % method)


def test_the_admin_gets_no_vpnapi_method_without_peerauth(mixed):
    _cluster, key, _plain, attested = mixed
    with AgentClient.connect("127.0.0.1:%d" % attested.address[1], [DummyValidator()]) as client:
        client.admin_auth(key)
        assert client.export_state()["items"]  # its AdminAuth counts where it is declared
        for method in (m.name for m in schema.methods_of(schema.VPNAPI) if m.access.caller in access.PEER_CALLERS):
            error = ask(client.stream, schema.METHODS[method], well_formed(schema.METHODS[method], {}))["error"]
            assert error["kind"] == "AccessDenied" and error["message"].startswith("%s needs PeerAuth" % method)


def test_a_coordinator_only_method_on_a_node_is_refused_naming_its_state(peers):
    node_server, node = peers["pubapi"][1]
    key = ed25519.Ed25519PrivateKey.generate()
    node.context.save_node(admin_pub_key=admin_pem(key))
    coordinator_only = [m.name for m in schema.METHODS.values()
                        if m.access.served == schema.SERVED_COORDINATOR and m.api != schema.VPNAPI]
    assert {"ExportState", "RemovePeer", "SetMeasurements", "ActivateAdditionalNodes", "IssueJoinTicket"} <= set(coordinator_only)
    with AgentClient.connect("127.0.0.1:%d" % node_server.address[1], [DummyValidator()]) as client:
        client.admin_auth(key)  # even the admin
        for method in coordinator_only:
            error = ask(client.stream, schema.METHODS[method], well_formed(schema.METHODS[method], {}))["error"]
            assert error["kind"] == "StateError", (method, error)
            assert error["message"] == ("%s is served only after activation, by an activated Coordinator (state "
                                        "ActivatingNodes); this node is IsNode" % method)


def test_the_init_proof_is_checked_by_the_core_before_the_node_lock(peers):
    """CALLER_INIT_SECRET: the server lets the request through, the Core refuses a missing or wrong proof before it
    takes the node lock (PCR 15 untouched, the node still AcceptingInit and activatable)."""
    fresh_server, fresh = peers["pubapi"][2]
    request = dict(peers["overrides"]["ActivateAsNode"])
    key = ed25519.Ed25519PrivateKey.generate()
    attempts = [("ActivateAsNode", request), ("ActivateAsNode", dict(request, init_proof=base64.b64encode(os.urandom(32)).decode())),
                ("ActivateAsCoordinator", {"kms_uri": "kms://cluster-kms?key=" + "A" * 44, "admin_pub_key": admin_pem(key),
                                           "measurement_salt": base64.b64encode(os.urandom(32)).decode(),
                                           "init_secret": base64.b64encode(os.urandom(32)).decode()})]
    for method, params in attempts:
        with AgentClient.connect("127.0.0.1:%d" % fresh_server.address[1], [DummyValidator()]) as client:
            answer = ask(client.stream, schema.METHODS[method], params)
        assert answer["error"]["kind"] == "AccessDenied" and answer["error"]["reason"] == "init_proof", answer
    assert peers["fresh_tpm"].pcr == bytes(32) and peers["fresh_tpm"].extends == 0
    assert fresh.context.state.wire_name == "AcceptingInit"
