"""Caller authentication of the vpnapi, attacked over real sockets: were the vpnapi to authorise by source IP
only, any process on a Node (an unprivileged user, a hostNetwork pod) that connects from the Node's VPN IP
would get the control-plane PKI (ca.key, sa.key, the front-proxy and etcd CA keys), a certificate key, the
node's disk key and data keys. So a connection must first prove the WireGuard private key the Coordinator's
registry recorded for that address (PeerAuth); control-plane material goes only to a node the admin
designated a control plane; GetDataKey IDs are namespaced per caller.

A real Coordinator Core with its kubeadm provider (the kubeadm TEST DOUBLE's control plane) serves the
real vpnapi FrameServer on loopback; the VPN is 127.77.0.0/16, and each client binds the source address
of the peer it claims to be, as the WireGuard tunnel would give it (tests/support/join_chain.py's Cluster)."""

from __future__ import annotations

import base64
import os
import socket

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.module_utils.core.records import node_records, state_store
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import access, schema
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import (
    KIND_END,
    FrameStream,
    ProtocolError,
    RemoteError,
    b64d,
    b64e,
)
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import generate_priv_key, peer_auth, pub_key_from_priv_key
from ansible_collections.constellation.cluster.tests.support.join_chain import Cluster
from ansible_collections.constellation.cluster.tests.support.sockets import RecordingSocket

SECRET_PKI_FILES = ("ca.key", "sa.key", "front-proxy-ca.key", "etcd/ca.key")


@pytest.fixture
def cluster(tmp_path, initialised, control_plane_dir):
    made = Cluster(tmp_path, control_plane_dir)
    yield made
    made.server.stop()


def raw_connection(cluster, source_ip):
    sock = socket.create_connection(("127.77.0.1", cluster.port), timeout=10, source_address=(source_ip, 0))
    recording = RecordingSocket(sock)
    return recording, FrameStream(recording)


def ask(stream, method, params=None):
    """One request; the END's message (an error or a result)."""
    stream.send_request(method, params or {})
    frame = stream.recv()
    while frame.kind != KIND_END:
        frame = stream.recv()
    return frame.message


def secrets_of(cluster, node_ip):
    """Everything secret the vpnapi could hand a caller at ``node_ip``: the PKI keys, the node's disk key,
    the data key an unnamespaced GetDataKey("foo") gave."""
    found = []
    for name in SECRET_PKI_FILES:
        with open(os.path.join(cluster.control_plane_dir, "pki", name), "rb") as handle:
            data = handle.read()
        found += [data, base64.b64encode(data)]
    disk_uuid = node_records.load_node_disk_uuid(cluster.core.context.store, node_ip)
    disk_key = cluster.core.coordinator.state_disk_key(disk_uuid)
    found += [disk_key, base64.b64encode(disk_key)]
    master = kms.open_kms(state_store.load_kms_data(cluster.core.context.local_store)["kms_uri"])
    any_key = master.derive_key("foo", 32)
    found += [any_key, base64.b64encode(any_key)]
    return found


# Every vpnapi method that needs PeerAuth, from the schema (a new one is attacked too), with the most one could ask.
PARAMS = {"GetJoinArgs": {"is_control_plane": True}, "GetDataKey": {"data_key_id": "foo"},
          "GetUpdate": {"resource_version": -1}}
ATTACKS = [(m.name, PARAMS.get(m.name, {})) for m in schema.methods_of(schema.VPNAPI)
           if m.access.caller in access.PEER_CALLERS] + [("GetJoinArgs", {})]


def test_a_process_on_a_node_without_its_wireguard_key_gets_nothing(cluster):
    # The most a caller could get: a designated control plane's address.
    node_ip = cluster.add_node("10.42.0.11", control_plane=True)
    before = cluster.tokens()
    sock, stream = raw_connection(cluster, node_ip)  # from the Node's VPN IP, as any local process can
    with sock.sock:
        for method, params in ATTACKS:
            answer = ask(stream, method, params)
            assert answer.get("error", {}).get("kind") == "AccessDenied", (method, answer)
            assert "PeerAuth first" in answer["error"]["message"]
        # A proof made with any other key (the process's own) is refused, and the connection stays
        # unauthenticated.
        stream.send_request("PeerAuth", {})
        step = stream.recv_msg("a challenge")
        challenge = b64d(step["challenge"], "challenge", 32)
        forged = peer_auth.PairKeys(generate_priv_key()).proof(step["server_vpn_pub_key"], challenge, node_ip,
                                                               "127.77.0.1")
        stream.send_msg({"proof": b64e(forged)})
        end = stream.recv()
        assert end.kind == KIND_END and end.message["error"]["kind"] == "AccessDenied"
        assert "did not prove the WireGuard private key" in end.message["error"]["message"]
        for method, params in ATTACKS:
            assert ask(stream, method, params)["error"]["kind"] == "AccessDenied"
    received = bytes(sock.received)
    for secret in secrets_of(cluster, node_ip):
        assert secret not in received
    assert cluster.tokens() == before  # not even a bootstrap token was made
    # The agent itself, holding the key, gets what it is entitled to.
    with cluster.client(node_ip) as client:
        assert len(client.get_certificate_key()) == 64


def test_a_proof_from_another_connection_is_worth_nothing(cluster):
    node_ip = cluster.add_node("10.42.0.11")
    keys = peer_auth.PairKeys(cluster.keys[node_ip])
    # Seen on one connection (e.g. replayed by whoever watched the agent's traffic)...
    sock, stream = raw_connection(cluster, node_ip)
    with sock.sock:
        stream.send_request("PeerAuth", {})
        step = stream.recv_msg("a challenge")
        seen = keys.proof(step["server_vpn_pub_key"], b64d(step["challenge"], "challenge", 32), node_ip, "127.77.0.1")
        stream.send_msg({"proof": b64e(seen)})
        assert stream.recv().message["result"] == {"authenticated": True}
    # ... and sent again on a new one: a new challenge, the old proof fails.
    sock, stream = raw_connection(cluster, node_ip)
    with sock.sock:
        stream.send_request("PeerAuth", {})
        stream.recv_msg("a challenge")
        stream.send_msg({"proof": b64e(seen)})
        assert stream.recv().message["error"]["kind"] == "AccessDenied"
        assert ask(stream, "GetDataKey", {"data_key_id": "foo"})["error"]["kind"] == "AccessDenied"


def test_a_node_the_admin_did_not_designate_gets_no_control_plane_material(cluster):
    worker = cluster.add_node("10.42.0.11")  # activated without the control-plane designation
    before = cluster.tokens()
    with cluster.client(worker) as client:  # the real agent, authenticated
        with pytest.raises(RemoteError) as err:
            client.get_join_args(is_control_plane=True)
        assert err.value.kind == "AccessDenied"
        assert "is_control_plane: %s is not designated a control plane by the admin" % worker in str(err.value)
        with pytest.raises(RemoteError) as err:
            client.get_certificate_key()
        assert err.value.kind == "AccessDenied" and "not designated a control plane" in str(err.value)
        assert cluster.tokens() == before  # refused before anything was made
        args = client.get_join_args()  # a worker's join is still its own
    assert "control_plane_files" not in args
    # The designation is bound to the node's WireGuard key: a new peer at the same VPN IP inherits nothing.
    designated = cluster.add_node("10.42.0.12", control_plane=True)
    cluster.core.coordinator.remove_peer(designated)
    reused = cluster.core.coordinator.reserve_node_ip()  # as a join reserves it
    assert reused == designated
    cluster.keys[reused] = generate_priv_key()
    cluster.core.coordinator.add_node_peer(reused, pub_key_from_priv_key(cluster.keys[reused]), "10.42.0.13")
    with cluster.client(reused) as client:
        with pytest.raises(RemoteError, match="not designated a control plane"):
            client.get_certificate_key()


def test_get_data_key_ids_are_namespaced_per_caller(cluster):
    alice, bob = cluster.add_node("10.42.0.11"), cluster.add_node("10.42.0.12")
    with cluster.client(alice) as client:
        alice_key = client.get_data_key("foo")
        assert client.get_data_key("foo") == alice_key  # stable for its owner
    with cluster.client(bob) as client:
        bob_key = client.get_data_key("foo")
        with pytest.raises(RemoteError, match="reserved"):
            client.get_data_key(kms.MEASUREMENT_SECRET_KEY_ID)
    master = kms.open_kms(state_store.load_kms_data(cluster.core.context.local_store)["kms_uri"])
    assert alice_key != bob_key and master.derive_key("foo", 32) not in (alice_key, bob_key)
    namespace = "peer/%s/" % cluster.core.peer_access.vpn_peer_record(alice).vpn_pub_key
    assert alice_key == master.derive_key(namespace + "foo", 32)


def test_the_agent_gives_no_proof_to_a_server_with_another_key(cluster):
    node_ip = cluster.add_node("10.42.0.11")
    with cluster.client(node_ip, authenticate=False) as client:
        with pytest.raises(ProtocolError, match="PeerAuth: server_vpn_pub_key: expected the WireGuard key this peer knows"):
            client.peer_auth(cluster.keys[node_ip], peer_auth.PairKeys(generate_priv_key()).own_pub_key)


def test_the_proof_binds_both_ends_and_the_servers_key():
    node, coordinator = generate_priv_key(), generate_priv_key()
    node_keys, coordinator_keys = peer_auth.PairKeys(node), peer_auth.PairKeys(coordinator)
    challenge = os.urandom(32)
    proof = node_keys.proof(coordinator_keys.own_pub_key, challenge, "10.118.0.11", "10.118.0.1")
    assert coordinator_keys.check(node_keys.own_pub_key, proof, challenge, "10.118.0.11", "10.118.0.1")
    for args in ((os.urandom(32), "10.118.0.11", "10.118.0.1"), (challenge, "10.118.0.12", "10.118.0.1"),
                 (challenge, "10.118.0.11", "10.118.0.2")):
        assert not coordinator_keys.check(node_keys.own_pub_key, proof, *args)
    other = peer_auth.PairKeys(generate_priv_key())  # another Coordinator
    assert not other.check(node_keys.own_pub_key, proof, challenge, "10.118.0.11", "10.118.0.1")
    assert not coordinator_keys.check(other.own_pub_key, proof, challenge, "10.118.0.11", "10.118.0.1")
    assert not coordinator_keys.check(node_keys.own_pub_key, proof[:31], challenge, "10.118.0.11", "10.118.0.1")
    # A low-order public key has no shared secret: refused, not a key of zeros.
    assert not coordinator_keys.check(base64.b64encode(bytes(32)).decode(), proof, challenge, "10.118.0.11",
                                      "10.118.0.1")
