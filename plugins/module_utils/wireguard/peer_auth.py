# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Proof of a VPN peer's WireGuard private key (the vpnapi's ``PeerAuth``, docs/protocol.md).

The WireGuard tunnel authenticates a packet's source VPN IP, not the process that sent it: any process
on a Node (an unprivileged user, a hostNetwork pod) can connect from the Node's VPN IP. The agent alone
holds the Node's WireGuard private key (0600 in its state directory), and the Coordinator's registry
records every peer's public key at activation. So a caller proves it is the agent by a MAC only the
holder of that private key can make:

    pair_key = HKDF-SHA256(X25519(own_priv_key, other_pub_key), info=PAIR_KEY_CONTEXT)   (static-static DH:
               the Node computes it with its private key and the Coordinator's public key, the
               Coordinator with its private key and the public key its registry holds for the caller)
    proof    = HMAC-SHA256(pair_key, PROOF_CONTEXT || challenge || client VPN IP || server VPN IP
                                     || server's WireGuard public key)

``challenge`` is fresh per connection (the server's); the addresses and the server's key bind the proof
to this connection's two ends and to this Coordinator, so a proof seen elsewhere is worth nothing.
Pure functions plus a small per-peer cache of pair keys; no sockets.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import threading
from typing import Any, Dict, Mapping, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.encoding import b64decode
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard.keys import key_bytes, normalize_pub_key

try:
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
except ImportError:  # pragma: no cover - reported by the modules via HAS_CRYPTOGRAPHY
    HAS_CRYPTOGRAPHY = False
else:
    HAS_CRYPTOGRAPHY = True

PAIR_KEY_CONTEXT = b"constellation-vpnapi-peer-auth-key-v1"
PROOF_CONTEXT = b"constellation-vpnapi-peer-auth-v1\x00"
CHALLENGE_SIZE = 32
PROOF_SIZE = 32
MAX_CACHED_PAIR_KEYS = 4096


def pair_key(own_priv_key: str, other_pub_key: str) -> bytes:
    """The key both ends of a WireGuard pair derive alike (X25519 static-static, then HKDF-SHA256).
    InputError for a malformed key or a low-order public key (no shared secret)."""
    own = X25519PrivateKey.from_private_bytes(key_bytes(own_priv_key, "vpn_priv_key"))
    return _pair_key(own, other_pub_key)


def _pair_key(own, other_pub_key: str) -> bytes:
    other = X25519PublicKey.from_public_bytes(key_bytes(other_pub_key, "vpn_pub_key"))
    try:
        shared = own.exchange(other)
    except ValueError:  # an all-zero result: a low-order point
        raise InputError("vpn_pub_key", "a WireGuard public key with a shared secret (not a low-order point)") from None
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=PAIR_KEY_CONTEXT).derive(shared)


def proof_message(challenge: bytes, client_vpn_ip: str, server_vpn_ip: str, server_vpn_pub_key: str) -> bytes:
    """What the proof MACs: the server's fresh challenge and both ends of this connection."""
    if not isinstance(challenge, bytes) or len(challenge) != CHALLENGE_SIZE:
        raise InputError("challenge", "%d bytes" % CHALLENGE_SIZE)
    client = ipaddress.ip_address(client_vpn_ip).packed
    server = ipaddress.ip_address(server_vpn_ip).packed
    return (PROOF_CONTEXT + challenge + bytes([len(client)]) + client + bytes([len(server)]) + server
            + key_bytes(server_vpn_pub_key, "server_vpn_pub_key"))


def make_proof(key: bytes, challenge: bytes, client_vpn_ip: str, server_vpn_ip: str, server_vpn_pub_key: str) -> bytes:
    return hmac.new(key, proof_message(challenge, client_vpn_ip, server_vpn_ip, server_vpn_pub_key),
                    hashlib.sha256).digest()


def check_proof(key: bytes, proof: bytes, challenge: bytes, client_vpn_ip: str, server_vpn_ip: str,
                server_vpn_pub_key: str) -> bool:
    """True if ``proof`` is the MAC for this challenge and connection (constant-time comparison)."""
    if not isinstance(proof, bytes) or len(proof) != PROOF_SIZE:
        return False
    expected = make_proof(key, challenge, client_vpn_ip, server_vpn_ip, server_vpn_pub_key)
    return hmac.compare_digest(expected, proof)


class PairKeys:
    """One side's pair keys with its peers, cached by the peer's public key (the X25519 exchange is the
    cost of a proof; a poll every few seconds need not pay it each time). Bounded: emptied when full."""

    def __init__(self, own_priv_key: str, max_cached: int = MAX_CACHED_PAIR_KEYS):
        self._own = X25519PrivateKey.from_private_bytes(key_bytes(own_priv_key, "vpn_priv_key"))
        raw = self._own.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.own_pub_key = base64.b64encode(raw).decode("ascii")
        self._cache: Dict[str, bytes] = {}
        self._max = max_cached
        self._lock = threading.Lock()

    def key_for(self, other_pub_key: str) -> bytes:
        other = normalize_pub_key(other_pub_key, "vpn_pub_key")
        with self._lock:
            cached = self._cache.get(other)
        if cached is not None:
            return cached
        key = _pair_key(self._own, other)
        with self._lock:
            if len(self._cache) >= self._max:
                self._cache.clear()
            self._cache[other] = key
        return key

    def proof(self, server_vpn_pub_key: str, challenge: bytes, client_vpn_ip: str, server_vpn_ip: str) -> bytes:
        """The client's proof (this side is the client)."""
        return make_proof(self.key_for(server_vpn_pub_key), challenge, client_vpn_ip, server_vpn_ip, server_vpn_pub_key)

    def answer(self, step: Mapping[str, Any], client_vpn_ip: str, server_vpn_ip: str,
               expected_server_pub_key: Optional[str] = None) -> bytes:
        """The client's proof for the server's challenge message ``{challenge, server_vpn_pub_key}``.
        InputError for a malformed message or a server key other than ``expected_server_pub_key``."""
        challenge = b64decode(step.get("challenge"), "challenge", CHALLENGE_SIZE)
        announced = normalize_pub_key(step.get("server_vpn_pub_key"), "server_vpn_pub_key")
        expected = (normalize_pub_key(expected_server_pub_key, "server_vpn_pub_key")
                    if expected_server_pub_key is not None else None)
        if expected is not None and announced != expected:
            raise InputError("server_vpn_pub_key", "the WireGuard key this peer knows for the server")
        return self.proof(announced, challenge, client_vpn_ip, server_vpn_ip)

    def check(self, client_vpn_pub_key: str, proof: bytes, challenge: bytes, client_vpn_ip: str,
              server_vpn_ip: str) -> bool:
        """The server's check (this side is the server; its own public key is in the message)."""
        try:
            key = self.key_for(client_vpn_pub_key)
        except InputError:
            return False
        return check_proof(key, proof, challenge, client_vpn_ip, server_vpn_ip, self.own_pub_key)


class NodePeerAuth:
    """A Node agent's side (agent/update_loop.py): PeerAuth on each new vpnapi connection with the node's WireGuard key
    (its pair keys cached across polls), checking the Coordinator's announced key against the one the
    node knows from its peers."""

    def __init__(self):
        self._cached: Optional[tuple] = None

    def authenticate(self, client: Any, node_state: Mapping[str, Any]) -> Any:
        """``client.peer_auth`` for the node in ``node_state`` (NodeState.to_dict()); returns ``client``."""
        priv_key = node_state.get("vpn_priv_key")
        if self._cached is None or self._cached[0] != priv_key:
            self._cached = (priv_key, PairKeys(priv_key))
        server_ip = client.sock.getpeername()[0]
        known = {p.get("vpn_ip"): p.get("vpn_pub_key") for p in node_state.get("peers") or ()}
        if node_state.get("coordinator_vpn_pub_key") and server_ip == node_state.get("coordinator_vpn_ip"):
            known.setdefault(server_ip, node_state["coordinator_vpn_pub_key"])
        client.peer_auth(self._cached[1], known.get(server_ip))
        return client
