# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Sockets for the attack tests: a server that never answers the handshake (or resets it), the re-attestation's
connect with a short handshake timeout, and a socket that keeps every byte it receives."""

from __future__ import annotations

import socket

from ansible_collections.constellation.cluster.plugins.module_utils import atls
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient
from ansible_collections.constellation.cluster.tests.support.core_fakes import close_all
from ansible_collections.constellation.cluster.tests.support.loopback import LoopbackServer


class BlackHole(LoopbackServer):
    """Accepts TCP and never answers the handshake (or, ``reset``, closes each connection at once)."""

    def __init__(self, reset=False):
        self.held = []
        self.reset = reset
        super().__init__()

    def serve(self, sock):
        if self.reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            sock.close()
        else:
            self.held.append(sock)

    def close(self):
        super().close()
        close_all(self.held)


def connect_to(endpoint, validators, timeout=1.0):
    """The re-attestation connect (AgentClient over the real aTLS client), with a short handshake timeout."""
    def connect_peer(_public_ip):
        conn = atls.connect(endpoint, validators, timeout=timeout)
        return AgentClient(conn.sock, atls.spki_hash(conn_cert_key(conn)), conn)
    return connect_peer


def conn_cert_key(conn):
    from cryptography import x509
    return x509.load_der_x509_certificate(conn.peer_certificate).public_key()


class RecordingSocket:
    """A connected socket that keeps every byte it receives (what an attacker walks away with)."""

    def __init__(self, sock):
        self.sock = sock
        self.received = bytearray()

    def recv(self, size):
        data = self.sock.recv(size)
        self.received += data
        return data

    def __getattr__(self, name):
        return getattr(self.sock, name)
