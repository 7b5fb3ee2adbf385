# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""aTLS test servers: a recording server (what the server received after its side of the
handshake) and hostile servers, each a real attack on the client. Shared by test_atls.py and
test_atls_swtpm.py, imported by the collection path so that pytest and ansible-test units both
find it."""

from __future__ import annotations

import datetime
import ssl
import threading
import time
from typing import List, Optional

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils import atls
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError
from ansible_collections.constellation.cluster.tests.support.loopback import LoopbackServer


class ConnectionRecord:
    def __init__(self):
        self.done = threading.Event()
        self.handshake_error: Optional[str] = None
        self.received = b""
        self.alpn: Optional[str] = None


class RecordingServer(LoopbackServer):
    """Accepts on 127.0.0.1, runs the aTLS server handshake, records every byte received
    after it and answers b"pong" to b"ping". Bounded: stops when closed."""

    def __init__(self, server_ctx: atls.AttestedServerContext, read_timeout: float = 5.0):
        self.server_ctx = server_ctx
        self.read_timeout = read_timeout
        self.records: List[ConnectionRecord] = []
        super().__init__()

    def serve(self, sock):
        record = ConnectionRecord()
        self.records.append(record)
        threading.Thread(target=self._serve, args=(sock, record), daemon=True).start()

    def _serve(self, sock, record):
        try:
            try:
                tls = self.server_ctx.accept_handshake(sock)
            except AttestationError as err:
                record.handshake_error = str(err)
                return
            record.alpn = tls.selected_alpn_protocol()
            tls.settimeout(self.read_timeout)
            try:
                while True:
                    data = tls.recv(4096)
                    if not data:
                        break
                    record.received += data
                    if record.received.endswith(b"ping"):
                        tls.sendall(b"pong")
            except (OSError, ssl.SSLError):
                pass
            finally:
                tls.close()
        finally:
            record.done.set()

    def wait(self, count: int = 1, timeout: float = 10.0) -> List[ConnectionRecord]:
        deadline = time.monotonic() + timeout
        while len(self.records) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        for record in self.records[:count]:
            assert record.done.wait(max(deadline - time.monotonic(), 0.1)), "server connection did not finish"
        return self.records[:count]

    def close(self):
        super().close()
        self.server_ctx.close()


def assert_refused_before_any_byte(server: RecordingServer, validators, reason: str):
    """Connects, expects AttestationError matching reason, and checks the server saw a complete
    handshake and then not one application byte."""
    with pytest.raises(AttestationError, match=reason) as caught:
        conn = atls.connect(server.endpoint, validators, timeout=5)
        conn.sock.sendall(b"secret")  # must never run
    (record,) = server.wait(1)
    assert record.handshake_error is None, record.handshake_error
    assert record.received == b""
    return str(caught.value)


def exchange_ping(server: RecordingServer, conn) -> ConnectionRecord:
    """Sends "ping" over the attested ``conn``, expects the server's "pong" and closes ``conn``; returns the
    server's record of the connection, which received "ping"."""
    try:
        conn.sock.sendall(b"ping")
        assert conn.sock.recv(4) == b"pong"
    finally:
        conn.sock.close()
    (record,) = server.wait(1)
    assert record.received == b"ping"
    return record


# ---------------------------------------------------------------------------------------------
# Hostile servers (each a real attack on the client)


class ReplayingServer(atls.AttestedServerContext):
    """Serves, for every connection, a document the genuine issuer made for one old nonce."""

    def __init__(self, issuer, **kwargs):
        super().__init__(issuer, **kwargs)
        self.old_key = atls.new_key()
        self.old_document = issuer.issue(self.old_key.spki_hash, b"\x07" * 32)

    def certificate_for(self, nonce):
        key = atls.new_key(self.old_key.priv_key)
        now = datetime.datetime.now(datetime.timezone.utc)
        return key, atls.build_certificate(key.priv_key, [(self.issuer.oid, self.old_document)],
                                           now - self.validity, now + self.validity)


class RelayingServer(atls.AttestedServerContext):
    """Gets a genuine attestation for the client's nonce bound to key A (as a relay to a genuine
    node would) and presents it in a certificate of its own key B."""

    def certificate_for(self, nonce):
        genuine_key = atls.new_key()
        document = self.issue(genuine_key.spki_hash, nonce)
        own_key = atls.new_key()
        now = datetime.datetime.now(datetime.timezone.utc)
        return own_key, atls.build_certificate(own_key.priv_key, [(self.issuer.oid, document)],
                                               now - self.validity, now + self.validity)


class TamperingServer(atls.AttestedServerContext):
    """Genuine document, then rewritten by ``tamper(document) -> (oid, document)``."""

    def __init__(self, issuer, tamper, **kwargs):
        super().__init__(issuer, **kwargs)
        self.tamper = tamper

    def certificate_for(self, nonce):
        key = atls.new_key()
        oid, document = self.tamper(self.issue(key.spki_hash, nonce))
        now = datetime.datetime.now(datetime.timezone.utc)
        return key, atls.build_certificate(key.priv_key, [(oid, document)],
                                           now - self.validity, now + self.validity)


class ExpiredServer(atls.AttestedServerContext):
    def certificate_for(self, nonce):
        key = atls.new_key()
        now = datetime.datetime.now(datetime.timezone.utc)
        document = self.issue(key.spki_hash, nonce)
        return key, atls.build_certificate(key.priv_key, [(self.issuer.oid, document)],
                                           now - datetime.timedelta(hours=5), now - datetime.timedelta(hours=3))


class NonceIgnoringServer(atls.AttestedServerContext):
    """Attests with a nonce of its own choosing instead of the client's."""

    def certificate_for(self, nonce):
        return super().certificate_for(b"\x01" * 32)


class ForeignSignedServer(atls.AttestedServerContext):
    """Certificate for key A (with a valid attestation for A) but signed by key B."""

    def certificate_for(self, nonce):
        key = atls.new_key()
        cert = super().certificate_for(nonce)[1]
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        builder = (x509.CertificateBuilder().subject_name(cert.subject).issuer_name(cert.issuer)
                   .public_key(key.priv_key.public_key()).serial_number(cert.serial_number)
                   .not_valid_before(cert.not_valid_before_utc).not_valid_after(cert.not_valid_after_utc))
        document = self.issue(key.spki_hash, nonce)
        builder = builder.add_extension(x509.UnrecognizedExtension(
            x509.ObjectIdentifier(self.issuer.oid), document), critical=False)
        # Signed by another key: the TLS handshake still proves possession of key, but the
        # certificate is not self-signed.
        return key, builder.sign(atls.new_key().priv_key, hashes.SHA256())
