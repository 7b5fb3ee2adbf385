# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Core package's seams: its ports (Protocols) and who implements them, the per-instance join
key, the node state's store format, and the transport-free node activation and join."""

from __future__ import annotations

import ast
import base64
import os
import pathlib
import threading

import pytest

from ansible_collections.constellation.cluster.tests.support.core_fakes import (
    FakeJoinChannel,
    FakeNodeClient,
    MemoryTPM,
    RecordingVPN,
    admin_pem,
    admitted_issuer,
    coordinator,
)
from ansible_collections.constellation.cluster.plugins.module_utils import core, kms
from ansible_collections.constellation.cluster.plugins.module_utils.core.records import state_store
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import DummyIssuer, DummyValidator
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import expected_pcr15
from ansible_collections.constellation.cluster.plugins.module_utils.core import ports
from ansible_collections.constellation.cluster.plugins.module_utils.core.records.node_state import NodeState
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    AttestationError,
    ConnectionLost,
    ConstellationError,
    InputError,
    StateError,
)
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import ConnectionClosed
from ansible_collections.constellation.cluster.plugins.module_utils.agent.pubapi import ServerJoinChannel
from ansible_collections.constellation.cluster.plugins.module_utils.store import FileStore, MemoryStore
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import generate_priv_key, pub_key_from_priv_key

State = core.State
CORE_DIR = pathlib.Path(core.__file__).parent


@pytest.fixture
def secret():
    return kms.MasterSecret.generate()


# --------------------------------------------------------------------------- ports


def test_real_adapters_and_fakes_implement_the_ports(tmp_path):
    assert isinstance(core.TPMDevice("swtpm:host=127.0.0.1,port=1"), ports.TPM)
    assert isinstance(MemoryTPM(), ports.TPM)
    assert isinstance(core.WireGuardVPN("wg9"), ports.VPN)
    assert isinstance(RecordingVPN(), ports.VPN)
    assert isinstance(MemoryStore(), ports.Store)
    assert isinstance(FileStore(str(tmp_path / "store.json")), ports.Store)
    assert isinstance(kms.ClusterKMS(kms.MasterSecret.generate()), ports.KMS)
    assert isinstance(DummyValidator(), ports.AttestationValidator)
    assert issubclass(AgentClient, ports.NodeClient)
    conn = type("Conn", (), {"peer_ip": "10.42.0.9", "server_spki_hash": bytes(32), "stream": None})()
    assert isinstance(ServerJoinChannel(conn), ports.JoinChannel)
    assert issubclass(ConnectionClosed, ConnectionLost)
    # Something that lacks a port's method is not taken for it.
    assert not isinstance(object(), ports.TPM) and not isinstance(MemoryTPM(), ports.VPN)


def test_the_core_package_imports_neither_ansible_nor_rpc():
    for path in sorted(CORE_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            modules = []
            if isinstance(node, ast.ImportFrom):
                assert node.level == 0, "%s: relative import" % path.name
                modules = [node.module or ""]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            for module in modules:
                assert not module.startswith("ansible.") and module != "ansible", (path.name, module)
                assert ".module_utils.rpc" not in module, (path.name, module)


# --------------------------------------------------------------------------- per-instance join key


def test_two_cores_have_their_own_join_key_and_lock(make_core):
    a, _vpn_a = make_core(MemoryTPM())
    b, _vpn_b = make_core(MemoryTPM())
    assert a.node._join_key_lock is not b.node._join_key_lock
    assert "_join_key_lock" not in vars(core.Core) and "_join_priv_key_value" not in vars(core.Core)
    key_a, key_b = a.node.join_vpn_pub_key(), b.node.join_vpn_pub_key()
    assert key_a != key_b and len(key_a) == 32
    assert a.node.join_vpn_pub_key() == key_a  # once per Core
    # Holding one Core's join key lock does not block the other Core.
    with a.node._join_key_lock:
        done = threading.Event()
        threading.Thread(target=lambda: (b.node.join_vpn_pub_key(), done.set()), daemon=True).start()
        assert done.wait(5)


# --------------------------------------------------------------------------- node state


def test_node_state_keeps_the_store_format(make_core, secret):
    c, _vpn = coordinator(make_core, secret)
    stored = state_store.load_node_state(c.context.store)
    assert set(stored) == {"role", "vpn_ip", "vpn_priv_key", "cluster_id", "measurement_salt", "admin_pub_key",
                           "coordinator_vpn_ip", "cluster_name", "disk_uuid", "state"}
    assert base64.b64decode(stored["cluster_id"]) == c.context.cluster_id
    assert c.context.node_state == stored
    node = NodeState.from_dict(stored)
    assert isinstance(node.cluster_id, bytes) and isinstance(node.measurement_salt, bytes)
    assert node.to_dict() == stored


def test_node_state_round_trips_a_node_and_unknown_fields():
    peer = {"vpn_ip": "10.118.0.1", "vpn_pub_key": pub_key_from_priv_key(generate_priv_key()),
            "public_ip": "10.42.0.11", "role": "coordinator"}
    saved = {"role": "node", "vpn_ip": "10.118.0.11", "vpn_priv_key": generate_priv_key(),
             "cluster_id": base64.b64encode(os.urandom(32)).decode(),
             "measurement_salt": base64.b64encode(os.urandom(32)).decode(), "admin_pub_key": admin_pem(),
             "coordinator_vpn_ip": "10.118.0.1", "coordinator_vpn_pub_key": None, "peers": [peer],
             "resource_version": -1, "disk_uuid": core.new_disk_uuid(), "state": 4, "owner_id": base64.b64encode(os.urandom(32)).decode()}
    node = NodeState.from_dict(saved)
    assert node.peers[0].vpn_ip == "10.118.0.1" and node.stored_state == State.IS_NODE
    assert node.to_dict() == saved
    assert state_store.check_node_state(node.to_dict()) == saved
    legacy = {k: v for k, v in saved.items() if k != "state"}
    assert NodeState.from_dict(legacy).stored_state == State.IS_NODE and NodeState.from_dict(legacy).to_dict() == legacy
    with pytest.raises(InputError, match="node_state.cluster_id"):
        NodeState.from_dict(dict(saved, cluster_id="AAAA"))


# --------------------------------------------------------------------------- node activation, no transport


def test_activate_nodes_through_a_connect_port(make_core, secret):
    coord, coord_vpn = coordinator(make_core, secret)
    node, _vpn = make_core(MemoryTPM())
    node.recovery.load()
    nodes = {"10.42.0.50:9000": node}

    def connect_node(endpoint):
        if endpoint not in nodes:
            raise OSError("connection refused")
        return FakeNodeClient(nodes[endpoint])

    rows = coord.activation.activate_nodes(["10.42.0.50:9000", "10.42.0.51:9000"], connect_node)
    assert rows[0]["ok"] and rows[0]["node_vpn_ip"] == "10.118.0.11" and node.state == State.IS_NODE
    assert rows[1] == {"node_public_endpoint": "10.42.0.51:9000", "ok": False, "node_vpn_ip": None,
                       "error": "connection refused", "action": None}
    assert node.context.read_disk_key() == kms.ClusterKMS(secret).state_disk_key(node.context.disk_uuid)
    assert [p.vpn_ip for p in coord_vpn.peers] == ["10.118.0.11"]
    with pytest.raises(InputError, match="node_public_endpoints"):
        coord.activation.activate_nodes([], connect_node)


def test_activation_names_each_node_as_the_admin_does(make_core, secret):
    """ActivateAdditionalNodes' ``node_names`` (the inventory names): each node's only kubelet node name, bound
    before the node is asked anything; a name another node has is refused and that node stays fresh."""
    coord, _vpn = coordinator(make_core, secret)
    nodes = {}
    for octet in (50, 51):
        nodes["10.42.0.%d:9000" % octet], _unused = make_core(MemoryTPM())
        nodes["10.42.0.%d:9000" % octet].recovery.load()
    first = coord.activation.activate_nodes(["10.42.0.50:9000"], lambda e: FakeNodeClient(nodes[e]),
                                            node_names={"10.42.0.50:9000": "worker-0"})
    assert first[0]["ok"] and coord.kubernetes.kubernetes_node_names(first[0]["node_vpn_ip"]) == ["worker-0"]
    second = coord.activation.activate_nodes(["10.42.0.51:9000"], lambda e: FakeNodeClient(nodes[e]),
                                             node_names={"10.42.0.51:9000": "worker-0"})
    assert not second[0]["ok"] and "node name worker-0 belongs to another node" in second[0]["error"]
    assert nodes["10.42.0.51:9000"].state == State.ACCEPTING_INIT
    assert coord.coordinator.reserve_node_ip() == "10.118.0.12"  # its reserved IP went back
    with pytest.raises(InputError, match="node_names"):
        coord.activation.activate_nodes(["10.42.0.51:9000"], lambda e: FakeNodeClient(nodes[e]),
                                        node_names={"10.42.0.52:9000": "worker-2"})
    with pytest.raises(InputError, match=r"node_names\[10.42.0.51:9000\]"):
        coord.activation.activate_nodes(["10.42.0.51:9000"], lambda e: FakeNodeClient(nodes[e]),
                                        node_names={"10.42.0.51:9000": "Not A Name"})


# --------------------------------------------------------------------------- the join, no transport


def test_join_through_ports(make_core, secret):
    coord, coord_vpn = coordinator(make_core, secret)
    node, _vpn = make_core(MemoryTPM())
    node.recovery.load()
    node.context.join_coordinator_pub_key = coord.signing.coordinator_pub_key()  # the agent config's coordinator_pub_key

    issuer = admitted_issuer(coord)

    def request_ticket(disk_uuid, node_vpn_pub_key, on_ticket):
        channel = FakeJoinChannel(issuer, on_ticket)
        channel.node_vpn_pub_key, channel.disk_uuid = node_vpn_pub_key, disk_uuid
        return coord.join_service.serve_join(disk_uuid, node_vpn_pub_key, channel, DummyValidator())

    result = node.node.join_cluster(request_ticket)
    assert result["node_vpn_ip"] == "10.118.0.11" and result["state"] == "IsNode"
    assert node.context.tpm.pcr15() == expected_pcr15(coord.context.cluster_id)
    assert [p.vpn_pub_key for p in coord_vpn.peers] == [node.context.vpn_pub_key]


def test_join_refuses_an_unbound_attestation_and_releases_the_ip(make_core, secret):
    coord, _vpn = coordinator(make_core, secret)
    channel = FakeJoinChannel(DummyIssuer(), lambda ticket: None)
    channel.node_vpn_pub_key, channel.disk_uuid = os.urandom(32), core.new_disk_uuid()  # not what is asked
    with pytest.raises(AttestationError, match="not bound"):
        coord.join_service.serve_join(core.new_disk_uuid(), os.urandom(32), channel, DummyValidator())
    # A node that takes the ticket but never confirms: its IP goes back to the pool.
    node_pub, disk_uuid = os.urandom(32), core.new_disk_uuid()
    channel = FakeJoinChannel(admitted_issuer(coord, "lost"), lambda ticket, binding: None, confirm=False)
    channel.node_vpn_pub_key, channel.disk_uuid = node_pub, disk_uuid
    with pytest.raises(ConnectionLost):
        coord.join_service.serve_join(disk_uuid, node_pub, channel, DummyValidator())
    assert coord.coordinator.reserve_node_ip() == "10.118.0.11"
    # ... and its admission is unbound again, its name free: the node may come back with another key.
    assert [a["joined"] for a in coord.admissions.listed()] == [False]
    assert coord.kubernetes.kubernetes_node_names("10.118.0.11") == []


def test_join_whose_confirmation_is_lost_says_so(make_core, secret):
    coord, _vpn = coordinator(make_core, secret)
    node, _vpn2 = make_core(MemoryTPM())
    node.recovery.load()
    node.context.join_coordinator_pub_key = coord.signing.coordinator_pub_key()

    def lost_after_ticket(disk_uuid, node_vpn_pub_key, on_ticket):
        on_ticket(coord.signing.signed_join_ticket(coord.join_service.issue_join_ticket(disk_uuid, coord.coordinator.reserve_node_ip()), b"b").to_dict(), b"b")
        raise ConnectionClosed("closed")

    with pytest.raises(ConstellationError, match="joined, but the Coordinator did not confirm"):
        node.node.join_cluster(lost_after_ticket)
    assert node.state == State.IS_NODE
    fresh, _vpn3 = make_core(MemoryTPM())
    fresh.recovery.load()

    def lost_before_ticket(disk_uuid, node_vpn_pub_key, on_ticket):
        raise ConnectionClosed("closed")

    with pytest.raises(ConnectionClosed):
        fresh.node.join_cluster(lost_before_ticket)
    assert fresh.state == State.ACCEPTING_INIT


@pytest.mark.parametrize("cut", ["after_lock", "after_record"])
def test_interrupted_node_activation_resumes_without_changing_a_key(make_core, secret, cut, monkeypatch):
    """The link dies at a step of ActivateAsNode. The node stays locked and waiting; the next
    ActivateAdditionalNodes resumes it (recording it from its attested GetState where the Coordinator
    had not), the node fetches its own disk key over the VPN (GetStateDiskKey), and nothing changes its
    WireGuard key or its VPN IP. A node of another cluster is refused."""
    from ansible_collections.constellation.cluster.plugins.module_utils.core import activation

    monkeypatch.setattr(activation, "RESUME_POLL", 0.01)
    coord, coord_vpn = coordinator(make_core, secret)
    node, node_vpn = make_core(MemoryTPM())
    node.recovery.load()
    rows = coord.activation.activate_nodes(["10.42.0.50:9000"], lambda endpoint: FakeNodeClient(node, cut=cut))
    assert not rows[0]["ok"] and "the next run resumes it" in rows[0]["error"]
    assert node.state == State.NODE_WAITING_FOR_CLUSTER_JOIN
    node_vpn_ip, node_pub_key = node.context.vpn_ip, node.context.vpn_pub_key
    recorded = [p.vpn_ip for p in coord_vpn.peers]
    assert recorded == ([node_vpn_ip] if cut == "after_record" else [])

    # The node's loop asks the Coordinator over the VPN; until the Coordinator knows it, it is refused.
    if cut == "after_lock":
        with pytest.raises(StateError, match="not a peer"):
            coord.activation.node_state_disk_key(node_vpn_ip)

    def node_fetches_its_key_meanwhile(endpoint):
        client = FakeNodeClient(node)
        real_get_state = client.get_state

        def get_state():
            answer = real_get_state()
            if node.state == State.NODE_WAITING_FOR_CLUSTER_JOIN and coord.coordinator.is_known_peer_ip(node_vpn_ip):
                node.node.finish_activation(lambda: coord.activation.node_state_disk_key(node_vpn_ip))  # the agent's loop
            return answer

        client.get_state = get_state
        return client

    rows = coord.activation.activate_nodes(["10.42.0.50:9000"], node_fetches_its_key_meanwhile)
    assert rows[0]["ok"] and rows[0]["action"] == "resumed" and rows[0]["node_vpn_ip"] == node_vpn_ip
    assert node.state == State.IS_NODE
    assert node.context.read_disk_key() == kms.ClusterKMS(secret).state_disk_key(node.context.disk_uuid)
    assert (node.context.vpn_ip, node.context.vpn_pub_key) == (node_vpn_ip, node_pub_key)
    assert [(p.vpn_ip, p.vpn_pub_key) for p in coord_vpn.peers] == [(node_vpn_ip, node_pub_key)]
    # A third run: nothing to do.
    rows = coord.activation.activate_nodes(["10.42.0.50:9000"], lambda endpoint: FakeNodeClient(node))
    assert rows[0]["ok"] and rows[0]["action"] == "none"
    # Only the node itself gets its disk key; another peer's VPN IP gets nothing.
    with pytest.raises(StateError):
        coord.activation.node_state_disk_key("10.118.0.99")

    stranger, _vpn = make_core(MemoryTPM())
    stranger.recovery.load()
    stranger.context.tpm.mark_initialized(os.urandom(32))  # locked to another cluster
    rows = coord.activation.activate_nodes(["10.42.0.60:9000"], lambda endpoint: FakeNodeClient(stranger))
    assert not rows[0]["ok"] and "another cluster" in rows[0]["error"]
