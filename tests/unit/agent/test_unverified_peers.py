# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Denial of service is never eviction (core/eviction/peer_trust.py): a healthy Node that an attacker makes unreachable (its
pubapi blackholed, or its server stopped: the real aTLS client of re-attestation against real sockets on
loopback) for more than ``reattest_unreachable_limit`` rounds is **unverified**, not evicted. It keeps its
place in the peer set but gets no new secret (the vpnapi's GetDataKey and GetStateDiskKey, a kubelet
certificate), a re-attestation that passes clears it, and it is evicted only after ``unverified_eviction_after``
seconds (a fake wall clock). A failed attestation (a wrong PCR) still evicts at once."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import DummyValidator
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import expected_pcr15
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AccessDenied, AttestationError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import access, schema
from ansible_collections.constellation.cluster.plugins.module_utils.agent.peer_view import CorePeerView
from ansible_collections.constellation.cluster.plugins.module_utils.agent.wiring import vpnapi_handlers

from ansible_collections.constellation.cluster.tests.support.core_fakes import FakePeerClient
from ansible_collections.constellation.cluster.tests.support.sockets import BlackHole, connect_to

EVICTION_AFTER = 3600.0  # the default of unverified_eviction_after (agent config)
DOWN = "10.42.0.12"
UP = "10.42.0.13"


class Recorder:
    def __init__(self):
        self.sent = []

    def send_result(self, result):
        self.sent.append(result)


class WallClock:
    """The fake wall clock of ``PeerTrust.clock``: moved on by the test."""

    def __init__(self):
        self.now = 1.8e9

    def __call__(self):
        return self.now


def closed_port() -> str:
    """An endpoint whose server was stopped: nothing listens there any more (connection refused)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return "127.0.0.1:%d" % port


def secret_requests(c, node):
    """What a Node asks its Coordinator for over the vpnapi, on a connection that proved its WireGuard key
    (PeerAuth), each authorised as the vpnapi server does before its handler (rpc/access.py, the schema's
    declaration): a data key, its disk key. Returns (answers, refusals)."""
    api = vpnapi_handlers(c)
    view = CorePeerView(c)
    conn = SimpleNamespace(peer_ip=node["vpn_ip"], peer=(node["vpn_ip"], 40000), stream=Recorder(), admin=False,
                           authenticated_peer=True, vpn_peer_pub_key=node["vpn_pub_key"])
    refusals = []
    for method, call in (
            ("GetDataKey", lambda: api.get_data_key(conn, schema.GetDataKeyRequest(data_key_id="app", length=32))),
            ("GetStateDiskKey", lambda: api.get_state_disk_key(conn, schema.Empty()))):
        try:
            conn.caller = access.authorise(method, schema.METHODS[method].access, conn, view)
            call()
        except AccessDenied as err:
            refusals.append(err)
    return conn.stream.sent, refusals


@pytest.fixture(params=["blackholed", "stopped"])
def unreachable(request, cluster):
    """The Coordinator of ``cluster`` with a fake wall clock; the Node at DOWN is made unreachable by an
    attacker (its endpoint blackholed: TCP accepted, no handshake ever; or its server stopped); the other
    Node passes. Yields (core, nodes, clock, connect_peer, the set of unreachable public IPs)."""
    c, _vpn, nodes = cluster
    clock = WallClock()
    c.peer_trust.clock = clock
    hole = BlackHole() if request.param == "blackholed" else None
    real_connect = connect_to(hole.endpoint if hole else closed_port(), [DummyValidator()])
    ours = expected_pcr15(c.context.cluster_id)
    down = {DOWN}

    def connect_peer(public_ip):
        if public_ip in down:
            return real_connect(public_ip)  # the real aTLS client: times out or is refused
        return FakePeerClient(ours, nodes[public_ip])

    try:
        yield c, nodes, clock, connect_peer, down
    finally:
        if hole is not None:
            hole.close()


def _round(c, connect_peer):
    """One round as the agent runs it under the defaults (3 rounds, ``EVICTION_AFTER``)."""
    return {r["public_ip"]: r for r in c.peer_trust.reattest_peers(connect_peer, unreachable_limit=3)}


def test_a_node_made_unreachable_is_unverified_not_evicted_and_gets_no_new_secret(unreachable):
    c, nodes, clock, connect_peer, down = unreachable
    node = nodes[DOWN]
    answers, refusals = secret_requests(c, node)
    assert len(answers) == 2 and not refusals  # in good standing: both served
    outcomes = []
    for _round_ in range(6):  # six rounds of 60 s: twice the old limit
        outcomes.append(_round(c, connect_peer).get(DOWN, {}).get("outcome", "no longer a peer"))
        clock.now += 60
    assert outcomes == ["unreachable"] * 2 + ["unverified"] * 4
    assert not c.evictions.is_evicted(node["vpn_ip"]) and c.get_state()["evicted"] == []
    assert c.coordinator.is_known_peer_ip(node["vpn_ip"])  # still a peer: it keeps what it has
    (record,) = c.get_state()["unverified"]
    assert record["vpn_ip"] == node["vpn_ip"] and record["public_ip"] == DOWN and record["since"] == 1.8e9
    # Nothing new while unverified: no data key, no disk key, no kubelet certificate.
    answers, refusals = secret_requests(c, node)
    assert answers == [] and [e.reason for e in refusals] == ["unverified", "unverified"]
    with pytest.raises(AccessDenied, match="unverified"):
        c.kubernetes.kubelet_cert_for(b"csr", node["vpn_ip"], "GetJoinArgs")
    assert not c.evictions.is_unverified(nodes[UP]["vpn_ip"])
    # Reachable again: the next re-attestation passes and clears it; the secrets are served again.
    down.clear()
    assert _round(c, connect_peer)[DOWN]["outcome"] == "passed"
    assert c.get_state()["unverified"] == [] and not c.evictions.is_unverified(node["vpn_ip"])
    answers, refusals = secret_requests(c, node)
    assert len(answers) == 2 and not refusals


def test_an_unverified_node_is_evicted_only_after_the_configured_period(unreachable):
    c, nodes, clock, connect_peer, _down = unreachable
    node = nodes[DOWN]
    start = clock.now
    for step in (0, 60, 120, 600, 1800, EVICTION_AFTER - 1):  # rounds over the period, the last one second short
        clock.now = start + step
        assert _round(c, connect_peer)[DOWN]["outcome"] == ("unreachable" if step < 120 else "unverified")
    assert not c.evictions.is_evicted(node["vpn_ip"]) and c.evictions.is_unverified(node["vpn_ip"])
    clock.now = start + EVICTION_AFTER
    row = _round(c, connect_peer)[DOWN]
    assert row["outcome"] == "evicted" and "unverified_eviction_after" in row["error"]
    assert c.evictions.is_evicted(node["vpn_ip"]) and not c.coordinator.is_known_peer_ip(node["vpn_ip"])
    assert c.get_state()["unverified"] == [] and [e["vpn_ip"] for e in c.get_state()["evicted"]] == [node["vpn_ip"]]
    assert not c.evictions.is_evicted(nodes[UP]["vpn_ip"])


def test_a_wrong_pcr_still_evicts_at_once_even_an_unverified_node(unreachable):
    c, nodes, clock, connect_peer, down = unreachable
    for _round_ in range(3):
        _round(c, connect_peer)
        clock.now += 60
    assert c.evictions.is_unverified(nodes[DOWN]["vpn_ip"])
    down.clear()
    ours = expected_pcr15(c.context.cluster_id)

    def tampered(public_ip):
        if public_ip in (DOWN, UP):
            return FakePeerClient(error=AttestationError("measurements mismatch: PCR 4: expected aa, found bb"))
        return FakePeerClient(ours, nodes[public_ip])

    rows = _round(c, tampered)
    assert rows[DOWN]["outcome"] == rows[UP]["outcome"] == "evicted"
    assert all("PCR 4" in r["error"] for r in rows.values())
    assert c.get_state()["unverified"] == []
    assert sorted(e["vpn_ip"] for e in c.get_state()["evicted"]) == sorted(n["vpn_ip"] for n in nodes.values())


def test_the_period_runs_on_across_a_coordinator_restart(unreachable):
    """The unverified record (with ``since``) is in the store: a restarted Coordinator (a new ``PeerTrust`` and
    ``Evictions`` over the same store, no unreachable count in memory) neither forgets it nor starts the period
    again: the Node is still refused new secrets, and evicted once the period since its first failure is over."""
    from ansible_collections.constellation.cluster.plugins.module_utils.core.eviction.evictions import Evictions
    from ansible_collections.constellation.cluster.plugins.module_utils.core.eviction.peer_trust import PeerTrust

    c, nodes, clock, connect_peer, _down = unreachable
    start = clock.now
    for step in (0, 60, 120):
        clock.now = start + step
        _round(c, connect_peer)
    assert c.evictions.is_unverified(nodes[DOWN]["vpn_ip"])
    evictions = Evictions(c.context)
    restarted = PeerTrust(c.context, c.coordinator, c.join_service, c.signing, evictions, c.kubernetes)
    restarted.clock = clock
    assert evictions.is_unverified(nodes[DOWN]["vpn_ip"])
    clock.now = start + EVICTION_AFTER
    rows = {r["public_ip"]: r for r in restarted.reattest_peers(connect_peer, unreachable_limit=3)}
    assert rows[DOWN]["outcome"] == "evicted" and evictions.is_evicted(nodes[DOWN]["vpn_ip"])
