# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""EnrollAK needs no authentication and costs the Node's TPM a primary key. A
client that sits in the middle of the exchange must not block anyone's quote nor keep its connection,
and a flood is refused before any TPM work. A real qemu-vtpm-ek pubapi (swtpm with an EK certificate)
on loopback; loops are bounded and timeouts only detect a hang."""

from __future__ import annotations

import socket
import threading
from types import SimpleNamespace

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.ek import (
    VTPMEKIssuer, VTPMEKValidator, begin_enrollment, enroll_over, finish_enrollment)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import Measurements
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import RemoteError, b64d
from ansible_collections.constellation.cluster.plugins.module_utils.agent.pubapi import PubAPI
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import AgentServerContext, FrameServer


@pytest.fixture
def ek_node(swtpm_ek):
    """A Node's pubapi with the qemu-vtpm-ek issuer on a swtpm with an EK certificate; (server, api,
    issuer, the fleet CA's certificate paths)."""
    issuer = VTPMEKIssuer(swtpm_ek.tcti, event_log_path=None)
    api = PubAPI(issuer=issuer)
    tls = AgentServerContext(issuer, key_pool_size=0)
    server = FrameServer("pubapi", ("127.0.0.1", 0), api.handlers(), tls=tls).start()
    server.test_ca_certs = swtpm_ek.ca_cert_paths()
    yield server, api, issuer, swtpm_ek.ca_cert_paths()
    server.stop()
    tls.close()
    issuer.close()


def connect(server, source="127.0.0.1"):
    """The enrollment connection as connect_enrolling opens it (validated in all but AK trust)."""
    validator = VTPMEKValidator(Measurements(), server.test_ca_certs).enrollment_validator()
    raw = socket.socket()
    raw.bind((source, 0))
    raw.settimeout(10)
    raw.connect(("127.0.0.1", server.address[1]))
    return AgentClient.connect("127.0.0.1:%d" % server.address[1], [validator], sock=raw, timeout=10)


def start_enrollment(client):
    """EnrollAK up to the node's enrollment request; the exchange is then left hanging."""
    client.stream.send_request("EnrollAK", {})
    return client.stream.recv_msg("the enrollment request")


def test_a_client_sitting_in_enroll_ak_blocks_no_quote_and_loses_its_connection(ek_node):
    """Attack (c): 6 clients stop in the middle of EnrollAK (the node sent its EK certificate and AK,
    they never send the challenge). Another client's handshake (a TPM quote) and its whole enrollment
    (TPM2_ActivateCredential) complete meanwhile; the sitting clients lose their connections after the
    answer timeout (shortened here) instead of holding their slots for the 300 s idle timeout."""
    server, api, issuer, ca_certs = ek_node
    api.ENROLL_AK_ANSWER_TIMEOUT = 1.0
    sitting = [connect(server, "127.0.0.2") for _i in range(6)]
    try:
        requests = [start_enrollment(c) for c in sitting]
        assert all(r.get("ak_pub") and r.get("ek_cert") for r in requests)
        done = {}

        def other_client():
            with connect(server, "127.0.0.3") as client:  # a fresh handshake: a quote of the same TPM
                done["record"] = enroll_over(client, ca_certs)

        worker = threading.Thread(target=other_client, daemon=True)
        worker.start()
        worker.join(30)
        assert not worker.is_alive(), "the other client's handshake or enrollment hung"
        assert done["record"].ak_pub == issuer.ak_pub
        for client in sitting:  # each gets the timeout's error, then the end of the connection
            with pytest.raises(RemoteError, match="timed out waiting for the peer"):
                client.stream.recv_end()
            client.sock.settimeout(10)
            assert client.sock.recv(1) == b""
    finally:
        for client in sitting:
            client.close()


def test_an_enroll_ak_flood_is_refused_before_any_tpm_work(ek_node):
    """Attack (d): one source asks EnrollAK again and again, answering each challenge so that every one
    costs the node's TPM a primary key (~80 ms of its time). After the per-source budget the node
    refuses with RateLimited before sending anything (no EK certificate, no TPM work); another source
    still enrolls."""
    server, _api, issuer, ca_certs = ek_node
    refused, enrolled = [], 0
    with connect(server) as flood:
        for _attempt in range(30):
            flood.stream.send_request("EnrollAK", {})
            frame = flood.stream.recv()
            if frame.kind_name == "END":
                assert "error" in frame.message and "ek_cert" not in str(frame.message)
                refused.append(frame.message["error"])
                continue
            challenge, pending = begin_enrollment(frame.message, ca_certs)
            flood.stream.send_msg({"challenge": challenge})
            finish_enrollment(pending, b64d(flood.stream.recv_end().get("secret"), "secret", 32))
            enrolled += 1
        assert refused, "30 enrollments in a row from one source were all served"
        assert enrolled < 30
        assert {e["kind"] for e in refused} == {"RateLimited"}
        assert {e.get("reason") for e in refused} == {"rate_limited"}
        assert "EnrollAK: rate limited for 127.0.0.1" in refused[0]["message"]
    with connect(server, "127.0.0.4") as other:
        assert enroll_over(other, ca_certs).ak_pub == issuer.ak_pub


COORDINATOR = "127.0.0.9"
STRANGERS = ["127.0.0.%d" % i for i in range(20, 32)]  # a dozen addresses


def ask_enrollment(client, ca_certs):
    """One EnrollAK on ``client``: the refusal's message, or None when the node enrolled (challenge answered,
    so the node's TPM did the work)."""
    client.stream.send_request("EnrollAK", {})
    frame = client.stream.recv()
    if frame.kind_name == "END":
        assert "ek_cert" not in str(frame.message)
        return frame.message["error"]["message"]
    challenge, pending = begin_enrollment(frame.message, ca_certs)
    client.stream.send_msg({"challenge": challenge})
    finish_enrollment(pending, b64d(client.stream.recv_end().get("secret"), "secret", 32))
    return None


@pytest.mark.parametrize("known_by", ["config", "peers"])
def test_strangers_draining_the_all_sources_budget_do_not_stop_the_coordinators_enrollment(ek_node, known_by):
    """Attack: a dozen addresses keep EnrollAK's all-sources bucket empty (each within its own per-source
    budget), so that a Coordinator that must enroll the Node's AK again (after its restart) is refused, and
    re-attestation sees the Node as unreachable. The Node knows its Coordinator (``config``: the agent config's
    Coordinator endpoint; ``peers``: its peers with role coordinator, core/recovery.py): the Coordinator's
    EnrollAK takes from a bucket of its own, and its whole enrollment (a real EnrollAK exchange with the swtpm)
    completes while the strangers are refused; a stranger never gets the Coordinators' budget."""
    server, api, issuer, ca_certs = ek_node
    api.ENROLL_AK_TOTAL = (12, 0.01)  # refills slowly here: the strangers keep it empty without racing its refill
    if known_by == "config":
        api.coordinator_endpoints = ["%s:9000" % COORDINATOR]
    else:
        api.recovery = SimpleNamespace(coordinator_public_ips=lambda: [COORDINATOR])
    refusals = []
    for source in STRANGERS:  # drain the all-sources bucket: one enrollment per stranger
        with connect(server, source) as client:
            refusals.append(ask_enrollment(client, ca_certs))
    with connect(server, "127.0.0.40") as late:  # empty: the next stranger is refused, before any TPM work
        refused = ask_enrollment(late, ca_certs)
    assert refused and "from all sources" in refused, (refusals, refused)
    with connect(server, COORDINATOR) as coordinator:
        assert enroll_over(coordinator, ca_certs).ak_pub == issuer.ak_pub
    with connect(server, STRANGERS[0]) as stranger:  # the Coordinator's enrollment gave the strangers nothing
        assert "from all sources" in (ask_enrollment(stranger, ca_certs) or "")
