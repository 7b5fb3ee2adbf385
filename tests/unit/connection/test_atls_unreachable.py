# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Unreachable is not tampering, at the connection plugin: a host whose aTLS handshake is reset or ends before
its attestation arrived is unreachable with the reason, never "attestation refused" (that verdict is
kept for a document that arrived and failed verification). Real sockets on loopback."""

from __future__ import annotations

import socket
import threading

import pytest
from ansible.errors import AnsibleConnectionFailure
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import DummyIssuer, DummyValidator
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import AgentServerContext, FrameServer
from ansible_collections.constellation.cluster.plugins.plugin_utils.atls.session import open_admin_client
from ansible_collections.constellation.cluster.plugins.plugin_utils.atls.settings import Settings
from ansible_collections.constellation.cluster.tests.support.core_fakes import RefusingValidator


@pytest.fixture
def settings_for(tmp_path):
    key = tmp_path / "admin.key"
    key.write_bytes(ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))

    def make(endpoint):
        return Settings(endpoint=endpoint, variant="dummy", measurements=None, admin_priv_key_file=str(key),
                        timeout=5, attestation_timeout=5, command_timeout=0, persist=0,
                        control_path_dir=str(tmp_path), netns=None)
    return make


@pytest.fixture
def resetting():
    """Accepts each TCP connection, reads the ClientHello and resets the connection (an overloaded or
    flooded agent, or one that ends every handshake, looks so)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            try:
                sock, _addr = listener.accept()
            except OSError:
                continue
            sock.settimeout(5)
            try:
                sock.recv(4096)
            except OSError:
                pass
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            sock.close()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    yield "127.0.0.1:%d" % listener.getsockname()[1]
    stop.set()
    thread.join(5)
    listener.close()


def test_a_reset_handshake_is_reported_unreachable_not_refused(settings_for, resetting):
    with pytest.raises(AnsibleConnectionFailure) as caught:
        open_admin_client(settings_for(resetting), validators=[DummyValidator()])
    message = str(caught.value)
    assert "attestation refused" not in message
    assert resetting in message and "before the peer's attestation arrived" in message


def test_a_document_that_fails_verification_is_still_attestation_refused(settings_for):
    tls = AgentServerContext(DummyIssuer(), key_pool_size=0)
    server = FrameServer("pubapi", ("127.0.0.1", 0), {}, tls=tls).start()
    try:
        endpoint = "127.0.0.1:%d" % server.address[1]
        with pytest.raises(AnsibleConnectionFailure, match="attestation refused, nothing was sent: .*PCR 4"):
            open_admin_client(settings_for(endpoint), validators=[RefusingValidator()])
    finally:
        server.stop()
        tls.close()
