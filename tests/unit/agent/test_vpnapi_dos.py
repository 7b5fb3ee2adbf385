# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Denial of service is never eviction, on the Coordinator's vpnapi: an unprivileged process on a Node (it
shares the Node's VPN IP, not its WireGuard key) opens PeerAuth exchanges and never sends the proof. They must
not lock the Node's own agent out of the vpnapi (its updates, measurements and disk key).

A real Coordinator Core serves the real vpnapi FrameServer on loopback with the limits agent/wiring.py gives it;
the VPN is 127.77.0.0/16 and each client binds the source address of the peer it claims to be, as the WireGuard
tunnel would give it (tests/support/join_chain.py's Cluster). Loops are bounded; timeouts only detect a hang."""

from __future__ import annotations

import socket

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.rpc import schema
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import server as rpc_server
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import FrameStream, KIND_END, ConnectionClosed
from ansible_collections.constellation.cluster.plugins.module_utils.agent.peer_view import CorePeerView
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import MAX_PEER_CONNECTIONS, FrameServer
from ansible_collections.constellation.cluster.tests.support.join_chain import Cluster


@pytest.fixture
def cluster(tmp_path, control_plane_dir):
    made = Cluster(tmp_path, control_plane_dir, provider=False)
    made.server.stop()
    # As agent/wiring.py starts it.
    made.server = FrameServer("vpnapi", ("127.77.0.1", 0), made.api.handlers(), accept_check=made.api.accept_check,
                              apis=(schema.VPNAPI,), max_peer_connections=MAX_PEER_CONNECTIONS,
                              peer_view=CorePeerView(made.core)).start()
    made.port = made.server.address[1]
    yield made
    made.server.stop()


def held_peer_auth(cluster, source_ip):
    """A PeerAuth exchange left hanging: the request, the Coordinator's challenge, and never the proof."""
    sock = socket.create_connection(("127.77.0.1", cluster.port), timeout=10, source_address=(source_ip, 0))
    stream = FrameStream(sock)
    stream.send_request("PeerAuth", {})
    assert "challenge" in stream.recv_msg("the challenge")
    return sock, stream


def ended_by_server(stream, sock, within):
    """True when the server ends the hanging exchange (an error, then the end of the connection, or the end at
    once: replaced) within ``within`` seconds."""
    sock.settimeout(within)
    try:
        frame = stream.recv()
        if frame.kind != KIND_END or "error" not in frame.message:
            return False
        stream.recv()
    except ConnectionClosed:
        return True
    except Exception:  # pylint: disable=broad-except
        return False  # timed out: still held
    return False


def test_held_peer_auth_exchanges_do_not_lock_the_agent_out_of_its_vpnapi(cluster):
    """Attack: a process on the Node holds 8 PeerAuth exchanges (the per-source limit) from the Node's VPN IP.
    Before: each waited 300 s for its proof and its slot was never replaced, so the agent's own connection was
    closed at once: no GetUpdate, no measurements, no disk key. Now the agent's connection takes the place of
    the exchange waiting longest, its PeerAuth and GetUpdate succeed, its authenticated connection is not
    pushed out by the process's next 8, and every hanging exchange is ended within the short deadline."""
    node_ip = cluster.add_node("10.42.0.11")
    held = [held_peer_auth(cluster, node_ip) for _i in range(rpc_server.MAX_CONNECTIONS_PER_SOURCE)]
    try:
        with cluster.client(node_ip) as agent:  # the agent: PeerAuth with its WireGuard key
            answer = agent.get_update(-1)
            assert answer["resource_version"] >= 0
            held += [held_peer_auth(cluster, node_ip) for _i in range(rpc_server.MAX_CONNECTIONS_PER_SOURCE)]
            assert agent.get_update(-1)["resource_version"] == answer["resource_version"]
            assert len(agent.get_state_disk_key()) == 32
        ended = [ended_by_server(stream, sock, rpc_server.OWED_TIMEOUT + 10) for sock, stream in held]
        assert all(ended), "%d of %d hanging PeerAuth exchanges still held" % (ended.count(False), len(ended))
    finally:
        for sock, _stream in held:
            sock.close()
