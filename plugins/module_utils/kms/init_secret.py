# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The init secret: no hijacking a fresh node (docs/agent.md, "Init secret").

As with Constellation's bootstrapper (``initSecretHash``), a node is provisioned with a SHA-256 and
accepts activation only from whoever proves the preimage. Here the preimage is per node:

* the cluster's init secret ``S`` (32 random bytes, std base64 in the operator's Vault) stays with the
  controller and, after its activation, with the Coordinator;
* node ``N``'s init secret is ``s_N = HMAC-SHA256(S, "constellation-node-init-v1\\0" || N's public IP)``;
  its agent config holds only ``init_secret_hash = hex(SHA-256(s_N))`` (the node_agent role and the lab
  compute it with ``init_secret_hash(S, public_ip)``);
* ActivateAsCoordinator carries ``S`` (the Coordinator checks ``SHA-256(s_self)`` and keeps ``S`` to
  prove itself to nodes); ActivateAsNode and a join ticket carry ``s_N`` for that node only, sent on an
  aTLS connection to the attested node (nobody else can read it), so a node that leaks its proof can
  only give away itself, and a proof for one node is refused by every other.

The proof is checked before the node lock is taken; errors never quote a secret or a hash.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from typing import Any, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.encoding import b64decode
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    REASON_INIT_PROOF,
    AccessDenied,
    InputError,
)

INIT_SECRET_LENGTH = 32
NODE_INIT_CONTEXT = b"constellation-node-init-v1\x00"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def parse_init_secret(value: Any, field: str = "init_secret") -> bytes:
    """The cluster's init secret: std base64 of 32 bytes (bytes are taken as they are)."""
    if isinstance(value, (bytes, bytearray)):
        if len(value) != INIT_SECRET_LENGTH:
            raise InputError(field, "%d bytes" % INIT_SECRET_LENGTH)
        return bytes(value)
    try:
        return b64decode(value.strip() if isinstance(value, str) else value, field, INIT_SECRET_LENGTH)
    except InputError:
        raise InputError(field, "std base64 of %d random bytes" % INIT_SECRET_LENGTH) from None


def parse_init_secret_hash(value: Any, field: str = "init_secret_hash") -> str:
    """A node's provisioned hash: 64 hex digits (normalised to lower case)."""
    text = value.strip().lower() if isinstance(value, str) else None
    if text is None or not _HEX64.match(text):
        raise InputError(field, "the hex SHA-256 of this node's init secret (64 hex digits)")
    return text


def require_init_secret_hash(value: Any, insecure_unauthenticated_activation: bool = False,
                             field: str = "init_secret_hash") -> Optional[str]:
    """The agent's ``init_secret_hash``, required: without it any client that reaches a
    fresh node activates it with its own admin key and then runs Exec as root there. ``None`` only
    with the explicit ``insecure_unauthenticated_activation: true`` (the agent warns on every start)."""
    if value is not None:
        return parse_init_secret_hash(value, field)
    if insecure_unauthenticated_activation is True:
        return None
    raise InputError(field, "the hex SHA-256 of this node's init secret (docs/agent.md, \"Init secret\"; role "
                     "variable node_agent_init_secret_hash): without it any client that reaches this fresh node "
                     "activates it with its own admin key; set insecure_unauthenticated_activation: true to "
                     "accept that")


def node_init_secret(init_secret: bytes, public_ip: str) -> bytes:
    """``s_N``: the init secret of the node whose public IP is ``public_ip``."""
    address = str(ipaddress.ip_address(public_ip))
    return hmac.new(init_secret, NODE_INIT_CONTEXT + address.encode("ascii"), hashlib.sha256).digest()


def init_secret_hash(init_secret: Any, public_ip: str) -> str:
    """What the node at ``public_ip`` is provisioned with (agent config ``init_secret_hash``)."""
    return hashlib.sha256(node_init_secret(parse_init_secret(init_secret), public_ip)).hexdigest()


def check_node_proof(proof: Optional[bytes], expected_hash: Optional[str], method: str) -> None:
    """Refuses a missing or wrong proof (``AccessDenied``, reason ``init_proof``) where the node was
    provisioned with a hash; without one the node accepts any activation (the caller logs a warning)."""
    if expected_hash is None:
        return
    if not isinstance(proof, (bytes, bytearray)) or not proof:
        raise AccessDenied("%s: this node requires proof of its init secret (it was provisioned with "
                           "init_secret_hash) and none was given" % method).with_reason(REASON_INIT_PROOF)
    if not hmac.compare_digest(hashlib.sha256(bytes(proof)).hexdigest(), expected_hash):
        raise AccessDenied("%s: the proof of the init secret does not match this node's init_secret_hash"
                           % method).with_reason(REASON_INIT_PROOF)
