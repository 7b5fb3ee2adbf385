# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Coordinator's side: activation as Coordinator, the peer registry, activating nodes, the
join service and the answers of the vpnapi. The transports come in as ports (``ports.py``)."""

from __future__ import annotations

import hmac
import secrets
from typing import Any, Dict, Mapping, Optional

from ansible_collections.constellation.cluster.plugins.module_utils import kms as kms_mod
from ansible_collections.constellation.cluster.plugins.module_utils.core import state_store
from ansible_collections.constellation.cluster.plugins.module_utils.core.kubernetes import KubernetesJoin
from ansible_collections.constellation.cluster.plugins.module_utils.core.signing import CoordinatorSigning
from ansible_collections.constellation.cluster.plugins.module_utils.core.peer_access import refuse_control_plane_join
from ansible_collections.constellation.cluster.plugins.module_utils.core.inputs import (
    b64,
    normalize_disk_uuid,
    open_kms,
    parse_admin_pub_key,
    parse_measurement_salt,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.node_state import NodeState
from ansible_collections.constellation.cluster.plugins.module_utils.init_secret import (
    check_node_proof,
    node_init_secret,
    parse_init_secret,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.ports import (
    KMS,
    AttestationValidator,
    JoinChannel,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.records import (
    CoordinatorActivation,
    JoinTicket,
    NodeActivationRequest,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.state import ROLE_COORDINATOR, State
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    AttestationError,
    InputError,
    StateError,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.peers import PeerRecord
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import (
    VPN_CIDR,
    generate_priv_key,
    pub_key_from_priv_key,
)


class CoordinatorSide(KubernetesJoin, CoordinatorSigning):
    # -- activation as Coordinator
    def activate_as_coordinator(self, kms_uri: str, measurement_salt: Any, admin_pub_key: str,
                                storage_uri: Optional[str] = None,
                                cluster_config: Optional[Mapping[str, Any]] = None,
                                init_secret: Optional[bytes] = None) -> CoordinatorActivation:
        method = "ActivateAsCoordinator"
        self.require_state(method, State.ACCEPTING_INIT)
        if self.recovery_pending:
            raise StateError("%s: this node holds a cluster's state and waits for Recover" % method)
        # No hijacking a fresh node: the cluster's init secret must derive this node's (init_secret.py),
        # checked before anything else is parsed and before the node lock.
        secret = parse_init_secret(init_secret) if init_secret is not None else None
        check_node_proof(node_init_secret(secret, self.public_ip) if secret is not None else None,
                         self.init_secret_hash, method)
        # All input is checked before the point of no return.
        kms = open_kms(kms_uri)
        storage_uri = storage_uri or kms_mod.NO_STORE_URI
        kms_mod.parse_storage_uri(storage_uri)
        salt = parse_measurement_salt(measurement_salt)
        parse_admin_pub_key(admin_pub_key)
        config = dict(cluster_config or {})
        unknown = set(config) - {"cluster_name", "vpn_cidr"}
        if unknown:
            raise InputError("cluster_config", "only cluster_name and vpn_cidr", sorted(unknown))
        vpn_cidr = config.get("vpn_cidr", VPN_CIDR)
        if vpn_cidr != getattr(self.vpn, "vpn_cidr", VPN_CIDR):
            raise InputError("cluster_config.vpn_cidr", "the agent's VPN CIDR %s" % getattr(self.vpn, "vpn_cidr", VPN_CIDR),
                             vpn_cidr)
        cluster_id = kms.cluster_id(salt)
        self._take_lock(cluster_id, method)
        self._log("node_lock", role=ROLE_COORDINATOR, pcr=15)
        try:
            priv_key = generate_priv_key()
            pub_key = pub_key_from_priv_key(priv_key)

            def add_self(registry):
                return registry.add(pub_key, self.public_ip, "coordinator")

            record = self.peer_registry.update(add_self, vpn_cidr)
            self.claim_disk_uuid(self.disk_uuid, record.vpn_ip, pub_key, method)  # no node may name ours
            state_store.save_kms_data(self.local_store, {"kms_uri": kms_uri, "storage_uri": storage_uri})
            if secret is not None:
                state_store.save_init_secret(self.local_store, secret)  # to prove itself to the nodes it activates
                self._init_secret = secret
            self._kms = kms
            with self._mutex:
                self._role = ROLE_COORDINATOR
            self.vpn.setup(record.vpn_ip, priv_key)
            self._start_cluster_store(record.vpn_ip, kms)
            self._save_node(NodeState(role=ROLE_COORDINATOR, vpn_ip=record.vpn_ip, vpn_priv_key=priv_key,
                                      cluster_id=cluster_id, measurement_salt=salt, admin_pub_key=admin_pub_key,
                                      coordinator_vpn_ip=record.vpn_ip, cluster_name=str(config.get("cluster_name", "")),
                                      disk_uuid=self.disk_uuid, state=int(State.ACTIVATING_NODES)))
            self._keep_disk_key(kms.state_disk_key(self.disk_uuid))
            self._advance(State.ACTIVATING_NODES)
        except BaseException as err:
            self._fail(method, err)
            raise
        return CoordinatorActivation(cluster_id, record.vpn_ip, pub_key, self._state.wire_name)

    # -- the peer registry
    def require_coordinator(self, method: str) -> KMS:
        self.require_state(method, State.ACTIVATING_NODES)
        if self._kms is None:
            raise StateError("%s: this Coordinator has no KMS" % method)
        return self._kms

    def reserve_node_ip(self) -> str:
        self.require_coordinator("ActivateAdditionalNodes")
        return self.peer_registry.update(lambda r: r.allocator.allocate("node"))

    def release_node_ip(self, vpn_ip: str) -> None:
        def release(registry):
            if registry.peers.get(vpn_ip) is None:
                registry.allocator.release(vpn_ip)

        self.peer_registry.update(release)

    def node_activation_request(self, node_vpn_ip: str) -> NodeActivationRequest:
        self.require_coordinator("ActivateAdditionalNodes")
        registry = self.peer_registry.current()
        if registry is None:
            raise StateError("this Coordinator has no peer registry")
        node = self._stored_node()
        return NodeActivationRequest(node_vpn_ip, tuple(registry.peers.peers.values()), node.cluster_id,
                                     node.measurement_salt, node.admin_pub_key, node.vpn_ip, coordinator_pub_key=self.coordinator_pub_key())

    def init_proof_for(self, public_ip: str) -> Dict[str, Any]:
        """The ``init_proof`` field for the node at ``public_ip`` (init_secret.py); empty when this
        Coordinator was activated without an init secret."""
        if self._init_secret is None:
            return {}
        return {"init_proof": b64(node_init_secret(self._init_secret, public_ip))}

    def state_disk_key(self, disk_uuid: str) -> bytes:
        return self.require_coordinator("state disk key").state_disk_key(disk_uuid)

    def add_node_peer(self, vpn_ip: str, vpn_pub_key: str, public_ip: str, role: str = "node") -> int:
        """Records an activated node (or Coordinator: ``role``) at its reserved IP and adds it to our
        WireGuard peers."""
        self.require_coordinator("add node")
        record = PeerRecord.parse(vpn_ip, vpn_pub_key, public_ip, role)

        def put(registry):
            if registry.peers.by_pub_key(record.vpn_pub_key) not in (None, registry.peers.get(vpn_ip)):
                raise StateError("WireGuard key of %s is already used by another peer" % vpn_ip)
            if not registry.allocator.in_use(vpn_ip):
                registry.allocator.reserve(vpn_ip)
            return registry.peers.put(record)

        version = self.peer_registry.update(put)
        self.apply_registry_peers()
        self._log("peer_added", vpn_ip=vpn_ip, public_ip=public_ip, resource_version=version)
        return version

    def remove_peer(self, vpn_ip: str) -> int:
        self.require_coordinator("remove peer")

        def remove(registry):
            registry.remove(vpn_ip)
            return registry.peers.version

        version = self.peer_registry.update(remove)
        self.apply_registry_peers()
        return version

    def apply_registry_peers(self) -> bool:
        """Makes our WireGuard peers those of the newest committed registry; True if any changed.
        Serialised, and reading the registry under the same lock: of two threads that each committed a
        change, the one that applies last applies the newer list (applying each thread's own snapshot
        could leave the older one in place, without the other's peer)."""
        with self._peers_apply_lock:
            registry = self.peer_registry.current()
            if registry is None:
                return False
            return self.vpn.set_peers(list(registry.peers.peers.values()), self.vpn_pub_key)

    def issue_join_ticket(self, disk_uuid: str, vpn_ip: str, public_ip: Optional[str] = None,
                          certificate_request: Optional[bytes] = None, is_control_plane: bool = False) -> JoinTicket:
        """The ticket for a verified node that reported ``disk_uuid`` and got ``vpn_ip`` reserved; with
        the proof of the init secret of the node at ``public_ip``, and the Kubernetes join (core/kubernetes.py):
        the kubelet certificate for ``certificate_request`` and, for a control plane, the PKI files."""
        kms = self.require_coordinator("IssueJoinTicket")
        refuse_control_plane_join("IssueJoinTicket", is_control_plane)
        request = self.node_activation_request(vpn_ip)
        kubeadm_args = self.ticket_kubernetes(vpn_ip, certificate_request, False)
        return JoinTicket(request.cluster_id, request.measurement_salt, kms.measurement_secret(),
                          kms.state_disk_key(normalize_disk_uuid(disk_uuid)), vpn_ip, request.peers,
                          request.coordinator_vpn_ip, request.admin_pub_key, kubeadm_args,
                          node_init_secret(self._init_secret, public_ip)
                          if self._init_secret is not None and public_ip else None, request.coordinator_pub_key)

    # -- the join service (IssueJoinTicket)
    def serve_join(self, disk_uuid: Any, node_vpn_pub_key: bytes, channel: JoinChannel,
                   validator: AttestationValidator, certificate_request: Optional[bytes] = None,
                   is_control_plane: bool = False) -> Dict[str, Any]:
        """One join: challenge the node, check its attestation and its binding to ``channel``,
        reserve an IP, hand over the ticket (with the kubelet certificate for ``certificate_request``),
        record the peer once the node confirms."""
        method = "IssueJoinTicket"
        self.require_coordinator(method)
        # The joining node cannot designate itself a control plane: only the admin can (activation).
        refuse_control_plane_join(method, is_control_plane)
        normalized_uuid = normalize_disk_uuid(disk_uuid)
        self.require_disk_uuid_free(normalized_uuid, b64(node_vpn_pub_key), method)  # before any attestation work
        self.attest_over(channel, validator, method, channel.user_data(node_vpn_pub_key, disk_uuid), "join_refused")
        vpn_ip = self.reserve_node_ip()
        added = False
        try:
            # The disk UUID becomes this node's (by its WireGuard key) before its disk key leaves.
            self.claim_disk_uuid(normalized_uuid, vpn_ip, b64(node_vpn_pub_key), method)
            channel.deliver(self.signed_join_ticket(  # signed, bound to this request and connection
                self.issue_join_ticket(normalized_uuid, vpn_ip, channel.peer_ip, certificate_request),
                channel.user_data(node_vpn_pub_key, disk_uuid)))
            version = self.add_node_peer(vpn_ip, b64(node_vpn_pub_key), channel.peer_ip)
            added = True
        finally:
            if not added:
                self.release_node_ip(vpn_ip)
        self._log("node_joined", peer=channel.peer_ip, node_vpn_ip=vpn_ip)
        return {"resource_version": version, "node_vpn_ip": vpn_ip}

    def attest_over(self, channel: JoinChannel, validator: AttestationValidator, method: str, expected_user_data: bytes,
                    refused_event: str, **log_fields: Any) -> None:
        """The node at the other end of ``channel`` attests itself in-band: a fresh nonce, its document
        of our variant, validated (enrolling a new AK where the variant needs it), and bound to this
        connection and request (``expected_user_data``). Refusals are logged as ``refused_event``."""
        nonce = secrets.token_bytes(32)
        oid, document = channel.challenge(nonce)
        if oid != validator.oid:
            raise AttestationError("%s: attestation variant %r is not accepted (expected %s)"
                                   % (method, str(oid)[:64], validator.oid))
        try:
            validation = self._validate_join(validator, document, nonce, channel)
        except AttestationError as err:
            self._log(refused_event, peer=channel.peer_ip, reason=str(err)[:300], **log_fields)
            raise AttestationError("%s: attestation refused: %s" % (method, err)) from None
        if not hmac.compare_digest(bytes(validation.user_data), expected_user_data):
            self._log(refused_event, peer=channel.peer_ip, reason="user data not bound to this connection", **log_fields)
            raise AttestationError("%s: the attestation is not bound to this connection and request "
                                   "(relayed or replayed?)" % method)

    def _validate_join(self, validator: AttestationValidator, document: bytes, nonce: bytes, channel: JoinChannel):
        """Validates the joining node's document; where the variant trusts an AK only after
        enrollment (qemu-vtpm-ek) and this AK is new, enrolls it in-band first (the challenge goes
        to the EK of the node's certificate) and validates the same document again."""
        from ansible_collections.constellation.cluster.plugins.module_utils.attestation.ek import (
            EnrollmentRequired, enroll_over)

        try:
            return validator.validate(document, nonce)
        except EnrollmentRequired as needed:
            asking, signing_ak_pub = needed.validator, needed.ak_pub
        record = enroll_over(channel, asking.ca_certs)
        if record.ak_pub != signing_ak_pub:
            raise AttestationError("the node enrolled another AK than the one that signed its attestation")
        asking.certified_aks.add(record)
        self._log("ak_enrolled", peer=channel.peer_ip, via="join")
        return validator.validate(document, nonce)

    # -- vpnapi
    def is_known_peer_ip(self, ip: str) -> bool:
        # From memory (peer_cache.py): the vpnapi asks this for every connection.
        return self.peer_registry.is_known_peer_ip(ip)

    def get_update(self, resource_version: Any) -> Dict[str, Any]:
        self.require_coordinator("GetUpdate")
        if not isinstance(resource_version, int) or isinstance(resource_version, bool):
            raise InputError("resource_version", "an integer", type(resource_version).__name__)
        registry = self.peer_registry.current()  # from memory: no store access per poll
        if registry is None:
            raise StateError("GetUpdate: this Coordinator has no peer registry")
        return self.signed_update(registry.peers, resource_version)  # core/signing.py
