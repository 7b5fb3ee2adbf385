# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The verification service is rate-limited per source (agent/verify_limit.py): the service as the agent starts
it (``serve``, both transports, one budget) on loopback, the issuer a real swtpm's whose quotes are counted. One
source floods GetAttestation over gRPC: past its budget it is refused (RESOURCE_EXHAUSTED) before any quote, and
over HTTP too (429); another source is still served over both, with a quote that validates."""

from __future__ import annotations

import base64
import http.client
import json
import os
import threading

import grpc
import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.agent import verify_service as vs
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    Measurement, Measurements)
from lab.etcd import free_ports

FLOOD = 40


class CountingIssuer:
    """The real swtpm issuer, counting the quotes it makes."""

    def __init__(self, issue):
        self._issue, self.quotes, self._lock = issue, 0, threading.Lock()

    def __call__(self, user_data, nonce):
        with self._lock:
            self.quotes += 1
        return self._issue(user_data, nonce)


def grpc_ask(endpoint, nonce):
    """GetAttestation as any client sends it; the document or the gRPC status code and details."""
    proto = vs.messages()
    with grpc.insecure_channel(endpoint, options=[("grpc.enable_http_proxy", 0)]) as channel:
        call = channel.unary_unary(proto.path, request_serializer=proto.request.SerializeToString,
                                   response_deserializer=proto.response.FromString)
        try:
            return "OK", call(proto.request(nonce=nonce), timeout=20).attestation
        except grpc.RpcError as err:
            return err.code().name, err.details()


def http_ask(port, nonce, source):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20, source_address=(source, 0))
    try:
        conn.request("GET", "/?nonce=" + base64.urlsafe_b64encode(nonce).decode("ascii"))
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@pytest.fixture
def service(tpm):
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import VTPMIssuer

    with VTPMIssuer(tpm.tcti, event_log_path=None) as issuer:
        counting = CountingIssuer(issuer.issue)
        grpc_port, http_port = free_ports(2)
        servers = vs.serve("[::]:%d" % grpc_port, "0.0.0.0:%d" % http_port, counting)  # gRPC: both families
        try:
            yield counting, grpc_port, http_port
        finally:
            for server in servers:
                server.stop()


def test_a_flood_from_one_source_is_refused_before_any_quote_and_another_source_is_served(tpm, service):
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.tpm import read_pcrs
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import VTPMValidator

    issuer, grpc_port, http_port = service
    answers = [grpc_ask("127.0.0.1:%d" % grpc_port, os.urandom(vs.NONCE_SIZE)) for _request in range(FLOOD)]
    served = [a for a in answers if a[0] == "OK"]
    refused = [a for a in answers if a[0] != "OK"]
    assert refused, "%d requests from one source, none refused" % FLOOD
    assert {code for code, _details in refused} == {"RESOURCE_EXHAUSTED"}
    assert "GetAttestation: rate limited for 127.0.0.1" in refused[0][1]
    assert issuer.quotes == len(served) < FLOOD  # every refused request was refused before a quote
    # The same source over HTTP: one budget for both transports (its bucket is empty; what refilled since the last
    # refusal is less than two requests' worth).
    http_answers = [http_ask(http_port, os.urandom(vs.NONCE_SIZE), "127.0.0.1") for _request in range(3)]
    http_refused = [body for status, body in http_answers if status == 429]
    assert http_refused and all(b"rate limited for 127.0.0.1" in body for body in http_refused)
    served_http = [status for status, _body in http_answers if status == 200]
    assert issuer.quotes == len(served) + len(served_http)
    # Another source is served, over both transports, with a quote that validates.
    validator = VTPMValidator(Measurements({i: Measurement(v) for i, v in read_pcrs(tpm.tcti).items() if i in (0, 4)}))
    nonce = os.urandom(vs.NONCE_SIZE)
    status, body = http_ask(http_port, nonce, "127.0.0.2")
    assert status == 200
    document = base64.b64decode(json.loads(body)["data"])
    assert vs.check_attestation(validator, document, nonce).user_data == b"VerifyService"
    nonce = os.urandom(vs.NONCE_SIZE)
    code, document = grpc_ask("[::1]:%d" % grpc_port, nonce)
    assert code == "OK" and vs.check_attestation(validator, document, nonce).user_data == b"VerifyService"
    assert issuer.quotes == len(served) + len(served_http) + 2
