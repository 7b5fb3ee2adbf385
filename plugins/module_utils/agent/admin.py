# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The admin channel's cluster-admin RPCs (docs/protocol.md): ``AdminAuth``, ``Attest``, ``ExportState``,
``RemovePeer``, ``ResetAgent``, ``SetMeasurements``, ``AdmitNodes``, ``UsePodCIDRs``. The remote execution on the same channel
(``Exec``, ``ExecModule``, ``PutFile``, ``FetchFile``) is agent/remote_exec.py.

Refused before activation. A connection becomes an admin connection only by signing a fresh
server challenge bound to this connection's server key with the admin key pinned at activation;
no bearer token exists that could be replayed on another connection.
"""

from __future__ import annotations

import secrets
from typing import Any, Dict

try:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519
except ImportError:  # ansible-test's import sanity runs without third-party packages
    HAS_CRYPTOGRAPHY = False
else:
    HAS_CRYPTOGRAPHY = True

from ansible_collections.constellation.cluster.plugins.module_utils.constants import NODE_POD_CIDR_MASK_SIZE
from ansible_collections.constellation.cluster.plugins.module_utils.core.state import ACTIVATED, State
from ansible_collections.constellation.cluster.plugins.module_utils.core import signing
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import admin_auth_message
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import b64d, b64e
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import schema
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import AccessDenied, Connection


def verify_admin_signature(pub_key, signature: bytes, message: bytes) -> bool:
    try:
        if isinstance(pub_key, ed25519.Ed25519PublicKey):
            pub_key.verify(signature, message)
        else:
            pub_key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return False
    return True


class AdminHandlers:
    """``issue(user_data, nonce) -> document`` and ``variant_oid``: the agent's attestation issuer (as its
    aTLS server context uses it), for ``Attest``. The Core's parts it reads (agent/wiring.py passes them):
    ``context`` (state, the pinned admin key) and ``status`` (the pinned Coordinators' key, core/status.py)."""

    def __init__(self, log=None, issue=None, variant_oid: str = "", *, context=None, status=None, backup=None,
                 removal=None, reset=None, accepted_measurements=None, admissions=None, coordinator=None):
        self.context = context
        self.status = status
        self.backup = backup  # core/backup.py: ExportState
        self.removal = removal  # core/removal.py (RemovePeer)
        # ResetAgent: the agent's ``AgentReset.request`` (agent/reset.py): after the answer it stops, wipes, starts fresh.
        self.reset = reset
        self.accepted_measurements = accepted_measurements  # core/accepted_measurements.py (SetMeasurements)
        self.admissions = admissions  # core/admissions.py (AdmitNodes)
        self.coordinator = coordinator  # core/coordinator.py (UsePodCIDRs)
        self._issue = issue
        self._variant_oid = variant_oid
        self._log = log or (lambda event, **fields: None)

    def handlers(self) -> Dict[str, Any]:
        return {"AdminAuth": self.admin_auth, "Attest": self.attest, "ExportState": self.export_state,
                "RemovePeer": self.remove_peer, "ResetAgent": self.reset_agent, "SetMeasurements": self.set_measurements,
                "AdmitNodes": self.admit_nodes, "UsePodCIDRs": self.use_pod_cidrs}

    def _require_activated(self, method: str) -> None:
        if self.context.state not in ACTIVATED:
            raise StateError("%s: the admin channel opens only after activation; this node is %s"
                             % (method, self.context.state.wire_name))

    def _holds_state(self) -> bool:
        """A rebooted peer that holds a cluster's state and waits for Recover or its rejoin (PCR 15 reset)."""
        return bool(getattr(self.context, "recovery_pending", False)) and self.context.admin_pub_key() is not None

    # Every handler gets its request decoded by the server (schema.py records). Each method but AdminAuth runs only
    # on a connection that proved the admin key, in the states its declaration names (schema.py ``access``): the
    # server checks that before the handler runs.
    def admin_auth(self, conn: Connection, request: schema.AdminAuthRequest) -> None:
        role = request.role or "admin"
        if role not in ("admin", "coordinator"):
            raise InputError("role", "admin or coordinator", role[:32])
        if role == "coordinator":
            self._coordinator_auth(conn)
            return
        if self.context.state != State.NODE_WAITING_FOR_CLUSTER_JOIN and not self._holds_state():
            # Its admin key is pinned: GetState's details and ResetAgent (Exec, PutFile, FetchFile still need an
            # activated node).
            self._require_activated("AdminAuth")
        if conn.server_spki_hash is None:
            raise AccessDenied("AdminAuth: only over aTLS")
        pub_key = self.context.admin_pub_key()
        challenge = secrets.token_bytes(32)
        conn.stream.send_msg({"challenge": b64e(challenge)})
        step = conn.recv_owed("the signed challenge")  # a short deadline, replaceable meanwhile
        signature = b64d(step.get("signature"), "signature", max_size=1024)
        if pub_key is None or not verify_admin_signature(pub_key, signature,
                                                         admin_auth_message(challenge, conn.server_spki_hash)):
            self._log("admin_auth_refused", peer=conn.peer_ip)
            raise AccessDenied("AdminAuth: the signature does not verify with the admin key pinned at activation")
        conn.admin = True
        self._log("admin_authenticated", peer=conn.peer_ip)
        conn.stream.send_result({"authenticated": True})

    def _coordinator_auth(self, conn: Connection) -> None:
        """AdminAuth role coordinator: the caller signs a fresh challenge bound to this connection's server
        key with the Coordinators' key this peer pinned (core/signing.py). The connection then gets
        GetState's details; it is NOT an admin connection (Exec, PutFile, FetchFile stay refused)."""
        if conn.server_spki_hash is None:
            raise AccessDenied("AdminAuth: only over aTLS")
        pub_key = self.status.pinned_coordinator_pub_key()
        if pub_key is None:
            raise StateError("AdminAuth (role coordinator): this node has pinned no Coordinator key (it is %s)"
                             % self.context.state.wire_name)
        challenge = secrets.token_bytes(32)
        conn.stream.send_msg({"challenge": b64e(challenge)})
        step = conn.recv_owed("the signed challenge")  # a short deadline, replaceable meanwhile
        signature = b64d(step.get("signature"), "signature", max_size=1024)
        if not signing.verify_auth(pub_key, signature, challenge, conn.server_spki_hash):
            self._log("coordinator_auth_refused", peer=conn.peer_ip)
            raise AccessDenied("AdminAuth (role coordinator): the signature does not verify with the pinned "
                               "Coordinator key")
        conn.coordinator = True
        self._log("coordinator_authenticated", peer=conn.peer_ip)
        conn.stream.send_result({"authenticated": True})

    def attest(self, conn: Connection, request: schema.AttestRequest) -> None:
        """A fresh quote over the caller's nonce whose user data is this connection's certificate key
        (as the certificate's own attestation): the TPM vouches again, now, for the software holding
        this TLS connection. Admin only (a quote costs TPM time)."""
        if conn.server_spki_hash is None or self._issue is None:
            raise AccessDenied("Attest: only over aTLS on an agent with an attestation issuer")
        document = self._issue(conn.server_spki_hash, request.nonce)
        conn.stream.send_result({"attestation": b64e(document), "variant_oid": self._variant_oid})

    def export_state(self, conn: Connection, request: schema.Empty) -> None:  # pylint: disable=unused-argument
        """The Coordinator's whole store (backup.yml): admin-authenticated, activated Coordinators only."""
        state = self.backup.export_state()
        self._log("state_exported_to_admin", peer=conn.peer_ip)
        conn.stream.send_result(state)

    # -- Day-2: RemovePeer (on the Coordinator), ResetAgent (on the peer to reset)
    def remove_peer(self, conn: Connection, request: schema.RemovePeerRequest) -> None:
        """The admin removes a Node (core/removal.py); a Node refuses (the Core: not a Coordinator)."""
        if self.removal is None:
            raise AccessDenied("RemovePeer: this agent removes no peers")
        result = self.removal.remove_node(public_ip=request.node_public_ip, vpn_ip=request.node_vpn_ip,
                                          check=bool(request.check))
        self._log("remove_peer", peer=conn.peer_ip, check=bool(request.check), changed=result["changed"])
        conn.stream.send_result(result)

    def admit_nodes(self, conn: Connection, request: schema.AdmitNodesRequest) -> None:
        """The admin admits nodes to join (core/admissions.py): admin only, on an activated Coordinator (declared in
        the schema, enforced by the server; the Core checks the role too)."""
        if self.admissions is None:
            raise AccessDenied("AdmitNodes: this agent admits no nodes")
        answer = self.admissions.admit_nodes(request.nodes, bool(request.check))
        self._log("admit_nodes", peer=conn.peer_ip, check=bool(request.check), changed=answer["changed"])
        conn.stream.send_result(schema.AdmitNodesAnswer.decode(answer).encode())

    def use_pod_cidrs(self, conn: Connection, request: schema.UsePodCIDRsRequest) -> None:
        """The admin turns the pod network on (core/coordinator.py ``use_pod_cidrs``): admin only, on an activated
        Coordinator (declared in the schema, enforced by the server; the Core checks the role too)."""
        if self.coordinator is None:
            raise AccessDenied("UsePodCIDRs: this agent hands out no pod CIDRs")
        mask = request.node_pod_cidr_mask_size
        answer = self.coordinator.use_pod_cidrs(request.cluster_pod_cidr, NODE_POD_CIDR_MASK_SIZE if mask is None else mask,
                                                bool(request.check))
        self._log("use_pod_cidrs", peer=conn.peer_ip, check=bool(request.check), changed=answer["changed"])
        conn.stream.send_result(schema.UsePodCIDRsAnswer.decode(answer).encode())

    def reset_agent(self, conn: Connection, request: schema.ResetAgentRequest) -> None:
        """The admin resets this agent (agent/reset.py ``AgentReset.request``): ``confirm`` must be this peer's
        public IP. A Coordinator refuses: its reset would end the cluster (remove_coordinator.yml first)."""
        public_ip = self.context.public_ip
        if request.confirm != public_ip:
            raise InputError("confirm", "this peer's public IP %s" % public_ip,
                             request.confirm if len(request.confirm) <= 64 else None)
        if self.context.role == "coordinator" and not request.force:
            raise StateError("ResetAgent: %s is a Coordinator: resetting it would take the cluster's state with it "
                             "(take it out first: remove_coordinator.yml; force: reset it anyway)" % public_ip)
        if self.reset is None:
            raise AccessDenied("ResetAgent: this agent cannot reset itself")
        wiped = self.reset()
        self._log("reset_requested", level="warning", peer=conn.peer_ip)
        conn.stream.send_result({"state": "resetting", "wiped": wiped})

    def set_measurements(self, conn: Connection, request: schema.SetMeasurementsRequest) -> None:
        """The accepted measurement sets (an image upgrade): admin only, on a Coordinator (the Core checks the role,
        the signature, the version and that no peer still runs a set the document drops)."""
        answer = self.accepted_measurements.set_measurements(request.document, request.signature, bool(request.check))
        self._log("set_measurements", peer=conn.peer_ip, version=answer["version"], changed=answer["changed"],
                  check=bool(request.check))
        conn.stream.send_result(schema.SetMeasurementsAnswer.decode(answer).encode())
