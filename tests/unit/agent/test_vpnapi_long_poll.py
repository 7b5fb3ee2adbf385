# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GetUpdate's long poll over real sockets: a real Coordinator Core and the real vpnapi FrameServer on
loopback (VPN 127.77.0.0/16, each client bound to the VPN IP of the peer it claims to be, as tests/support/join_chain.py's
Cluster). A held GetUpdate wakes on a change of the peer set, returns at its bounded wait, ends with AccessDenied
and no peers when its Node is evicted meanwhile; a non-peer and an unauthenticated connection hold nothing; a Node
of an older version (no ``wait``) is answered at once. The server's budgets: a Node's PeerAuth'd connection is in the
peers' budget, which strangers' connections never push out, and at most MAX_PEER_CONNECTIONS_PER_SOURCE per VPN IP."""

from __future__ import annotations

import socket
import threading

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.agent.long_poll import JITTER, LongPoll
from ansible_collections.constellation.cluster.plugins.module_utils.agent.vpnapi import MAX_WAIT
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import schema
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import RemoteError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import (
    MAX_PEER_CONNECTIONS_PER_SOURCE,
    FrameServer,
)
from ansible_collections.constellation.cluster.tests.support.join_chain import Cluster
from ansible_collections.constellation.cluster.tests.support.sockets import RecordingSocket
from ansible_collections.constellation.cluster.plugins.module_utils.agent.peer_view import CorePeerView

LONG = 30.0  # a wait no test sits out: the answer must come from a change (the join below would fail first)


@pytest.fixture
def cluster(tmp_path):
    made = Cluster(tmp_path, str(tmp_path / "kubernetes"), provider=False)
    made.server.stop()  # the vpnapi as the agent serves it: with the peers' connection budget
    made.server = FrameServer("vpnapi", ("127.77.0.1", 0), made.api.handlers(), accept_check=made.api.accept_check,
                              apis=(schema.VPNAPI,), max_connections=4, max_per_source=2, max_peer_connections=16,
                              peer_view=CorePeerView(made.core)).start()
    made.port = made.server.address[1]
    yield made
    made.server.stop()


class Held:
    """A GetUpdate(wait) in a thread, on a PeerAuth'd connection whose received bytes are kept."""

    def __init__(self, cluster, node_ip, version, wait=LONG):
        sock = socket.create_connection(("127.77.0.1", cluster.port), timeout=LONG + 10, source_address=(node_ip, 0))
        self.recording = RecordingSocket(sock)
        self.client = AgentClient.connect_plain("127.77.0.1:%d" % cluster.port, sock=self.recording, timeout=LONG + 10)
        self.client.peer_auth(cluster.keys[node_ip], cluster.core.context.vpn_pub_key)
        self.answer = self.error = None
        self.thread = threading.Thread(target=self._run, args=(version, wait), daemon=True)
        self.thread.start()

    def _run(self, version, wait):
        try:
            self.answer = self.client.get_update(version, wait=wait)
        except RemoteError as err:
            self.error = err

    def result(self):
        self.thread.join(LONG + 5)
        assert not self.thread.is_alive(), "the held GetUpdate did not end"
        self.client.close()
        return self.answer, self.error


def _version(cluster):
    return cluster.core.coordinator.peer_version()


def test_a_held_get_update_wakes_on_a_change_and_carries_it(cluster):
    node_ip = cluster.add_node("10.42.0.11")
    held = Held(cluster, node_ip, _version(cluster))
    new_ip = cluster.add_node("10.42.0.12")  # a new peer: the held request answers now, with it
    answer, error = held.result()
    assert error is None and answer["long_poll"] is True
    assert answer["resource_version"] == _version(cluster)
    assert [p["vpn_ip"] for p in answer["added"]] == [new_ip] and answer["signature"]


def test_a_held_get_update_returns_at_its_bounded_wait_and_a_behind_node_at_once(cluster):
    node_ip = cluster.add_node("10.42.0.11")
    version = _version(cluster)
    answer, error = Held(cluster, node_ip, version, wait=0.2).result()
    assert error is None and answer == {"resource_version": version, "long_poll": True}
    # A Node behind the current version is not held: its delta comes at once (the wait is never sat out).
    answer, error = Held(cluster, node_ip, version - 1).result()
    assert error is None and answer["resource_version"] == version and answer["long_poll"] is True


def test_an_older_node_is_answered_at_once_without_the_long_poll_field(cluster):
    node_ip = cluster.add_node("10.42.0.11")
    with cluster.client(node_ip) as client:
        assert client.get_update(_version(cluster)) == {"resource_version": _version(cluster)}


def test_an_eviction_ends_a_held_get_update_refused_with_no_peers_sent(cluster):
    node_ip = cluster.add_node("10.42.0.11")
    other_ip = cluster.add_node("10.42.0.12")
    other_key = cluster.core.peer_access.vpn_peer_record(other_ip).vpn_pub_key
    held = Held(cluster, node_ip, _version(cluster))
    cluster.core.peer_trust.evict_peer(node_ip, "attestation failed: a test")  # evicted while it waits
    answer, error = held.result()
    assert answer is None and error.kind == "AccessDenied" and "evicted" in str(error)
    received = bytes(held.recording.received)
    tail = received[received.index(b'"authenticated"'):]  # all after PeerAuth's answer: the refusal only
    assert other_key.encode() not in tail and b'"added"' not in tail and b'"removed"' not in tail
    assert b"signature" not in tail and b"resource_version" not in tail


def test_a_non_peer_and_an_unauthenticated_connection_hold_nothing(cluster):
    node_ip = cluster.add_node("10.42.0.11")
    with pytest.raises((RemoteError, OSError)) as err:
        with cluster.client("127.77.0.99") as client:  # in the VPN range, no peer
            client.get_update(_version(cluster), wait=LONG)
    if isinstance(err.value, RemoteError):
        assert err.value.kind == "AccessDenied" and "not a VPN peer" in str(err.value)
    with cluster.client(node_ip, authenticate=False) as client:  # a process on the Node without its key
        with pytest.raises(RemoteError) as err:
            client.get_update(_version(cluster), wait=LONG)  # refused at once, not held
        assert err.value.kind == "AccessDenied" and "PeerAuth first" in str(err.value)


@pytest.mark.parametrize("wait", [0, -1, MAX_WAIT + 1])
def test_a_wait_out_of_range_is_refused(cluster, wait):
    node_ip = cluster.add_node("10.42.0.11")
    with cluster.client(node_ip) as client:
        with pytest.raises(RemoteError) as err:
            client.get_update(_version(cluster), wait=wait)
        assert err.value.kind == "InputError" and "wait" in str(err.value)


def test_strangers_connections_never_push_out_the_held_polls(cluster):
    """4 general slots, 2 per source: 3 Nodes hold long polls (the peers' budget); a process on a Node opens
    unauthenticated connections, more than the general budget holds: they replace each other (or are refused),
    never a held poll, which all answer at the next change."""
    nodes = [cluster.add_node("10.42.0.%d" % (11 + i)) for i in range(3)]
    version = _version(cluster)
    held = [Held(cluster, ip, version) for ip in nodes]
    strangers = []
    try:
        for _i in range(8):
            for ip in nodes:
                try:
                    sock = socket.create_connection(("127.77.0.1", cluster.port), timeout=5, source_address=(ip, 0))
                    strangers.append(sock)
                except OSError:
                    pass
        assert cluster.server.connection_count <= 4 + 3
        cluster.add_node("10.42.0.20")
        for one in held:
            answer, error = one.result()
            assert error is None and answer["resource_version"] == version + 1 and answer["long_poll"] is True
    finally:
        for sock in strangers:
            sock.close()


def test_a_node_has_at_most_its_share_of_the_peers_budget(cluster):
    """More PeerAuth'd connections of one VPN IP than MAX_PEER_CONNECTIONS_PER_SOURCE: the others stay in the
    general budget (4 slots, 2 per source), where a newer connection of that source replaces an idle one."""
    node_ip = cluster.add_node("10.42.0.11")
    version = _version(cluster)
    held = [Held(cluster, node_ip, version) for _i in range(MAX_PEER_CONNECTIONS_PER_SOURCE)]
    extra = [cluster.client(node_ip) for _i in range(2)]  # PeerAuth'd and idle: the general budget
    with cluster.server._conns_lock:  # pylint: disable=protected-access
        peers = list(cluster.server._peer_slots.values())  # pylint: disable=protected-access
        general = list(cluster.server._slots.values())  # pylint: disable=protected-access
    assert len(peers) == MAX_PEER_CONNECTIONS_PER_SOURCE and all(s.peer for s in peers)
    assert len(general) == 2 and not any(s.peer for s in general)
    cluster.add_node("10.42.0.12")
    for one in held:
        assert one.result()[0]["long_poll"] is True
    for client in extra:
        client.close()


# ------------------------------------------------------------------ the Node's side (agent/long_poll.py)


def _long_poll(cluster, node_ip, wait=LONG, waits=None, draw=None):
    """The Node's LongPoll, its connections from its VPN IP (as the WireGuard tunnel gives them); ``waits``: a list
    that gets the ``wait`` of every GetUpdate sent."""
    def connect(endpoint, timeout):
        host, port = endpoint.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=5, source_address=(node_ip, 0))
        client = AgentClient.connect_plain(endpoint, sock=sock, timeout=timeout)
        if waits is not None:
            sent = client.get_update
            client.get_update = lambda version, wait=None: waits.append(wait) or sent(version, wait=wait)
        return client

    def authenticate(client):
        return client.peer_auth(cluster.keys[node_ip], cluster.core.context.vpn_pub_key)

    return LongPoll(cluster.port, wait, authenticate, connect, **({"draw": draw} if draw else {}))


def test_each_held_request_waits_its_own_share_of_the_interval(cluster):
    """After a change every Node holds again at once: each request's wait is drawn in [(1 - JITTER) x wait, wait],
    so their answers do not all fall due together."""
    node_ip = cluster.add_node("10.42.0.11")
    waits = []
    draws = iter([0.0, 1.0, 0.5])
    poll = _long_poll(cluster, node_ip, wait=0.4, waits=waits, draw=lambda: next(draws))
    version = _version(cluster)
    for _i in range(3):
        assert poll.get_update("127.77.0.1", version) == {"resource_version": version, "long_poll": True}
    assert waits == pytest.approx([0.4, 0.4 * (1 - JITTER), 0.4 * (1 - JITTER / 2)])
    poll.close()
    # The agent's own source: every wait within the bounds, not all the same.
    waits = []
    poll = _long_poll(cluster, node_ip, wait=0.2, waits=waits)
    for _i in range(6):
        poll.get_update("127.77.0.1", version)
    poll.close()
    assert all(0.2 * (1 - JITTER) <= wait <= 0.2 for wait in waits) and len(set(waits)) > 1


def test_the_node_keeps_one_connection_and_falls_back_when_it_fails(cluster):
    node_ip = cluster.add_node("10.42.0.11")
    poll = _long_poll(cluster, node_ip, wait=0.2)
    version = _version(cluster)
    first = poll.get_update("127.77.0.1", version)
    held = poll._held  # pylint: disable=protected-access
    second = poll.get_update("127.77.0.1", version)
    assert first == second == {"resource_version": version, "long_poll": True}
    assert poll._held is held and cluster.server.connection_count == 1  # pylint: disable=protected-access
    cluster.server.stop()  # the Coordinator goes away: no answer, the caller polls as before (its failover)
    assert poll.get_update("127.77.0.1", version) is None and poll._held is None  # pylint: disable=protected-access


def test_close_ends_a_held_get_update_at_once(cluster):
    node_ip = cluster.add_node("10.42.0.11")
    poll = _long_poll(cluster, node_ip)
    out = []
    thread = threading.Thread(target=lambda: out.append(poll.get_update("127.77.0.1", _version(cluster))), daemon=True)
    thread.start()
    for _i in range(200):  # until it is held (its connection is in the peers' budget)
        with cluster.server._conns_lock:  # pylint: disable=protected-access
            if any(s.phase == "busy" for s in cluster.server._peer_slots.values()):  # pylint: disable=protected-access
                break
        threading.Event().wait(0.02)
    poll.close()  # the agent stops
    thread.join(LONG)
    assert not thread.is_alive() and out == [None]


def test_an_older_coordinator_is_polled_as_before(cluster):
    """Its GetUpdate ignores ``wait`` and answers at once (no ``long_poll``): the answer is used, the Coordinator
    is remembered, and the next call says None (the agent polls it every update_interval)."""
    node_ip = cluster.add_node("10.42.0.11")
    cluster.server.stop()

    def old_get_update(conn, request):
        conn.caller.confirm()  # the server's check again, as the Coordinator of that time did
        conn.stream.send_result(cluster.core.coordinator.get_update(request.resource_version))

    handlers = dict(cluster.api.handlers(), GetUpdate=old_get_update)
    cluster.server = FrameServer("vpnapi", ("127.77.0.1", 0), handlers, accept_check=cluster.api.accept_check,
                                 peer_view=CorePeerView(cluster.core)).start()
    cluster.port = cluster.server.address[1]
    poll = _long_poll(cluster, node_ip)
    version = _version(cluster)
    assert poll.get_update("127.77.0.1", version) == {"resource_version": version}
    assert poll.get_update("127.77.0.1", version) is None and "127.77.0.1" in poll.refused
