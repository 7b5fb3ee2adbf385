# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pubapi (docs/protocol.md): thin handlers over the Core, plus the Coordinator's side of
node activation and the joining node's side of ``IssueJoinTicket``."""

from __future__ import annotations

import hmac
import secrets
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Sequence

from ansible_collections.constellation.cluster.plugins.module_utils import atls
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    PCR_INDEX_CLUSTER_ID,
    Measurement,
    Measurements,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core import JoinTicket, State, normalize_disk_uuid
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    AttestationError,
    ConstellationError,
    InputError,
)
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import (
    AgentClient,
    connect_enrolling,
    join_user_data,
)
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import ConnectionClosed, b64d, b64e
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import AccessDenied, Connection

MAX_NODES_PER_CALL = 256
ACTIVATION_WORKERS = 16


def fresh_node_policy(policy: Measurements) -> Measurements:
    """The policy a Coordinator checks nodes against: its own, plus PCR 15 = zeros (a node that
    already belongs to a cluster is never activated again)."""
    pcrs = dict(policy.pcrs)
    pcrs[PCR_INDEX_CLUSTER_ID] = Measurement(bytes(32), False)
    return Measurements(pcrs)


def coordinator_policy(policy: Measurements) -> Measurements:
    """The policy a joining node checks the Coordinator against: PCR 15 of an activated
    Coordinator holds its cluster ID, which a fresh node cannot know yet."""
    return Measurements({i: m for i, m in policy.pcrs.items() if i != PCR_INDEX_CLUSTER_ID})


class PubAPI:
    """``validator_for_nodes``: the Coordinator's validator for fresh nodes.
    ``connect_node(endpoint) -> AgentClient``: aTLS connection to a node, verified with it."""

    def __init__(self, core, validator_for_nodes=None, connect_node: Optional[Callable[[str], AgentClient]] = None,
                 admin=None, log=None, issuer=None):
        self.core = core
        self.validator_for_nodes = validator_for_nodes
        self.issuer = issuer
        self.connect_node = connect_node or (lambda endpoint: connect_enrolling(
            lambda validators: AgentClient.connect(endpoint, validators), [validator_for_nodes]))
        self.admin = admin
        self._log = log or (lambda event, **fields: None)

    def handlers(self) -> Dict[str, Any]:
        return {"GetState": self.get_state, "ActivateAsCoordinator": self.activate_as_coordinator,
                "ActivateAsNode": self.activate_as_node, "ActivateAdditionalNodes": self.activate_additional_nodes,
                "IssueJoinTicket": self.issue_join_ticket, "Recover": self.recover, "EnrollAK": self.enroll_ak}

    def get_state(self, conn: Connection, params: Dict[str, Any]) -> None:
        conn.stream.send_result(self.core.get_state())

    def activate_as_coordinator(self, conn: Connection, params: Dict[str, Any]) -> None:
        result = self.core.activate_as_coordinator(params.get("kms_uri"), params.get("measurement_salt"),
                                                   params.get("admin_pub_key"), params.get("storage_uri"),
                                                   params.get("cluster_config"))
        conn.stream.send_result(result.to_dict())

    def activate_as_node(self, conn: Connection, params: Dict[str, Any]) -> None:
        step = self.core.activate_as_node_begin(params)
        try:
            conn.stream.send_msg({"state_disk_uuid": step.state_disk_uuid, "node_vpn_pub_key": step.node_vpn_pub_key})
            answer = conn.stream.recv_msg("the state disk key")
            key = b64d(answer.get("state_disk_key"), "state_disk_key", 32)
        except BaseException as err:
            self.core.abort_node_activation("ActivateAsNode was not completed: %s" % err)
            raise
        conn.stream.send_result(self.core.activate_as_node_finish(key))

    def recover(self, conn: Connection, params: Dict[str, Any]) -> None:
        conn.stream.send_result(self.core.recover(params.get("kms_uri")))

    def enroll_ak(self, conn: Connection, params: Dict[str, Any]) -> None:
        """qemu-vtpm-ek: our EK certificate and AK, then TPM2_ActivateCredential of the verifier's
        challenge. Any state: nothing secret is involved (the secret is the verifier's own)."""
        if self.issuer is None or not hasattr(self.issuer, "enrollment_request"):
            raise InputError("EnrollAK", "an agent whose attestation variant enrolls its AK (qemu-vtpm-ek)")
        conn.stream.send_msg(self.issuer.enrollment_request())
        answer = conn.stream.recv_msg("the credential challenge")
        secret = self.issuer.activate_credential(answer.get("challenge"))
        self._log("ak_enrolled", peer=conn.peer_ip)
        conn.stream.send_result({"secret": b64e(secret)})

    # -- Coordinator: activate nodes listed by the admin
    def activate_additional_nodes(self, conn: Connection, params: Dict[str, Any]) -> None:
        if self.admin is None:
            raise AccessDenied("ActivateAdditionalNodes: no admin channel on this agent")
        self.admin.require_admin(conn, "ActivateAdditionalNodes")
        self.core.require_coordinator("ActivateAdditionalNodes")
        endpoints = params.get("node_public_endpoints")
        if not isinstance(endpoints, list) or not endpoints or len(endpoints) > MAX_NODES_PER_CALL:
            raise InputError("node_public_endpoints", "a non-empty list of host:port (at most %d)" % MAX_NODES_PER_CALL)
        for index, endpoint in enumerate(endpoints):
            atls.parse_endpoint(endpoint, "node_public_endpoints[%d]" % index)
        results = activate_nodes(self.core, endpoints, self.connect_node, self._log)
        for row in results:
            conn.stream.send_msg({"log": "%s: %s" % (row["node_public_endpoint"],
                                                     "activated as %s" % row["node_vpn_ip"] if row["ok"]
                                                     else "failed: %s" % row["error"])})
        conn.stream.send_result({"nodes": results, "resource_version": self.core.get_update(-1)["resource_version"]})

    # -- Coordinator: the join service
    def issue_join_ticket(self, conn: Connection, params: Dict[str, Any]) -> None:
        self.core.require_coordinator("IssueJoinTicket")
        if conn.server_spki_hash is None or self.validator_for_nodes is None:
            raise AccessDenied("IssueJoinTicket: only over aTLS on a Coordinator with a node policy")
        disk_uuid = normalize_disk_uuid(params.get("disk_uuid"))
        node_pub = b64d(params.get("node_vpn_pub_key"), "node_vpn_pub_key", 32)
        nonce = secrets.token_bytes(32)
        conn.stream.send_msg({"nonce": b64e(nonce)})
        answer = conn.stream.recv_msg("the node's attestation")
        document = b64d(answer.get("attestation"), "attestation", max_size=4 * 1024 * 1024 // 3 * 2)
        oid = answer.get("variant_oid")
        if oid != self.validator_for_nodes.oid:
            raise AttestationError("IssueJoinTicket: attestation variant %r is not accepted (expected %s)"
                                   % (oid, self.validator_for_nodes.oid))
        try:
            validation = self.validator_for_nodes.validate(document, nonce)
        except AttestationError as err:
            self._log("join_refused", peer=conn.peer_ip, reason=str(err)[:300])
            raise AttestationError("IssueJoinTicket: attestation refused: %s" % err) from None
        expected = join_user_data(conn.server_spki_hash, node_pub, params.get("disk_uuid"))
        if not hmac.compare_digest(bytes(validation.user_data), expected):
            self._log("join_refused", peer=conn.peer_ip, reason="user data not bound to this connection")
            raise AttestationError("IssueJoinTicket: the attestation is not bound to this connection and request "
                                   "(relayed or replayed?)")
        vpn_ip = self.core.reserve_node_ip()
        added = False
        try:
            ticket = self.core.issue_join_ticket(disk_uuid, vpn_ip)
            conn.stream.send_msg({"ticket": ticket.to_dict()})
            done = conn.stream.recv_msg("the node's confirmation")
            if done.get("joined") is not True:
                raise InputError("joined", "true")
            version = self.core.add_node_peer(vpn_ip, b64e(node_pub), conn.peer_ip)
            added = True
        finally:
            if not added:
                self.core.release_node_ip(vpn_ip)
        self._log("node_joined", peer=conn.peer_ip, node_vpn_ip=vpn_ip)
        conn.stream.send_result({"resource_version": version, "node_vpn_ip": vpn_ip})


def activate_node(core, endpoint: str, connect_node: Callable[[str], AgentClient], log) -> Dict[str, Any]:
    """The Coordinator activates one node: aTLS-verify it, reserve an IP, ActivateAsNode."""
    host, _port = atls.parse_endpoint(endpoint)
    row: Dict[str, Any] = {"node_public_endpoint": endpoint, "ok": False, "node_vpn_ip": None, "error": None}
    vpn_ip = None
    try:
        with connect_node(endpoint) as client:
            vpn_ip = core.reserve_node_ip()
            request = core.node_activation_request(vpn_ip)
            result = client.activate_as_node(request.to_dict(), core.state_disk_key)
            core.add_node_peer(vpn_ip, result["node_vpn_pub_key"], host)
        row.update(ok=True, node_vpn_ip=vpn_ip, state_disk_uuid=result["state_disk_uuid"])
        log("node_activated", node=endpoint, node_vpn_ip=vpn_ip)
    except (ConstellationError, OSError) as err:
        if vpn_ip is not None:
            try:
                core.release_node_ip(vpn_ip)
            except ConstellationError:
                pass
        row["error"] = str(err) or type(err).__name__
        log("node_activation_failed", node=endpoint, error=row["error"][:300])
    return row


def activate_nodes(core, endpoints: Sequence[str], connect_node, log) -> List[Dict[str, Any]]:
    with ThreadPoolExecutor(max_workers=min(ACTIVATION_WORKERS, len(endpoints)), thread_name_prefix="activate") as pool:
        return list(pool.map(lambda e: activate_node(core, e, connect_node, log), endpoints))


def join_cluster(core, coordinator_endpoint: str, validators, issuer, connect=None) -> Dict[str, Any]:
    """The joining node's side: verify the Coordinator, attest ourselves in-band, take the ticket."""
    connect = connect or (lambda endpoint: connect_enrolling(lambda v: AgentClient.connect(endpoint, v), validators))
    with connect(coordinator_endpoint) as client:
        outcome: Dict[str, Any] = {}

        def on_ticket(ticket: Dict[str, Any]) -> None:
            outcome.update(core.join(JoinTicket.from_dict(ticket)))

        try:
            result = client.issue_join_ticket(core.disk_uuid, core.join_vpn_pub_key(), issuer, on_ticket)
        except ConnectionClosed:
            if core.state == State.IS_NODE:
                # We are locked and configured; the Coordinator missed our confirmation.
                raise ConstellationError("joined, but the Coordinator did not confirm; it may not list us yet")
            raise
        outcome.update(result)
        return outcome
