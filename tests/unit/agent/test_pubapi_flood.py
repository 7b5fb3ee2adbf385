# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Denial of service is never eviction, on a Node's pubapi: exchanges that wait on an unauthenticated
client (AdminAuth's signature) have a short deadline and never keep the Coordinator out, ClientHellos are
rate-limited per source before any TPM quote, the quotes of ended connections are never made, and the
Coordinators keep room of their own.

Real servers on loopback: an activated Node (its Core on a swtpm) serves its pubapi and admin channel with the
qemu-vtpm issuer on that swtpm, the Coordinator's source address marked by the agent's own wiring
(pubapi.coordinator_sources, as agent/wiring.py wires it); the Coordinator's Core re-attests it through core/eviction/peer_trust.py with a real aTLS
handshake (a TPM quote), AdminAuth role coordinator and GetState. The attackers bind 127.0.0.N. Every loop is
bounded; timeouts only detect a hang."""

from __future__ import annotations

import os
import socket
import ssl
import threading
import time
import types

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils import atls, kms
from ansible_collections.constellation.cluster.plugins.module_utils.agent.pubapi import coordinator_sources
from ansible_collections.constellation.cluster.plugins.module_utils.agent.remote_exec import RemoteExec
from ansible_collections.constellation.cluster.plugins.module_utils.agent.wiring import admin_handlers, pubapi_handlers
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import DummyValidator
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import Measurements
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import schema
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import server as rpc_server
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import KIND_END, ConnectionClosed
from ansible_collections.constellation.cluster.plugins.module_utils.agent.peer_view import CorePeerView
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import AgentServerContext, FrameServer

from ansible_collections.constellation.cluster.tests.support.core_fakes import MemoryTPM, admin_pem, close_all
from ansible_collections.constellation.cluster.tests.support.core_fakes import FakeNodeClient

vtpm = pytest.importorskip("ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm")

COORDINATOR_IP = "127.0.0.50"
NODE_IP = "127.0.0.1"


class CountingIssuer:
    """The Node's qemu-vtpm issuer with a count of the quotes asked of the TPM (every ``issue`` is a TPM2_Quote);
    ``gate`` cleared holds each quote until it is set again; ``permits`` (a semaphore) lets one quote through
    per permit (a slow TPM, one quote at a time)."""

    def __init__(self, issuer):
        self.issuer = issuer
        self.oid = issuer.oid
        self.quotes = 0
        self.gate = threading.Event()
        self.gate.set()
        self.permits = None
        self._lock = threading.Lock()

    def issue(self, user_data, nonce):
        with self._lock:
            self.quotes += 1
        self.gate.wait(30)
        permits = self.permits
        if permits is not None:
            permits.acquire(timeout=30)  # pylint: disable=consider-using-with
        return self.issuer.issue(user_data, nonce)


@pytest.fixture
def node(swtpm, make_core):
    """(Coordinator Core, Node Core, the Node's pubapi FrameServer, its CountingIssuer): the Node activated by
    the Coordinator at 127.0.0.50 and recorded with public IP 127.0.0.1."""
    coordinator, _vpn = make_core(MemoryTPM(), public_ip=COORDINATOR_IP)
    coordinator.recovery.load()
    coordinator.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), admin_pem())
    peer, _node_vpn = make_core(swtpm, public_ip=NODE_IP)
    peer.recovery.load()
    rows = coordinator.activation.activate_nodes(["%s:9000" % NODE_IP], lambda endpoint: FakeNodeClient(peer))
    assert rows[0]["ok"], rows
    issuer = CountingIssuer(vtpm.VTPMIssuer(swtpm.tcti, event_log_path=None, banks=["sha256"]))
    tls = AgentServerContext(issuer, key_pool_size=0)
    admin = admin_handlers(peer)
    handlers = dict(pubapi_handlers(peer, DummyValidator()).handlers())
    handlers.update(admin.handlers(), **RemoteExec(peer.context.state_dir).handlers())
    # As agent/wiring.py builds it: the Node's Coordinators (from its peer set) get the reserved room.
    wiring = coordinator_sources(peer, types.SimpleNamespace(coordinator_public_endpoint=None))
    server = FrameServer("pubapi", (NODE_IP, 0), handlers, tls=tls, apis=(schema.PUBAPI, schema.ADMIN),
                         reserved_for=wiring, peer_view=CorePeerView(peer)).start()
    try:
        yield coordinator, peer, server, issuer
    finally:
        issuer.gate.set()
        server.stop()
        tls.close()
        issuer.issuer.close()


def bound_socket(server, source):
    raw = socket.socket()
    raw.bind((source, 0))
    raw.settimeout(10)
    raw.connect((NODE_IP, server.address[1]))
    return raw


def reattest(coordinator, server, rounds=3):
    """``rounds`` re-attestation rounds of the Coordinator's Core (core/eviction/peer_trust.py) over the real aTLS client from
    the Coordinator's address, as agent/wiring.py's connect_peer; the rows of each."""
    validator = vtpm.VTPMValidator(Measurements())

    def connect_peer(public_ip):
        raw = bound_socket(server, COORDINATOR_IP)
        return AgentClient.connect("%s:%d" % (public_ip, server.address[1]), [validator], sock=raw, timeout=10)

    return [coordinator.peer_trust.reattest_peers(connect_peer, unreachable_limit=3) for _round in range(rounds)]


def assert_not_evicted(coordinator, peer):
    vpn_ip = peer.context.vpn_ip
    assert coordinator.coordinator.is_known_peer_ip(vpn_ip) and not coordinator.evictions.is_evicted(vpn_ip)
    assert coordinator.get_state()["evicted"] == []


def held_admin_auth(server, source):
    """An AdminAuth exchange left hanging: the aTLS handshake (a quote), AdminAuth, the Node's challenge, and
    then never the signature."""
    client = AgentClient.connect("%s:%d" % (NODE_IP, server.address[1]), [vtpm.VTPMValidator(Measurements())],
                                 sock=bound_socket(server, source), timeout=10)
    client.stream.send_request("AdminAuth", {})
    assert "challenge" in client.stream.recv_msg("the challenge")
    return client


def ended_by_server(client, within):
    """True when the server answers the hanging exchange with an error and closes the connection within
    ``within`` seconds; False when it still holds it then."""
    client.sock.settimeout(within)
    try:
        frame = client.stream.recv()
        if frame.kind != KIND_END or "error" not in frame.message:
            return False
        client.stream.recv()
    except ConnectionClosed:
        return True
    except Exception:  # pylint: disable=broad-except
        return False  # timed out: still held
    return False


def send_client_hello(server, source):
    """A ClientHello with a fresh nonce, sent without waiting for the answer; the socket stays open."""
    raw = socket.socket()
    raw.bind((source, 0))
    raw.settimeout(10)
    raw.connect((NODE_IP, server.address[1]))
    tls = atls.client_context().wrap_socket(raw, server_hostname=atls.encode_nonce(os.urandom(atls.NONCE_SIZE)),
                                            do_handshake_on_connect=False)
    tls.setblocking(False)
    try:
        tls.do_handshake()
    except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
        pass
    except (ssl.SSLError, OSError):
        pass  # refused at once (rate limited, or replaced by a newer one of ours)
    return tls


def settled(server, count, within=30.0):
    """Waits until the server holds ``count`` connections (every connection thread that ended is gone)."""
    deadline = time.monotonic() + within
    while server.connection_count != count and time.monotonic() < deadline:
        time.sleep(0.05)
    return server.connection_count == count


def test_idle_admin_auth_exchanges_do_not_lock_out_the_coordinator(node):
    """Attack: 64 AdminAuth exchanges from 8 addresses (8 each, the per-source limit) take the Node's challenge
    and never send the signature, which fills the pool of 64 with connections in a request. Before: each held
    its slot for the 300 s read timeout and was never replaced; the Coordinator's re-attestation saw the Node
    unreachable three rounds in a row and evicted it. Now the Coordinator's three rounds pass (its real
    handshake, quote, AdminAuth role coordinator and GetState), nobody is evicted, another newcomer takes the
    slot of the exchange waiting longest, and every hanging exchange is ended within the short deadline."""
    coordinator, peer, server, _issuer = node
    flood = []
    try:
        for octet in range(2, 10):
            flood += [held_admin_auth(server, "127.0.0.%d" % octet) for _i in range(rpc_server.MAX_CONNECTIONS_PER_SOURCE)]
        assert len(flood) == rpc_server.MAX_CONNECTIONS
        for rows in reattest(coordinator, server):
            assert [r["outcome"] for r in rows] == ["passed"], rows
        assert_not_evicted(coordinator, peer)
        # Outside the Coordinators' room too: a newcomer takes the slot of the exchange waiting longest.
        with AgentClient.connect("%s:%d" % (NODE_IP, server.address[1]), [vtpm.VTPMValidator(Measurements())],
                                 sock=bound_socket(server, "127.0.0.60"), timeout=10) as newcomer:
            assert newcomer.get_state()["state"] == "IsNode"
        ended = [ended_by_server(c, rpc_server.OWED_TIMEOUT + 10) for c in flood]
        assert all(ended), "%d of %d hanging AdminAuth exchanges still held" % (ended.count(False), len(ended))
    finally:
        close_all(c.sock for c in flood)


def test_a_client_hello_flood_from_one_source_is_rate_limited_before_any_quote(node):
    """Attack: ClientHellos from one source, faster than 20 a second, each asking the Node's TPM for a quote.
    Before: every hello cost a quote (even those of connections replaced meanwhile, queued up to 30 s), and a
    hardware-speed TPM could not keep up. Now the source's handshakes are rate-limited before the slot, the
    thread or any quote: the TPM quotes at most the bucket's burst and refill, and the Coordinator's
    re-attestation passes."""
    coordinator, peer, server, issuer = node
    burst, per_second = rpc_server.HANDSHAKE_RATE
    flood = []
    started = time.monotonic()
    try:
        for _i in range(60):
            flood.append(send_client_hello(server, "127.0.0.7"))
            time.sleep(0.01)
        assert len(flood) / (time.monotonic() - started) > 20
        (rows,) = reattest(coordinator, server, rounds=1)
        assert [r["outcome"] for r in rows] == ["passed"], rows
        accepted_by = time.monotonic() - started  # the server accepted the flood before the Coordinator's connection
    finally:
        close_all(flood)
    assert settled(server, 0)
    # The Coordinator's handshake: one quote. The flood: at most what its source's bucket let through.
    assert issuer.quotes <= 1 + burst + per_second * accepted_by, (issuer.quotes, len(flood))
    assert_not_evicted(coordinator, peer)


def test_the_quotes_of_connections_closed_while_queued_are_never_made(node):
    """Attack: while the TPM is busy with one quote, ClientHellos from 10 addresses queue theirs and their
    connections close. Before: every queued quote was still made, one after another, each up to 30 s of
    TPM time for a connection nobody holds. Now a quote whose connection ended leaves the queue unmade, and
    the Coordinator's next handshake is quoted at once."""
    coordinator, peer, server, issuer = node
    issuer.gate.clear()  # the TPM's current quote takes long
    first = send_client_hello(server, "127.0.0.20")
    queued = []
    try:
        deadline = time.monotonic() + 10
        while issuer.quotes < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert issuer.quotes == 1
        queued = [send_client_hello(server, "127.0.0.%d" % octet) for octet in range(21, 31)]
        assert settled(server, 11)
        time.sleep(0.5)  # their hellos reach the server and their quotes queue
        close_all(queued)
        time.sleep(0.5)  # the server sees them closed
        issuer.gate.set()
        assert settled(server, 1)
        assert issuer.quotes == 1, "%d quotes made for connections that had closed" % (issuer.quotes - 1)
        (rows,) = reattest(coordinator, server, rounds=1)
        assert [r["outcome"] for r in rows] == ["passed"], rows
        assert issuer.quotes == 2
    finally:
        issuer.gate.set()
        close_all(queued + [first])
    assert_not_evicted(coordinator, peer)


def wait_for(condition, within=10.0):
    deadline = time.monotonic() + within
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def test_the_coordinators_quote_goes_before_those_of_a_strangers_flood(node):
    """Attack: ClientHellos from 6 addresses (each within its own rate) keep the Node's TPM busy, each quote taking
    long. Before: every handshake waited for the TPM in arrival order, the Coordinator's after the whole flood, and
    its handshake timed out (unreachable; three such rounds evicted the Node). Now the quote of a connection from
    the Node's Coordinator goes before every waiting one: after the quote in progress, the next the TPM makes is
    the Coordinator's, and its re-attestation passes."""
    coordinator, peer, server, issuer = node
    issuer.permits = threading.Semaphore(0)  # the TPM makes a quote only when the test lets it
    strangers, result = [], {}
    worker = threading.Thread(target=lambda: result.update(rows=reattest(coordinator, server, rounds=1)[0]), daemon=True)
    try:
        strangers = [send_client_hello(server, "127.0.0.%d" % octet) for octet in range(40, 46)]
        assert wait_for(lambda: issuer.quotes >= 1)  # the first is at the TPM, the others wait
        assert wait_for(lambda: server.connection_count == len(strangers))
        time.sleep(0.5)  # their hellos reach the server and their quotes queue
        worker.start()
        time.sleep(0.5)  # the Coordinator's hello queues too
        issuer.permits.release(2)  # the quote in progress, then the next one
        worker.join(30)
        assert not worker.is_alive()
        assert [r["outcome"] for r in result["rows"]] == ["passed"], result["rows"]
    finally:
        permits, issuer.permits = issuer.permits, None
        permits.release(20)
        close_all(strangers)
    assert_not_evicted(coordinator, peer)


def test_the_coordinators_keep_their_room_when_every_other_slot_is_busy():
    """Attack: every slot of the pool is busy in a request (here a pool of 2 and a handler that waits). A
    stranger's connection is refused, the Coordinator's gets through on the room kept for its address
    (``reserved_for``, the agent's coordinator_sources)."""
    entered, release = threading.Semaphore(0), threading.Event()

    def slow(conn, params):
        entered.release()
        release.wait(10)
        conn.stream.send_result({})

    def fast(conn, params):
        conn.stream.send_result({"ok": True})

    server = FrameServer("pubapi", ("127.0.0.1", 0), {"Slow": slow, "Fast": fast}, max_connections=2,
                         reserved_for=lambda ip: ip == COORDINATOR_IP).start()
    endpoint = "127.0.0.1:%d" % server.address[1]
    busy = [AgentClient.connect_plain(endpoint, sock=bound_socket(server, "127.0.0.%d" % (2 + i)), timeout=10)
            for i in range(2)]
    threads = [threading.Thread(target=b.call, args=("Slow",), daemon=True) for b in busy]
    try:
        for t in threads:
            t.start()
        assert entered.acquire(timeout=10) and entered.acquire(timeout=10)
        stranger = bound_socket(server, "127.0.0.9")
        stranger.settimeout(5)
        try:
            assert stranger.recv(1) == b""  # closed at once: no slot
        except ConnectionResetError:
            pass
        ours = AgentClient.connect_plain(endpoint, sock=bound_socket(server, COORDINATOR_IP), timeout=10)
        assert ours.call("Fast") == {"ok": True}
    finally:
        release.set()
        for t in threads:
            t.join(10)
        server.stop()
