# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""aTLS over loopback with the dummy variant: round trip, and every refusal happens before the
client sends a single application byte (the server records all it receives after its side of
the handshake)."""

from __future__ import annotations

import base64
import datetime
import json
import socket
import ssl
import threading
import time

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils import atls
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import (
    DummyIssuer, DummyValidator)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    AttestationError, InputError, PeerUnreachable)
from ansible_collections.constellation.cluster.tests.unit.attestation.atls_servers import (
    ExpiredServer, ForeignSignedServer, NonceIgnoringServer, RecordingServer, RelayingServer, ReplayingServer,
    TamperingServer, exchange_ping, assert_refused_before_any_byte)


@pytest.fixture
def serve():
    servers = []

    def start(server_ctx, **kwargs):
        server = RecordingServer(server_ctx, **kwargs)
        servers.append(server)
        return server
    yield start
    for server in servers:
        server.close()


# ---------------------------------------------------------------------------------------------
# Tests


def test_round_trip_dummy(serve):
    server = serve(atls.AttestedServerContext(DummyIssuer()))
    conn = atls.connect(server.endpoint, [DummyValidator()])
    assert conn.variant_oid == "1.3.9900.1.1"
    from cryptography import x509
    cert = x509.load_der_x509_certificate(conn.peer_certificate)
    assert conn.validation.user_data == atls.spki_hash(cert.public_key())
    assert cert.subject.rfc4514_string() == "CN=Constellation"
    assert cert.issuer == cert.subject
    assert 0 < cert.serial_number < 2 ** 128
    assert [e.oid.dotted_string for e in cert.extensions] == ["1.3.9900.1.1"]
    assert not cert.extensions[0].critical
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == datetime.timedelta(hours=4)
    assert conn.sock.version() in ("TLSv1.3", "TLSv1.2")
    assert exchange_ping(server, conn).alpn == "http/1.1"  # the server saw "ping" over ALPN http/1.1


def test_each_connection_fresh_key_and_document(serve):
    issued = []

    class Recording(DummyIssuer):
        def issue(self, user_data, nonce):
            issued.append((user_data, nonce))
            return super().issue(user_data, nonce)

    server = serve(atls.AttestedServerContext(Recording()))
    certs = []
    for _attempt in range(3):
        conn = atls.connect(server.endpoint, [DummyValidator()])
        certs.append(conn.peer_certificate)
        conn.sock.close()
    assert len(set(certs)) == 3
    assert len({user_data for user_data, _nonce in issued}) == 3  # one key per connection
    assert len({nonce for _user_data, nonce in issued}) == 3  # one nonce per connection


def test_h2_negotiated_when_client_asks(serve):
    server = serve(atls.AttestedServerContext(DummyIssuer()))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    host, port = atls.parse_endpoint(server.endpoint)
    with socket.create_connection((host, port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname=atls.encode_nonce(b"\x05" * 32)) as tls:
            assert tls.selected_alpn_protocol() == "h2"


def test_resumption_never_skips_attestation(serve):
    """A client that tries to resume gets a full, freshly attested handshake."""
    issued = []

    class Counting(DummyIssuer):
        def issue(self, user_data, nonce):
            issued.append(nonce)
            return super().issue(user_data, nonce)

    server = serve(atls.AttestedServerContext(Counting()))
    host, port = atls.parse_endpoint(server.endpoint)
    for version in (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.maximum_version = version
        session = None
        for _attempt in range(2):
            with socket.create_connection((host, port), timeout=5) as raw:
                with ctx.wrap_socket(raw, server_hostname=atls.encode_nonce(b"\x06" * 32), session=session) as tls:
                    tls.sendall(b"x")
                    assert not tls.session_reused
                    if tls.session is not None:
                        assert not tls.session.has_ticket
                    session = tls.session
    assert len(issued) == 4


@pytest.mark.parametrize("server_name, reason", [
    (None, "no nonce"),
    ("example.com", "44 base64"),
    ("A" * 43 + "*", "not standard base64"),
    (base64.b64encode(b"\x01" * 33)[:44].decode(), "not standard base64|32 bytes"),
])
def test_server_refuses_bad_nonce(serve, server_name, reason):
    server = serve(atls.AttestedServerContext(DummyIssuer()))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    host, port = atls.parse_endpoint(server.endpoint)
    with socket.create_connection((host, port), timeout=5) as raw:
        with pytest.raises(ssl.SSLError, match="ILLEGAL_PARAMETER"):
            ctx.wrap_socket(raw, server_hostname=server_name)
    (record,) = server.wait(1)
    assert record.handshake_error is not None
    assert pytest.importorskip("re").search(reason, record.handshake_error)


def test_nonce_encoding_survives_sni():
    nonce = bytes(range(200, 232))  # yields '+', '/' in base64
    encoded = atls.encode_nonce(nonce)
    assert len(encoded) == 44 and encoded.endswith("=")
    assert atls.decode_nonce(encoded) == nonce


def test_round_trip_many_random_nonces(serve):
    """Nonces with '+', '/' and '=' travel through SNI unchanged (IDNA must not touch them)."""
    server = serve(atls.AttestedServerContext(DummyIssuer()))
    for _attempt in range(20):
        conn = atls.connect(server.endpoint, [DummyValidator()])
        conn.sock.close()


def test_refuses_replayed_document(serve):
    server = serve(ReplayingServer(DummyIssuer()))
    assert_refused_before_any_byte(server, [DummyValidator()], "another nonce")


def test_refuses_relayed_attestation(serve):
    server = serve(RelayingServer(DummyIssuer()))
    assert_refused_before_any_byte(server, [DummyValidator()], "bound to another key")


def test_refuses_unknown_oid(serve):
    server = serve(TamperingServer(DummyIssuer(), lambda doc: ("1.3.9900.99.1", doc)))
    msg = assert_refused_before_any_byte(server, [DummyValidator()], "no attestation of an accepted variant")
    assert "1.3.9900.99.1" in msg and "1.3.9900.1.1" in msg


@pytest.mark.parametrize("tamper", [
    lambda doc: ("1.3.9900.1.1", doc[: len(doc) // 2]),
    lambda doc: ("1.3.9900.1.1", b"\x00garbage\xff"),
    lambda doc: ("1.3.9900.1.1", b""),
    lambda doc: ("1.3.9900.1.1", json.dumps({"UserData": 5, "Nonce": None}).encode()),
], ids=["truncated", "garbage", "empty", "wrong-types"])
def test_refuses_malformed_document(serve, tamper):
    server = serve(TamperingServer(DummyIssuer(), tamper))
    assert_refused_before_any_byte(server, [DummyValidator()], "malformed")


def test_refuses_expired_certificate(serve):
    server = serve(ExpiredServer(DummyIssuer()))
    assert_refused_before_any_byte(server, [DummyValidator()], "expired")


def test_refuses_server_ignoring_nonce(serve):
    server = serve(NonceIgnoringServer(DummyIssuer()))
    assert_refused_before_any_byte(server, [DummyValidator()], "another nonce")


def test_refuses_certificate_not_self_signed(serve):
    server = serve(ForeignSignedServer(DummyIssuer()))
    assert_refused_before_any_byte(server, [DummyValidator()], "not validly self-signed")


def test_refuses_server_without_attestation(serve):
    server = serve(atls.AttestedServerContext(None))
    assert_refused_before_any_byte(server, [DummyValidator()], r"found OIDs \[\]")


def test_validator_error_is_reported_and_nothing_sent(serve):
    class Refusing(DummyValidator):
        def validate(self, document, nonce):
            raise AttestationError("PCR 4: expected aa, found bb")

    server = serve(atls.AttestedServerContext(DummyIssuer()))
    assert_refused_before_any_byte(server, [Refusing()], "PCR 4: expected aa, found bb")


def test_handshake_timeout():
    """A peer that accepts TCP and never answers: the client gives up after its timeout; no
    attestation arrived, so it is unreachable, not a failed attestation."""
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        start = time.monotonic()
        with pytest.raises(PeerUnreachable, match="timed out") as caught:
            atls.connect("127.0.0.1:%d" % listener.getsockname()[1], [DummyValidator()], timeout=0.3)
        assert not isinstance(caught.value, AttestationError)
        assert time.monotonic() - start < 5
    finally:
        listener.close()


def test_hung_issuer_refuses_handshake(serve):
    release = threading.Event()

    class Hung(DummyIssuer):
        def issue(self, user_data, nonce):
            release.wait(5)
            return super().issue(user_data, nonce)

    server = serve(atls.AttestedServerContext(Hung(), attestation_timeout=0.2))
    try:
        # The server could not attest and ended the handshake: no document, no verdict.
        with pytest.raises(PeerUnreachable, match="handshake failed"):
            atls.connect(server.endpoint, [DummyValidator()], timeout=5)
        (record,) = server.wait(1)
        assert "timed out" in record.handshake_error
    finally:
        release.set()


def test_validation_timeout(serve):
    release = threading.Event()

    class Slow(DummyValidator):
        def validate(self, document, nonce):
            release.wait(5)
            return super().validate(document, nonce)

    server = serve(atls.AttestedServerContext(DummyIssuer()))
    try:
        # Our validator ran out of time: no verdict on the peer (unreachable), nothing sent.
        with pytest.raises(PeerUnreachable, match="timed out"):
            atls.connect(server.endpoint, [Slow()], attestation_timeout=0.2)
    finally:
        release.set()
    (record,) = server.wait(1)
    assert record.received == b""


def test_connection_refused_is_clear():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    with pytest.raises(PeerUnreachable, match="cannot connect to 127.0.0.1:%d" % port):
        atls.connect("127.0.0.1:%d" % port, [DummyValidator()], timeout=2)


@pytest.mark.parametrize("endpoint, expected", [
    ("127.0.0.1:9000", ("127.0.0.1", 9000)),
    ("[::1]:9000", ("::1", 9000)),
    (("node-1", 1), ("node-1", 1)),
])
def test_parse_endpoint(endpoint, expected):
    assert atls.parse_endpoint(endpoint) == expected


@pytest.mark.parametrize("endpoint", ["127.0.0.1", ":9000", "host:http", "host:0", "host:70000", 5])
def test_parse_endpoint_rejects(endpoint):
    with pytest.raises(InputError, match="endpoint"):
        atls.parse_endpoint(endpoint)


def test_dummy_validator_checks_nonce():
    doc = DummyIssuer().issue(b"u", b"n" * 32)
    assert DummyValidator().validate(doc, b"n" * 32).user_data == b"u"
    with pytest.raises(AttestationError, match="another nonce"):
        DummyValidator().validate(doc, b"m" * 32)


@pytest.mark.parametrize("inline", [True, False])
def test_validator_without_io_runs_in_the_handshake_thread(serve, inline):
    """``validate_inline`` (variant.Validator): a validator that declares no I/O runs in the caller's
    thread (no deadline thread to wake up); any other one runs under the deadline in a worker."""
    threads = []

    class Declaring(DummyValidator):
        validate_inline = inline

        def validate(self, document, nonce):
            threads.append(threading.current_thread())
            return super().validate(document, nonce)

    server = serve(atls.AttestedServerContext(DummyIssuer()))
    atls.connect(server.endpoint, [Declaring()]).sock.close()
    assert (threads == [threading.current_thread()]) is inline
    assert threads[0].name.startswith("atls") is not inline
