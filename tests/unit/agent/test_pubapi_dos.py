# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Idle connections must not fill a Node's pubapi, and a Node that cannot be
reached (a handshake that times out, is reset or ends) is unreachable, never a failed attestation.
Real servers on loopback (the pubapi FrameServer with aTLS, the Core's re-attestation with the real
aTLS client); every loop is bounded and timeouts only detect a hang."""

from __future__ import annotations

import socket
import ssl
import threading
import time

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils import atls
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import DummyIssuer, DummyValidator
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import server as rpc_server
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient
from ansible_collections.constellation.cluster.plugins.module_utils.agent.wiring import pubapi_handlers
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import AgentServerContext, FrameServer
from ansible_collections.constellation.cluster.tests.support.sockets import BlackHole, connect_to
from ansible_collections.constellation.cluster.tests.support.core_fakes import RefusingValidator, close_all, pubapi_server

from ansible_collections.constellation.cluster.plugins.module_utils.agent.peer_view import CorePeerView


@pytest.fixture
def pubapi(swtpm, make_core):
    """A Node's pubapi + admin listener as the agent builds it (default limits)."""
    c, _vpn = make_core(swtpm)
    c.recovery.load()
    with pubapi_server(c) as server:
        yield server


def endpoint_of(server) -> str:
    return "127.0.0.1:%d" % server.address[1]


def connected_from(server, source: str) -> socket.socket:
    """A TCP connection to ``server`` from the loopback address ``source`` (a 10 s timeout)."""
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(10)
    sock.connect(("127.0.0.1", server.address[1]))
    return sock


def idle_tcp(server, count, source="127.0.0.1"):
    """``count`` TCP connections from ``source`` that never send a byte."""
    return [connected_from(server, source) for _i in range(count)]


def idle_tls(server, count, source):
    """``count`` aTLS connections from ``source``: handshake done (each cost the server a quote),
    then never a request."""
    socks = []
    for _i in range(count):
        raw = connected_from(server, source)
        try:
            socks.append(atls.client_handshake(raw, [DummyValidator()]).sock)
        except Exception:  # pylint: disable=broad-except
            pass  # replaced by a newer connection of ours before its handshake ended
    return socks


def closed_by_server(sock) -> bool:
    """True when the server ended the connection (EOF or reset); False when it still holds it open."""
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except socket.timeout:
        return False
    except (ssl.SSLError, OSError):
        return True


def reattest_like_a_coordinator(server, source="127.0.0.1"):
    """The Coordinator's re-attestation path (agent/wiring.py connect_peer): aTLS with its timeouts, GetState,
    from the Coordinator's address ``source``."""
    raw = connected_from(server, source)
    with AgentClient.connect(endpoint_of(server), [DummyValidator()], sock=raw, timeout=10) as client:
        return client.get_state()


def test_idle_connections_of_one_source_do_not_lock_out_the_coordinator(pubapi):
    """Attack (a): 64 idle aTLS connections (handshake done, never a request) and 6 idle TCP ones from
    one source. Today's main: the pool of 64 is full for 300 s and the Coordinator's handshake times
    out. Now: the source holds at most 8, each new connection replacing its longest idle one, and the
    Coordinator gets through."""
    handshaken = idle_tls(pubapi, rpc_server.MAX_CONNECTIONS, "127.0.0.1")  # those its handshake rate let through
    attacker = handshaken + idle_tcp(pubapi, 6)
    try:
        assert reattest_like_a_coordinator(pubapi, "127.0.0.100")["state"] == "AcceptingInit"
        assert pubapi.connection_count <= rpc_server.MAX_CONNECTIONS_PER_SOURCE + 1
        assert all(closed_by_server(s) for s in handshaken[:-rpc_server.MAX_CONNECTIONS_PER_SOURCE])  # replaced
    finally:
        close_all(attacker)


def test_idle_tls_connections_of_many_sources_do_not_fill_the_pool(pubapi):
    """Attack (a), spread over 8 source addresses x 8 attested-but-idle TLS connections (the pool's 64),
    then 8 idle TCP ones from a ninth: the pool never holds more than its 64 (the longest idle go), and
    the Coordinator still gets through."""
    attacker = []
    try:
        for octet in range(2, 10):
            attacker += idle_tls(pubapi, rpc_server.MAX_CONNECTIONS_PER_SOURCE, "127.0.0.%d" % octet)
        attacker += idle_tcp(pubapi, 8, "127.0.0.10")
        assert pubapi.connection_count <= rpc_server.MAX_CONNECTIONS
        state = reattest_like_a_coordinator(pubapi)
        assert state["state"] == "AcceptingInit"
        assert pubapi.connection_count <= rpc_server.MAX_CONNECTIONS
    finally:
        close_all(attacker)


def test_a_connection_that_sends_no_request_or_idles_unauthenticated_is_closed(swtpm, make_core):
    """The deadlines themselves (short here so the test ends quickly): no request after the handshake,
    or an unauthenticated connection idle after its request, is closed by the server."""
    c, _vpn = make_core(swtpm)
    c.recovery.load()
    tls = AgentServerContext(DummyIssuer(), key_pool_size=0)
    server = FrameServer("pubapi", ("127.0.0.1", 0), dict(pubapi_handlers(c, DummyValidator()).handlers()), tls=tls,
                         first_request_timeout=0.5, unauthenticated_idle_timeout=0.5, peer_view=CorePeerView(c)).start()
    try:
        silent = idle_tcp(server, 1)[0]
        client = AgentClient.connect(endpoint_of(server), [DummyValidator()], timeout=10)
        assert client.get_state()["state"] == "AcceptingInit"
        assert closed_by_server(silent)
        assert closed_by_server(client.sock)
        deadline = time.monotonic() + 10
        while server.connection_count and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.connection_count == 0
    finally:
        server.stop()
        tls.close()


def test_the_accept_loop_never_waits_for_a_slot_while_every_connection_is_busy(swtpm, make_core):
    """A pool of 2 whose both connections are busy in a request: a third connection is closed at once
    (the client learns it), not held in the accept loop while the loop waits for a slot."""
    c, _vpn = make_core(swtpm)
    c.recovery.load()
    entered, release = threading.Semaphore(0), threading.Event()

    def slow(conn, params):
        entered.release()
        release.wait(10)
        conn.stream.send_result({})

    server = FrameServer("pubapi", ("127.0.0.1", 0), {"Slow": slow}, max_connections=2).start()
    busy = [AgentClient.connect_plain(endpoint_of(server), timeout=10) for _i in range(2)]
    threads = [threading.Thread(target=b.call, args=("Slow",), daemon=True) for b in busy]
    try:
        for t in threads:
            t.start()
        assert entered.acquire(timeout=10) and entered.acquire(timeout=10)
        third = idle_tcp(server, 1)[0]
        assert closed_by_server(third)
        release.set()
        for t in threads:
            t.join(10)
        assert AgentClient.connect_plain(endpoint_of(server), timeout=10).call("Slow") == {}
    finally:
        release.set()
        server.stop()


# ------------------------------------------------- attack (b): unreachable is not a failed attestation


@pytest.mark.parametrize("reset", [False, True], ids=["silent", "reset"])
def test_a_node_whose_handshake_times_out_or_resets_is_unreachable_not_evicted(cluster, reset):
    """Attack (b): a Node's pubapi that accepts TCP but never answers the handshake (a full pool on
    today's main looks exactly like this), or resets it. Today's main: AttestationError, evicted on the
    first round. Now: unreachable, unverified after ``unreachable_limit`` rounds (evicted only after
    ``unverified_eviction_after``: tests/unit/agent/test_unverified_peers.py)."""
    c, _vpn, nodes = cluster
    hole = BlackHole(reset=reset)
    try:
        connect_peer = connect_to(hole.endpoint, [DummyValidator()])
        for round_ in (1, 2):
            rows = c.peer_trust.reattest_peers(connect_peer, unreachable_limit=3)
            assert {r["outcome"] for r in rows} == {"unreachable"}, rows
            assert all("attestation failed" not in r["error"] for r in rows)
        for node in nodes.values():
            assert not c.evictions.is_evicted(node["vpn_ip"]) and c.coordinator.is_known_peer_ip(node["vpn_ip"])
        assert c.get_state()["evicted"] == []
        rows = c.peer_trust.reattest_peers(connect_peer, unreachable_limit=3)  # the limit: unverified, not evicted
        assert {r["outcome"] for r in rows} == {"unverified"}
        assert c.get_state()["evicted"] == [] and len(c.get_state()["unverified"]) == len(nodes)
    finally:
        hole.close()


def test_a_document_that_arrives_and_fails_verification_still_evicts_at_once(cluster):
    """The other side of (b): a real server whose attestation arrives and is refused is evicted on the
    first round (AttestationError), as before."""
    c, _vpn, _nodes = cluster

    tls = AgentServerContext(DummyIssuer(), key_pool_size=0)
    server = FrameServer("pubapi", ("127.0.0.1", 0), {}, tls=tls).start()
    try:
        rows = c.peer_trust.reattest_peers(connect_to(endpoint_of(server), [RefusingValidator()], timeout=10))
        assert {r["outcome"] for r in rows} == {"evicted"}
        assert all("PCR 4" in r["error"] and r["error"].startswith("attestation failed") for r in rows)
    finally:
        server.stop()
        tls.close()
