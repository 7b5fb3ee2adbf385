# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Coordinator's join service (IssueJoinTicket): a node attests itself in-band on the connection that
asks (``attest_over``, also used for rejoin tickets by core/eviction/peer_trust.py), proves that the admin admitted it (its
TPM's EK, core/admissions.py), gets an IP reserved in the registry (core/coordinator.py) and a signed ticket with
its secrets and, where the Coordinator has kubeadm, its Kubernetes join (core/kubernetes.py) under the name the
admin gave it. The transport comes in as a port (``ports.JoinChannel``)."""

from __future__ import annotations

import hmac
import secrets
from typing import TYPE_CHECKING, Any, Dict, Optional, Protocol

from ansible_collections.constellation.cluster.plugins.module_utils import kms as kms_mod
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.variant import accepts
from ansible_collections.constellation.cluster.plugins.module_utils.core.inputs import b64, normalize_disk_uuid
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_access import refuse_control_plane_join
from ansible_collections.constellation.cluster.plugins.module_utils.core.ports import AttestationValidator, JoinChannel
from ansible_collections.constellation.cluster.plugins.module_utils.core.records.tickets import JoinTicket, NodeActivationRequest
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError

if TYPE_CHECKING:  # pragma: no cover
    from ansible_collections.constellation.cluster.plugins.module_utils.core.context import PeerContext


class Registry(Protocol):
    """The Coordinator's peer registry (core/coordinator.py ``Coordinator``)."""

    def node_activation_request(self, node_vpn_ip: str) -> NodeActivationRequest:
        """What a node at ``node_vpn_ip`` gets: the cluster's identity and peers."""

    def reserve_node_ip(self) -> str:
        """A fresh VPN IP for a node."""

    def release_node_ip(self, vpn_ip: str) -> None:
        """Frees a reserved IP nobody was recorded at."""

    def add_node_peer(self, vpn_ip: str, vpn_pub_key: str, public_ip: str, role: str = "node") -> int:
        """Records the node; the new registry version."""


class DiskOwnership(Protocol):
    """Who owns a disk UUID (core/registry/peer_access.py ``PeerAccess``)."""

    def claim_disk_uuid(self, disk_uuid: str, vpn_ip: str, vpn_pub_key: str, method: str) -> None:
        """Records the owner, or AccessDenied if another peer holds it."""

    def require_disk_uuid_free(self, disk_uuid: str, vpn_pub_key: str, method: str) -> None:
        """AccessDenied early if another peer holds it."""


class JoinMaterial(Protocol):
    """The ``kubeadm`` part of a join ticket (core/kubernetes.py ``Kubernetes``)."""

    def ticket_kubernetes(self, vpn_ip: str, certificate_request: Optional[bytes],
                          is_control_plane: bool) -> Dict[str, Any]:
        """``available`` and the join arguments, or why not."""

    def name_node(self, vpn_ip: str, name: str, method: str) -> None:
        """The admin's name for the peer at ``vpn_ip`` (its only kubelet node name)."""

    def forget_node_name(self, vpn_ip: str) -> None:
        """Gives a failed join's name back."""


class JoinAdmission(Protocol):
    """The admin's consent to a join (core/admissions.py ``Admissions``)."""

    def claim(self, ek: Optional[str], vpn_pub_key: str, peer: str, method: str) -> Optional[Dict[str, Any]]:
        """The admission of the EK, bound to the node's key (``{name, ...}``); None where none is needed;
        AccessDenied if the admin did not admit it."""

    def release(self, claimed: Optional[Dict[str, Any]], vpn_pub_key: str) -> None:
        """A failed join gives the binding back."""


class JoinSigning(Protocol):
    """The Coordinators' signature on a join ticket (core/signing.py ``Signing``)."""

    def signed_join_ticket(self, ticket: Any, binding: bytes) -> Any:
        """``ticket`` signed, bound to ``binding``."""


class JoinService:
    """The Coordinator's join service over the peer's ``PeerContext``."""

    def __init__(self, context: PeerContext, registry: Registry, peer_access: DiskOwnership, kubernetes: JoinMaterial,
                 signing: JoinSigning, admissions: JoinAdmission):
        self.context = context
        self.admissions = admissions
        self.registry = registry
        self.peer_access = peer_access
        self.kubernetes = kubernetes
        self.signing = signing

    def issue_join_ticket(self, disk_uuid: str, vpn_ip: str, certificate_request: Optional[bytes] = None,
                          is_control_plane: bool = False) -> JoinTicket:
        """The ticket for a verified, admitted node that reported ``disk_uuid`` and got ``vpn_ip`` reserved, with
        the Kubernetes join (core/kubernetes.py): the kubelet certificate for ``certificate_request``. It carries
        no proof of any init secret: the node knows the ticket is ours by the Coordinators' signature, checked
        with the key pinned in its agent config."""
        kms = self.context.require_coordinator("IssueJoinTicket")
        refuse_control_plane_join("IssueJoinTicket", is_control_plane)
        request = self.registry.node_activation_request(vpn_ip)
        kubeadm_args = self.kubernetes.ticket_kubernetes(vpn_ip, certificate_request, False)
        return JoinTicket(request.cluster_id, request.measurement_salt, kms_mod.measurement_secret(kms),
                          kms_mod.state_disk_key(kms, normalize_disk_uuid(disk_uuid)), vpn_ip, request.peers,
                          request.coordinator_vpn_ip, request.admin_pub_key, kubeadm_args,
                          coordinator_pub_key=request.coordinator_pub_key, node_pod_cidr=request.node_pod_cidr,
                          cluster_pod_cidr=request.cluster_pod_cidr)

    def serve_join(self, disk_uuid: Any, node_vpn_pub_key: bytes, channel: JoinChannel,
                   validator: AttestationValidator, certificate_request: Optional[bytes] = None,
                   is_control_plane: bool = False) -> Dict[str, Any]:
        """One join: challenge the node, check its attestation and its binding to ``channel``,
        reserve an IP, hand over the ticket (with the kubelet certificate for ``certificate_request``),
        record the peer once the node confirms."""
        method = "IssueJoinTicket"
        self.context.require_coordinator(method)
        # The joining node cannot designate itself a control plane: only the admin can (activation).
        refuse_control_plane_join(method, is_control_plane)
        normalized_uuid = normalize_disk_uuid(disk_uuid)
        self.peer_access.require_disk_uuid_free(normalized_uuid, b64(node_vpn_pub_key), method)  # before any attestation work
        validation = self.attest_over(channel, validator, method, channel.user_data(node_vpn_pub_key, disk_uuid),
                                      "join_refused")
        # The admin's consent, proven by the node's TPM (the EK its AK was certified through), before any IP is
        # reserved or anything leaves; the admission is bound to this node's WireGuard key.
        pub_key = b64(node_vpn_pub_key)
        admitted = self.admissions.claim(getattr(validation, "ek_pub_sha256", None), pub_key, channel.peer_ip, method)
        vpn_ip = self.registry.reserve_node_ip()
        added = named = False
        try:
            if admitted is not None:  # its kubelet name: the one the admin gave it
                self.kubernetes.name_node(vpn_ip, admitted["name"], method)
                named = True
            # The disk UUID becomes this node's (by its WireGuard key) before its disk key leaves.
            self.peer_access.claim_disk_uuid(normalized_uuid, vpn_ip, pub_key, method)
            channel.deliver(self.signing.signed_join_ticket(  # signed, bound to this request and connection
                self.issue_join_ticket(normalized_uuid, vpn_ip, certificate_request),
                channel.user_data(node_vpn_pub_key, disk_uuid)))
            version = self.registry.add_node_peer(vpn_ip, pub_key, channel.peer_ip)
            added = True
        finally:
            if not added:
                if named:
                    self.kubernetes.forget_node_name(vpn_ip)
                self.registry.release_node_ip(vpn_ip)
                self.admissions.release(admitted, pub_key)
        self.context.log("node_joined", peer=channel.peer_ip, node_vpn_ip=vpn_ip,
                         node_name=admitted["name"] if admitted is not None else None,
                         admitted=admitted is not None)
        return {"resource_version": version, "node_vpn_ip": vpn_ip}

    def attest_over(self, channel: JoinChannel, validator: AttestationValidator, method: str, expected_user_data: bytes,
                    refused_event: str, **log_fields: Any) -> Any:
        """The node at the other end of ``channel`` attests itself in-band: a fresh nonce, its document
        of our variant, validated (enrolling a new AK where the variant needs it), and bound to this
        connection and request (``expected_user_data``). Refusals are logged as ``refused_event``. Returns the
        validation (its ``ek_pub_sha256``: the EK the signing AK was certified through, where the variant knows)."""
        nonce = secrets.token_bytes(32)
        oid, document = channel.challenge(nonce)
        if not accepts(validator, oid):
            raise AttestationError("%s: attestation variant %r is not accepted (expected %s)"
                                   % (method, str(oid)[:64], validator.oid))
        try:
            validation = self._validate_join(validator, document, nonce, channel)
        except AttestationError as err:
            self.context.log(refused_event, peer=channel.peer_ip, reason=str(err)[:300], **log_fields)
            raise AttestationError("%s: attestation refused: %s" % (method, err)) from None
        if not hmac.compare_digest(bytes(validation.user_data), expected_user_data):
            self.context.log(refused_event, peer=channel.peer_ip, reason="user data not bound to this connection", **log_fields)
            raise AttestationError("%s: the attestation is not bound to this connection and request "
                                   "(relayed or replayed?)" % method)
        return validation

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
        self.context.log("ak_enrolled", peer=channel.peer_ip, via="join")
        return validator.validate(document, nonce)
