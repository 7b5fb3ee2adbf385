# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Constellation's verification service (module_utils/agent/verify_service.py), both sides, over real
gRPC and HTTP on loopback; the TPM is a real swtpm. Attacks: a replayed answer, an answer for other
user data, hostile requests (bad nonces, oversized requests)."""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket

import grpc
import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.agent import verify_service as vs
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import DummyIssuer, DummyValidator
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    Measurement, Measurements, MeasurementsMismatch)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    AttestationError, ConstellationError, InputError)

NONCE = bytes(range(32))


class CountingIssuer:
    """The dummy issuer, counting its calls: a refused request must never reach the TPM."""

    def __init__(self, issue=None):
        self.calls = []
        self._issue = issue or DummyIssuer().issue

    def __call__(self, user_data, nonce):
        self.calls.append((user_data, nonce))
        return self._issue(user_data, nonce)


@pytest.fixture
def services():
    started = []

    def start(issue, transports=vs.TRANSPORTS):
        made = {}
        for transport in transports:
            kind = vs.GRPCVerifyServer if transport == "grpc" else vs.HTTPVerifyServer
            made[transport] = kind(("127.0.0.1", 0), issue).start()
            started.append(made[transport])
        return {t: "127.0.0.1:%d" % s.address[1] for t, s in made.items()}

    yield start
    for server in started:
        server.stop()


def _raw_grpc(endpoint, payload, timeout=5.0):
    """Sends ``payload`` (already serialized) to GetAttestation: what a hostile client can send."""
    with grpc.insecure_channel(endpoint) as channel:
        call = channel.unary_unary(vs.METHOD_PATH, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        return call(payload, timeout=timeout)


def _http_get(endpoint, path, timeout=5.0):
    host, port = endpoint.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type"), response.read()
    finally:
        conn.close()


# --------------------------------------------------------------------------- wire format


def test_messages_are_constellations_verify_proto():
    proto = vs.messages()
    assert proto.path == "/verify.API/GetAttestation"
    # GetAttestationRequest{nonce = 2}: tag (2 << 3) | 2 = 0x12; GetAttestationResponse{attestation = 1}: 0x0a.
    assert proto.request(nonce=NONCE).SerializeToString() == b"\x12\x20" + NONCE
    assert proto.response(attestation=b"doc").SerializeToString() == b"\x0a\x03doc"
    assert proto.response.FromString(b"\x0a\x03doc").attestation == b"doc"
    # An old client's removed field 1 (user_data) is ignored, as by Constellation's server.
    assert proto.request.FromString(b"\x0a\x02hi\x12\x04abcd").nonce == b"abcd"


def test_url_nonce_is_gos_padded_url_encoding():
    assert vs.decode_url_nonce(base64.urlsafe_b64encode(b"\xfb\xff\xfe").decode()) == b"\xfb\xff\xfe"
    for bad in ("+/8=", "AQ", "AQI", "AQ=x", "A" * 300):
        with pytest.raises(InputError, match="nonce"):
            vs.decode_url_nonce(bad)


# --------------------------------------------------------------------------- both transports, real TPM


@pytest.mark.parametrize("transport", vs.TRANSPORTS)
def test_real_quote_round_trip_over_each_transport(tpm, services, transport):
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.tpm import read_pcrs
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import VTPMIssuer, VTPMValidator

    pcrs = read_pcrs(tpm.tcti)
    with VTPMIssuer(tpm.tcti, event_log_path=None) as issuer:
        endpoints = services(issuer.issue)
        nonce = os.urandom(vs.NONCE_SIZE)
        document = vs.fetch_attestation(endpoints[transport], nonce, transport)
        validator = VTPMValidator(Measurements({i: Measurement(pcrs[i]) for i in (0, 4, 9, 15)}))
        validation = vs.check_attestation(validator, document, nonce)
        assert validation.user_data == b"VerifyService"
        assert [(c.index, c.ok) for c in validation.checks] == [(0, True), (4, True), (9, True), (15, True)]
        # The same answer does not pass for another nonce (a replay), nor against other measurements.
        with pytest.raises(AttestationError):
            vs.check_attestation(validator, document, os.urandom(vs.NONCE_SIZE))
        strict = VTPMValidator(Measurements({9: Measurement(b"\x11" * 32)}))
        with pytest.raises(MeasurementsMismatch, match="PCR 9: expected 1111") as refused:
            vs.check_attestation(strict, document, nonce)
        assert [(c.index, c.ok) for c in refused.value.checks] == [(9, False)]


def test_http_answer_has_constellations_shape(services):
    endpoint = services(DummyIssuer().issue, ("http",))["http"]
    status, content_type, body = _http_get(endpoint, "/?nonce=" + base64.urlsafe_b64encode(NONCE).decode())
    assert (status, content_type) == (200, "application/json")
    assert body.endswith(b"}\n") and list(json.loads(body)) == ["data"]  # Go's json.Encoder of {Data []byte `json:"data"`}
    document = json.loads(base64.b64decode(json.loads(body)["data"]))
    assert base64.b64decode(document["UserData"]) == b"VerifyService"
    assert base64.b64decode(document["Nonce"]) == NONCE


# --------------------------------------------------------------------------- attacks on the client


@pytest.mark.parametrize("transport", vs.TRANSPORTS)
def test_replayed_answer_for_another_nonce_is_refused(services, transport):
    recorded = DummyIssuer().issue(vs.VERIFY_USER_DATA, NONCE)
    endpoints = services(lambda user_data, nonce: recorded)  # a service that replays a recorded answer
    nonce = os.urandom(vs.NONCE_SIZE)
    document = vs.fetch_attestation(endpoints[transport], nonce, transport)
    with pytest.raises(AttestationError, match="another nonce"):
        vs.check_attestation(DummyValidator(), document, nonce)


@pytest.mark.parametrize("transport", vs.TRANSPORTS)
def test_answer_for_other_user_data_is_refused(services, transport):
    # E.g. an aTLS attestation (user data: a key hash) relayed as a verification service answer.
    issuer = DummyIssuer()
    endpoints = services(lambda user_data, nonce: issuer.issue(b"\x01" * 32, nonce))
    nonce = os.urandom(vs.NONCE_SIZE)
    document = vs.fetch_attestation(endpoints[transport], nonce, transport)
    with pytest.raises(AttestationError, match="not an answer of a verification service"):
        vs.check_attestation(DummyValidator(), document, nonce)


def test_validator_crash_on_hostile_document_is_a_refusal():
    with pytest.raises(AttestationError, match="could not be validated"):
        vs.check_attestation(type("Broken", (), {"validate": lambda self, d, n: 1 / 0})(), b"{}", NONCE)


def test_oversized_http_answer_is_refused(services, monkeypatch):
    endpoint = services(lambda user_data, nonce: b"x" * 4096, ("http",))["http"]
    monkeypatch.setattr(vs, "MAX_ANSWER_SIZE", 1024)
    with pytest.raises(AttestationError, match="larger than 1024 bytes"):
        vs.fetch_attestation(endpoint, NONCE, "http")


# --------------------------------------------------------------------------- hostile requests


@pytest.mark.parametrize("nonce, reason", [(b"", "nonce is required"), (b"\x01" * 65, "at most 64 bytes")])
def test_grpc_bad_nonce_is_refused_before_the_tpm(services, nonce, reason):
    issuer = CountingIssuer()
    endpoint = services(issuer, ("grpc",))["grpc"]
    with pytest.raises(ConstellationError, match="INVALID_ARGUMENT: .*%s" % reason):
        vs.fetch_attestation(endpoint, nonce, "grpc")
    assert issuer.calls == []


@pytest.mark.parametrize("query, status, reason", [
    ("", 400, b"nonce parameter is required exactly once"),
    ("?nonce=", 400, b"nonce parameter is required exactly once"),
    ("?nonce=AQID&nonce=AQID", 400, b"nonce parameter is required exactly once"),
    ("?nonce=AQ%2BD", 400, b"invalid base64 encoding for nonce"),  # std alphabet, not URL-safe
    ("?nonce=AQI", 400, b"invalid base64 encoding for nonce"),  # unpadded
    ("?nonce=" + base64.urlsafe_b64encode(b"\x01" * 65).decode(), 400, b"at most 64 bytes"),
    ("?nonce=" + "A" * 2000, 414, b"request line longer than 1024 bytes"),
])
def test_http_bad_request_is_refused_before_the_tpm(services, query, status, reason):
    issuer = CountingIssuer()
    endpoint = services(issuer, ("http",))["http"]
    got_status, content_type, body = _http_get(endpoint, "/" + query)
    assert (got_status, content_type) == (status, "text/plain; charset=utf-8")
    assert reason in body
    assert issuer.calls == []


def test_oversized_grpc_request_is_refused_before_the_tpm(services):
    issuer = CountingIssuer()
    endpoint = services(issuer, ("grpc",))["grpc"]
    # A valid nonce plus 2 KiB in an unknown field: over the 1 KiB request bound.
    payload = b"\x12\x20" + NONCE + b"\x1a\x80\x10" + b"\x00" * 2048
    with pytest.raises(grpc.RpcError) as refused:
        _raw_grpc(endpoint, payload)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert issuer.calls == []
    # The same request within the bound is answered.
    assert _raw_grpc(endpoint, b"\x12\x20" + NONCE).startswith(b"\x0a")
    assert issuer.calls == [(b"VerifyService", NONCE)]


def test_http_request_bytes_are_bounded():
    """A client that never ends its headers gets at most 8 KiB of them read: the server does not wait for more."""
    import io

    reader = vs._LimitedReader(io.BytesIO(b"GET /?nonce=AQID HTTP/1.0\r\n" + b"X-Filler: " + b"a" * 20000), 8192)
    lines = [reader.readline(65537) for _line in range(4)]
    assert sum(len(line) for line in lines) == 8192 and lines[-1] == b""
    assert reader.read() == b""


@pytest.mark.parametrize("transport", vs.TRANSPORTS)
def test_issuer_failure_is_reported_not_hidden(services, transport):
    def broken(user_data, nonce):
        raise AttestationError("attestation timed out after 30.0 s")

    endpoints = services(broken)
    with pytest.raises(ConstellationError, match="issuing attestation statement: attestation timed out"):
        vs.fetch_attestation(endpoints[transport], NONCE, transport)


def test_unreachable_service_is_named():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    for transport in vs.TRANSPORTS:
        with pytest.raises(ConstellationError, match="127.0.0.1:%d" % port):
            vs.fetch_attestation("127.0.0.1:%d" % port, NONCE, transport, timeout=2)
    with pytest.raises(InputError, match="transport"):
        vs.fetch_attestation("127.0.0.1:%d" % port, NONCE, "https")


def test_quotes_at_once_are_bounded_for_both_transports(monkeypatch):
    """However many clients ask, at most MAX_CONCURRENT_QUOTES quotes run at once (the agent's issuing
    pool stays free for its aTLS handshakes); a request that cannot get a slot is refused as busy."""
    import threading

    monkeypatch.setattr(vs, "REQUEST_TIMEOUT", 0.2)
    inside, release = threading.Semaphore(0), threading.Event()

    def slow(user_data, nonce):
        inside.release()
        release.wait(10)
        return b"doc"

    bounded = vs._bounded(slow)
    workers = [threading.Thread(target=bounded, args=(b"VerifyService", NONCE)) for _slot in range(vs.MAX_CONCURRENT_QUOTES)]
    for worker in workers:
        worker.start()
    for _worker in workers:
        assert inside.acquire(timeout=10)
    with pytest.raises(ConstellationError, match="busy: 2 attestations are being issued"):
        bounded(b"VerifyService", NONCE)
    release.set()
    for worker in workers:
        worker.join(10)
    assert bounded(b"VerifyService", NONCE) == b"doc"
