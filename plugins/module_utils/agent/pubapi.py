# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pubapi (docs/protocol.md): thin handlers over the Core's services (core/__init__.py: each handler
class gets the services it calls, agent/wiring.py passes them). They decode parameters,
call the services, encode answers and drive the message exchanges; the Core gets the transport as a port
(``core/ports.py``): ``connect_node`` for activating nodes, a ``JoinChannel`` for the join service,
a ``TicketRequest`` for the joining node."""

from __future__ import annotations

import ipaddress
import threading
from typing import Any, Callable, Dict, Optional, Sequence, Set, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils import atls
# The validation policies of the agent (fresh nodes, the Coordinator it joins) are the attestation policy's rule,
# attestation/policy.py ``peer_policies``; imported here under their old names.
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import (  # noqa: F401 pylint: disable=unused-import
    coordinator_policy,
    fresh_node_policy,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core import JoinTicket
from ansible_collections.constellation.cluster.plugins.module_utils.encoding import parse_endpoint
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    ConstellationError, InputError, RateLimited)
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import schema
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import (
    AgentClient,
    connect_enrolling,
    join_user_data,
    rejoin_user_data,
)
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import ProtocolError, b64d, b64e
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.rate_limit import RateLimit
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import (
    OWED_PEER_TIMEOUT, OWED_TPM_TIMEOUT, AccessDenied, Connection)

MAX_ATTESTATION_SIZE = 4 * 1024 * 1024 // 3 * 2


class PubAPI:
    """``validator_for_nodes``: the Coordinator's validator for fresh nodes (the join service).
    ``validator_for_activation``: the one ActivateAdditionalNodes connects with (default: the same); the
    agent gives it a policy without PCR 15, which the Core checks itself (fresh, or locked to our
    cluster: a resumed activation). ``connect_node(endpoint) -> AgentClient``: aTLS connection to a node,
    verified with it. The services: ``status`` (GetState), ``coordinator`` (activation as Coordinator, the
    registry), ``activation`` (nodes), ``cluster`` (further Coordinators), ``node`` (activation as Node),
    ``join_service`` (IssueJoinTicket), ``peer_trust`` (IssueRejoinTicket), ``recovery`` (Recover; and this Node's
    Coordinators, with ``coordinator_endpoints``: the agent config's, for EnrollAK's budget of theirs)."""

    def __init__(self, validator_for_nodes=None, connect_node: Optional[Callable[[str], AgentClient]] = None,
                 log=None, issuer=None, validator_for_activation=None, *, status=None, coordinator=None,
                 activation=None, cluster=None, node=None, join_service=None, peer_trust=None, recovery=None, backup=None,
                 coordinator_endpoints: Sequence[Optional[str]] = ()):
        self.coordinator_endpoints = [e for e in coordinator_endpoints if e]
        self.status = status
        self.coordinator = coordinator
        self.activation = activation
        self.cluster = cluster
        self.node = node
        self.join_service = join_service
        self.peer_trust = peer_trust
        self.recovery = recovery
        self.backup = backup  # core/backup.py: ActivateAsCoordinator with restore_state
        self.validator_for_nodes = validator_for_nodes
        self.issuer = issuer
        activation_validator = validator_for_activation or validator_for_nodes
        self.connect_node = connect_node or (lambda endpoint: connect_enrolling(
            lambda validators: AgentClient.connect(endpoint, validators), [activation_validator]))
        self._log = log or (lambda event, **fields: None)

    def handlers(self) -> Dict[str, Any]:
        return {"GetState": self.get_state, "ActivateAsCoordinator": self.activate_as_coordinator,
                "ActivateAsNode": self.activate_as_node, "ActivateAdditionalNodes": self.activate_additional_nodes,
                "ActivateAsAdditionalCoordinator": self.activate_as_additional_coordinator,
                "IssueJoinTicket": self.issue_join_ticket, "Recover": self.recover, "EnrollAK": self.enroll_ak,
                "IssueRejoinTicket": self.issue_rejoin_ticket}

    # Every handler gets its request decoded by the server (schema.py records).
    def get_state(self, conn: Connection, request: schema.Empty) -> None:
        # Least disclosure: state and role to anyone; VPN IP and key, disk UUID, evicted peers only on a
        # connection that proved the admin key or the Coordinators' key (AdminAuth).
        full = conn.caller.admin or conn.caller.coordinator
        conn.stream.send_result(self.status.get_state() if full else self.status.public_state())

    def activate_as_coordinator(self, conn: Connection, request: schema.ActivateAsCoordinatorRequest) -> None:
        if request.restore_state is not None:  # restore.yml: a backup's state onto this fresh peer
            result = self.backup.restore(request.kms_uri, request.admin_pub_key, request.restore_state,
                                         request.init_secret, request.measurement_salt,
                                         request.peer_resource_version_floor)
            conn.stream.send_result(result.to_dict())
            return
        result = self.coordinator.activate_as_coordinator(request.kms_uri, request.measurement_salt, request.admin_pub_key,
                                                          request.storage_uri, request.cluster_config, request.init_secret)
        conn.stream.send_result(result.to_dict())

    def activate_as_node(self, conn: Connection, request: schema.ActivateAsNodeRequest) -> None:
        step = self.node.activate_as_node_begin(request.encode())  # the Core checks the domain itself
        try:
            conn.stream.send_msg({"state_disk_uuid": step.state_disk_uuid, "node_vpn_pub_key": step.node_vpn_pub_key})
            # The caller proved the init secret (the Core checked it): a deadline, its slot kept.
            answer = conn.recv_owed("the state disk key", OWED_PEER_TIMEOUT, replaceable=False)
            key = b64d(answer.get("state_disk_key"), "state_disk_key", 32)
        except BaseException as err:
            self.node.abort_node_activation("ActivateAsNode was not completed: %s" % err)
            raise
        conn.stream.send_result(self.node.activate_as_node_finish(key))

    def activate_as_additional_coordinator(self, conn: Connection, request: schema.ActivateAsNodeRequest) -> None:
        """core/cluster.py: our disk UUID and VPN key out, the KMS URI and etcd cluster in, our etcd
        member starts, the activating Coordinator promotes it, we open the shared state."""
        step = self.cluster.activate_as_additional_coordinator_begin(request.encode())
        voting = False
        try:
            conn.stream.send_msg({"state_disk_uuid": step.state_disk_uuid, "node_vpn_pub_key": step.node_vpn_pub_key})
            self.cluster.activate_as_additional_coordinator_join(conn.recv_owed("the KMS URI and etcd cluster",
                                                                                OWED_PEER_TIMEOUT, replaceable=False))
            conn.stream.send_msg({"etcd_member": "started"})
            voting = conn.recv_owed("the promotion of our etcd member", OWED_PEER_TIMEOUT,
                                    replaceable=False).get("etcd_member") == "voting"
            if not voting:
                raise ProtocolError("ActivateAsAdditionalCoordinator: our etcd member was not promoted")
            result = self.cluster.activate_as_additional_coordinator_finish()
        except BaseException as err:
            self.cluster.abort_coordinator_activation(err, voting)
            raise
        conn.stream.send_result(result)

    def recover(self, conn: Connection, request: schema.RecoverRequest) -> None:
        conn.stream.send_result(self.recovery.recover(request.kms_uri))

    # EnrollAK needs no authentication and costs the TPM a primary key (~80 ms on swtpm, ten quotes):
    # a token bucket per source and one for all (rpc/rate_limit.py RateLimit; docs/agent.md); this Node's
    # Coordinators (``coordinator_ips``) have a bucket of their own, which nobody else can drain.
    ENROLL_AK_PER_SOURCE = (6, 1.0)  # burst, then one per second
    ENROLL_AK_TOTAL = (12, 3.0)  # burst, then three per second from everyone (at most ~25% of the TPM)
    ENROLL_AK_COORDINATORS = (6, 1.0)  # burst, then one per second from this Node's Coordinators together
    ENROLL_AK_ANSWER_TIMEOUT = 10.0  # seconds the client may take to send its challenge
    _enroll_limit: Optional[RateLimit] = None
    _enroll_limit_lock = threading.Lock()

    def enroll_ak(self, conn: Connection, request: schema.Empty) -> None:
        """qemu-vtpm-ek: our EK certificate and AK, then TPM2_ActivateCredential of the verifier's
        challenge. Any state: nothing secret is involved (the secret is the verifier's own). Rate
        limited before any TPM work; the issuer holds its TPM lock for each TPM operation only,
        never while the client's challenge is on its way."""
        if self.issuer is None or not hasattr(self.issuer, "enrollment_request"):
            raise InputError("EnrollAK", "an agent whose attestation variant enrolls its AK (qemu-vtpm-ek)")
        with self._enroll_limit_lock:
            if self._enroll_limit is None:
                self._enroll_limit = RateLimit("EnrollAK", self.ENROLL_AK_PER_SOURCE, self.ENROLL_AK_TOTAL,
                                               reserved=(self.ENROLL_AK_COORDINATORS, self.coordinator_ips))
        try:
            self._enroll_limit.take(conn.peer_ip)
        except RateLimited as err:
            self._log("enroll_ak_refused", level="warning", peer=conn.peer_ip, reason=str(err)[:200])
            raise
        conn.stream.send_msg(self.issuer.enrollment_request())
        # The verifier computes its challenge at once: a client that sits on it loses the connection.
        answer = conn.recv_owed("the credential challenge", self.ENROLL_AK_ANSWER_TIMEOUT)
        secret = self.issuer.activate_credential(answer.get("challenge"))
        self._log("ak_enrolled", peer=conn.peer_ip)
        conn.stream.send_result({"secret": b64e(secret)})

    def coordinator_ips(self) -> Set[str]:
        """This Node's Coordinators, as the source IP of their connections: the public IPs of its peers with role
        coordinator (core/recovery.py) and the host of its configured Coordinator endpoint (an IP literal)."""
        ips = set(self.recovery.coordinator_public_ips()) if self.recovery is not None else set()
        ips.update(parse_endpoint(endpoint)[0] for endpoint in self.coordinator_endpoints)
        out = set()
        for ip in ips:
            try:
                address = ipaddress.ip_address(ip)
            except ValueError:
                continue  # a host name: never a connection's source
            out.add(str(address))
            if address.version == 4:
                out.add("::ffff:%s" % address)  # as a dual-stack listener sees it
        return out

    # -- Coordinator: activate nodes listed by the admin
    def activate_additional_nodes(self, conn: Connection, request: schema.ActivateAdditionalNodesRequest) -> None:
        def report(row):  # one log line per peer as it is done: the client's read timeout is per message
            conn.stream.send_msg({"log": "%s: %s" % (row["node_public_endpoint"],
                                                     "%s (%s)" % (row["action"], row["node_vpn_ip"]) if row["ok"]
                                                     else "failed: %s" % row["error"])})

        # Coordinators first: the Nodes then learn of them with their first peer list.
        results = (self.cluster.activate_coordinators(request.coordinator_public_endpoints, self.connect_node)
                   if request.coordinator_public_endpoints else [])
        for row in results:
            report(row)
        if request.node_public_endpoints:
            results += self.activation.activate_nodes(request.node_public_endpoints, self.connect_node,
                                                      request.control_plane_endpoints or (), on_row=report,
                                                      node_names=request.node_names)
        conn.stream.send_result({"nodes": results, "resource_version": self.coordinator.get_update(-1)["resource_version"]})

    # -- Coordinator: the join service
    def issue_join_ticket(self, conn: Connection, request: schema.IssueJoinTicketRequest) -> None:
        if conn.server_spki_hash is None or self.validator_for_nodes is None:
            raise AccessDenied("IssueJoinTicket: only over aTLS on a Coordinator with a node policy")
        result = self.join_service.serve_join(request.disk_uuid, request.node_vpn_pub_key, ServerJoinChannel(conn),
                                              self.validator_for_nodes, request.certificate_request,
                                              bool(request.is_control_plane))
        conn.stream.send_result(result)

    # -- Coordinator: rejoin tickets for rebooted Nodes (core/eviction/peer_trust.py)
    def issue_rejoin_ticket(self, conn: Connection, request: schema.IssueRejoinTicketRequest) -> None:
        if conn.server_spki_hash is None or self.validator_for_nodes is None:
            raise AccessDenied("IssueRejoinTicket: only over aTLS on a Coordinator with a node policy")
        result = self.peer_trust.serve_rejoin(request.vpn_ip, b64e(request.node_vpn_pub_key), request.disk_uuid,
                                              ServerRejoinChannel(conn), self.validator_for_nodes)
        conn.stream.send_result(result)


class ServerJoinChannel:
    """The Coordinator's side of one IssueJoinTicket exchange on a pubapi connection
    (implements ``core.ports.JoinChannel``)."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.peer_ip = conn.peer_ip

    def user_data(self, node_vpn_pub_key: bytes, disk_uuid: str) -> bytes:
        return join_user_data(self.conn.server_spki_hash, node_vpn_pub_key, disk_uuid)

    def challenge(self, nonce: bytes) -> Tuple[str, bytes]:
        self.conn.stream.send_msg({"nonce": b64e(nonce)})
        answer = self.conn.recv_owed("the node's attestation", OWED_TPM_TIMEOUT)
        document = b64d(answer.get("attestation"), "attestation", max_size=MAX_ATTESTATION_SIZE)
        return answer.get("variant_oid"), document

    def enroll_ak(self, challenge_for) -> bytes:
        """qemu-vtpm-ek, in-band: the node's enrollment request, our challenge, its secret."""
        self.conn.stream.send_msg({"enroll": True})
        request = self.conn.recv_owed("the node's enrollment request", OWED_TPM_TIMEOUT)
        self.conn.stream.send_msg({"challenge": challenge_for(request)})
        answer = self.conn.recv_owed("the node's credential answer", OWED_TPM_TIMEOUT)
        return b64d(answer.get("secret"), "secret", 32)

    def deliver(self, ticket: JoinTicket) -> None:
        self.conn.stream.send_msg({"ticket": ticket.to_dict()})
        done = self.conn.recv_owed("the node's confirmation", OWED_PEER_TIMEOUT, replaceable=False)  # it attested
        if done.get("joined") is not True:
            raise InputError("joined", "true")


class ServerRejoinChannel(ServerJoinChannel):
    """The Coordinator's side of one IssueRejoinTicket exchange: the same challenge (and in-band AK
    enrollment), another user data binding, a rejoin ticket."""

    def user_data(self, vpn_ip: str, node_vpn_pub_key: str, disk_uuid: str) -> bytes:  # pylint: disable=arguments-differ
        return rejoin_user_data(self.conn.server_spki_hash, vpn_ip, b64d(node_vpn_pub_key, "node_vpn_pub_key", 32),
                                disk_uuid)

    def deliver(self, ticket) -> None:
        self.conn.stream.send_msg({"ticket": ticket.to_dict()})
        done = self.conn.recv_owed("the node's confirmation", OWED_PEER_TIMEOUT, replaceable=False)  # it attested
        if done.get("rejoined") is not True:
            raise InputError("rejoined", "true")


def rejoin_cluster(recovery, coordinator_endpoints, validators, issuer, connect=None) -> Dict[str, Any]:
    """A rebooted Node's side: verify a Coordinator (``connect``), attest ourselves in-band, let the
    Core (``recovery``: core/recovery.py) check and take the rejoin ticket. ``coordinator_endpoints``: its own Coordinator first, then the
    others it knows (several Coordinators on one etcd cluster): one that cannot be reached or verified
    is passed over; one that answers decides."""
    connect = connect or (lambda endpoint: connect_enrolling(lambda v: AgentClient.connect(endpoint, v), validators))
    endpoints = [coordinator_endpoints] if isinstance(coordinator_endpoints, str) else list(coordinator_endpoints)
    last: Optional[BaseException] = None
    for endpoint in endpoints:
        try:
            client = connect(endpoint)
        except (OSError, ConstellationError) as err:
            last = err
            continue
        with client:
            return recovery.rejoin(lambda vpn_ip, vpn_pub_key, disk_uuid, on_ticket: client.issue_rejoin_ticket(
                vpn_ip, vpn_pub_key, disk_uuid, issuer, on_ticket))
    raise last if last is not None else ConstellationError("rejoin: no Coordinator endpoint is known")


def join_cluster(node, coordinator_endpoint: str, validators, issuer, connect=None,
                 certificate_request: Optional[bytes] = None, is_control_plane: bool = False) -> Dict[str, Any]:
    """The joining node's side: verify the Coordinator (``connect``), attest ourselves in-band
    (``issuer``), and let the Core (``node``: core/node.py) take the ticket. ``certificate_request``: the kubelet's CSR; the ticket
    then carries its certificate (and, with ``is_control_plane``, the control-plane PKI files)."""
    connect = connect or (lambda endpoint: connect_enrolling(lambda v: AgentClient.connect(endpoint, v), validators))
    with connect(coordinator_endpoint) as client:
        return node.join_cluster(lambda disk_uuid, node_vpn_pub_key, on_ticket: client.issue_join_ticket(
            disk_uuid, node_vpn_pub_key, issuer, on_ticket, is_control_plane, certificate_request))


def coordinator_sources(core, config) -> Callable[[str], bool]:
    """Who the pubapi keeps its reserved room and the first place in its quote queue for (rpc/server.py,
    docs/agent.md "Connection limits"): a source IP that is one of this peer's Coordinators (their public IPs
    from its peer set, the configured Coordinator endpoint), so their re-attestation gets through a stranger's
    flood. The set is worked out again when the peer set changes."""
    cache: list = [None, frozenset()]

    def is_coordinator(ip: str) -> bool:
        key = (id(core.context.node), core.context.resource_version)
        if cache[0] != key:
            ips = set(core.recovery.coordinator_public_ips())
            if config.coordinator_public_endpoint:
                ips.add(atls.parse_endpoint(config.coordinator_public_endpoint)[0])
            cache[1], cache[0] = frozenset(ips), key
        return ip in cache[1]

    return is_coordinator
