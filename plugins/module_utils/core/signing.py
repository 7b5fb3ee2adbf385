# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Coordinator signatures (docs/protocol.md, "Coordinator signatures").

Every Coordinator derives the same Ed25519 key from the cluster's KMS (``kms.coordinator_signing_priv_key``);
Nodes pin its public key (``coordinator_pub_key``: at activation, or from the agent config for a node that
joins by itself) and check it on everything they get over a channel that does not prove it is a
Coordinator's: join tickets and rejoin tickets (the aTLS server is checked with the policy without PCR 15,
which every Node of the cluster passes) and peer updates (GetUpdate).

What is signed: a context string (what the message is), then canonical JSON (sorted keys, no spaces,
ASCII) of the payload. Tickets are bound to the request and the connection they answer (``binding``: the
user data of the node's attestation, which holds the connection's server key), so a signed ticket
cannot be replayed to another connection.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.errors import AccessDenied, InputError

if TYPE_CHECKING:  # pragma: no cover
    from ansible_collections.constellation.cluster.plugins.module_utils.core.context import PeerContext

try:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
except ImportError:  # ansible-test's import sanity runs without third-party packages
    pass

SIGNATURE_CONTEXT = b"constellation-coordinator-signature-v1\x00"
CONTEXT_JOIN_TICKET = "join_ticket"
CONTEXT_REJOIN_TICKET = "rejoin_ticket"
CONTEXT_PEERS = "peers"
SIGNATURE_FIELD = "signature"
# Coordinator authentication on a peer's admin channel (AdminAuth role coordinator): a fresh server challenge
# bound to the connection's server key, signed with the Coordinators' key. It unlocks GetState's details
# (the Coordinator's re-attestation and resumed activations read them), never Exec, PutFile or FetchFile.
AUTH_CONTEXT = b"constellation-coordinator-auth-v1\x00"
PUB_KEY_LENGTH = 32
SIGNATURE_LENGTH = 64


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def message(context: str, payload: Any) -> bytes:
    return SIGNATURE_CONTEXT + context.encode("ascii") + b"\x00" + canonical_json(payload)


def parse_coordinator_pub_key(value: Any, field: str = "coordinator_pub_key") -> str:
    """A pinned Coordinator key: standard base64 of 32 raw Ed25519 bytes; returned normalised."""
    if not isinstance(value, str) or not value:
        raise InputError(field, "the Coordinators' Ed25519 public key (standard base64 of 32 bytes)",
                         type(value).__name__ if not isinstance(value, str) else "an empty string")
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise InputError(field, "standard base64 of 32 bytes (an Ed25519 public key)") from None
    if len(raw) != PUB_KEY_LENGTH:
        raise InputError(field, "standard base64 of 32 bytes (an Ed25519 public key)", "%d bytes" % len(raw))
    return base64.b64encode(raw).decode("ascii")


def sign(priv_key, context: str, payload: Any) -> str:
    """The signature (standard base64) of ``payload`` under ``context``."""
    return base64.b64encode(priv_key.sign(message(context, payload))).decode("ascii")


def verify(pub_key: Optional[str], context: str, payload: Any, signature: Any, what: str) -> None:
    """Raises AccessDenied unless ``signature`` is the Coordinators' signature of ``payload``."""
    if not pub_key:
        raise AccessDenied("%s: this node has no pinned Coordinator key (coordinator_pub_key): it cannot check "
                           "that this comes from a Coordinator, and refuses it" % what)
    if not isinstance(signature, str) or not signature:
        raise AccessDenied("%s: not signed by a Coordinator (no signature): refused" % what)
    try:
        raw = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        raise AccessDenied("%s: the signature is not base64: refused" % what) from None
    try:
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(parse_coordinator_pub_key(pub_key)))
        key.verify(raw, message(context, payload))
    except (InvalidSignature, ValueError, InputError):
        raise AccessDenied("%s: the signature does not verify with the pinned Coordinator key: refused" % what) \
            from None


def auth_message(challenge: bytes, server_spki_hash: bytes) -> bytes:
    return AUTH_CONTEXT + bytes(challenge) + bytes(server_spki_hash)


def verify_auth(pub_key: Optional[str], signature: bytes, challenge: bytes, server_spki_hash: bytes) -> bool:
    """True if ``signature`` is the Coordinators' signature of this connection's challenge."""
    if not pub_key:
        return False
    try:
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(parse_coordinator_pub_key(pub_key)))
        key.verify(bytes(signature), auth_message(challenge, server_spki_hash))
    except (InvalidSignature, ValueError, InputError):
        return False
    return True


def ticket_payload(ticket: Mapping[str, Any], binding: bytes) -> dict:
    """What a ticket's signature covers: the ticket as sent (without its signature) and the binding."""
    return {"binding": base64.b64encode(bytes(binding)).decode("ascii"),
            "ticket": {k: v for k, v in ticket.items() if k != SIGNATURE_FIELD}}


def peers_payload(resource_version: int, peers: Iterable[Any], cluster_pod_cidr: Optional[str] = None) -> dict:
    """What a peer list's signature covers: the version and every peer (``PeerRecord`` or its dict, its pod CIDR
    included), in VPN IP order; and the cluster's pod range when it has one (docs/wireguard.md, "Pod CIDRs")."""
    rows = [p if isinstance(p, Mapping) else p.to_dict() for p in peers]
    rows.sort(key=lambda r: int(ipaddress.ip_address(r["vpn_ip"])))
    payload = {"resource_version": int(resource_version), "peers": [_signed_peer(r) for r in rows]}
    if cluster_pod_cidr:
        payload["cluster_pod_cidr"] = cluster_pod_cidr
    return payload


def _signed_peer(row: Mapping) -> dict:
    """One peer as signed: its pod CIDR too when it has one (a set without pod CIDRs signs as before them)."""
    out = {"vpn_ip": row["vpn_ip"], "vpn_pub_key": row["vpn_pub_key"], "public_ip": row.get("public_ip"),
           "role": row.get("role", "node")}
    if row.get("pod_cidr"):
        out["pod_cidr"] = row["pod_cidr"]
    return out


class Signer:
    """A Coordinator's signer: the key derived from ``kms`` (``kms.coordinator_signing_priv_key``). The peer
    set's signature is made once per version: a poll that finds nothing new costs no signature."""

    def __init__(self, kms: Any):
        from ansible_collections.constellation.cluster.plugins.module_utils import kms as kms_mod

        self.kms = kms
        self._priv_key = kms_mod.coordinator_signing_priv_key(kms)
        self.pub_key = kms_mod.coordinator_pub_key(kms)
        self._peers = (None, "")  # (version, signature)

    def __repr__(self) -> str:
        return "Signer(pub_key=%s)" % self.pub_key

    def sign_ticket(self, context: str, ticket: Mapping[str, Any], binding: bytes) -> str:
        return sign(self._priv_key, context, ticket_payload(ticket, binding))

    def sign_auth(self, challenge: bytes, server_spki_hash: bytes) -> bytes:
        """AdminAuth as the Coordinators (role coordinator) on the connection with this server key."""
        return self._priv_key.sign(auth_message(challenge, server_spki_hash))

    def peers_signature(self, peer_set: Any, cluster_pod_cidr: Optional[str] = None) -> str:
        """``peer_set``: a ``VersionedPeerSet`` (its ``version`` and ``peers``); ``cluster_pod_cidr``: the pod range."""
        version = (peer_set.version, cluster_pod_cidr)
        cached = self._peers
        if cached[0] != version:
            cached = (version, sign(self._priv_key, CONTEXT_PEERS,
                                    peers_payload(peer_set.version, peer_set.peers.values(), cluster_pod_cidr)))
            self._peers = cached
        return cached[1]


class Signing:
    """The Coordinator's signatures (its Ed25519 key from its KMS), over the peer's ``PeerContext``."""

    def __init__(self, context: PeerContext):
        self.context = context
        self._signer: Optional[Signer] = None

    def signer(self) -> Signer:
        """The Coordinators' signing key from this Coordinator's KMS, made once per KMS."""
        kms = self.context.require_coordinator("sign")
        cached = self._signer
        if cached is None or cached.kms is not kms:
            cached = self._signer = Signer(kms)
        return cached

    def coordinator_pub_key(self) -> str:
        """The key Nodes pin (every Coordinator of the cluster derives the same)."""
        return self.signer().pub_key

    def authenticate_as_coordinator(self, client: Any) -> None:
        """On an attested connection to a peer: prove the Coordinators' key (AdminAuth role coordinator),
        which unlocks the peer's GetState details (VPN IP and key, disk UUID)."""
        client.coordinator_auth(self.signer().sign_auth)

    def signed_join_ticket(self, ticket: Any, binding: bytes) -> Any:
        return ticket.signed(self.signer().sign_ticket(CONTEXT_JOIN_TICKET, ticket.to_dict(), binding))

    def signed_rejoin_ticket(self, ticket: Any, binding: bytes) -> Any:
        return ticket.signed(self.signer().sign_ticket(CONTEXT_REJOIN_TICKET, ticket.to_dict(), binding))

    def signed_update(self, peer_set: Any, resource_version: int, cluster_pod_cidr: Optional[str] = None) -> dict:
        """GetUpdate's answer: what changed since ``resource_version``; when there is anything to apply, with
        the signature of the peer set at its version (and of the cluster's pod range, which the answer then
        carries), so a Node takes peers only from a Coordinator whatever answered at the Coordinator's VPN address."""
        update = peer_set.updates_since(resource_version)
        answer = update.to_dict()
        if update or update.resource_version != resource_version:
            answer[SIGNATURE_FIELD] = self.signer().peers_signature(peer_set, cluster_pod_cidr)
            if cluster_pod_cidr:
                answer["cluster_pod_cidr"] = cluster_pod_cidr
        return answer
