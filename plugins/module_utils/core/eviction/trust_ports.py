# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What core/eviction/peer_trust.py's ``PeerTrust`` needs from the other services of the Core: the registry, the in-band
attestation of the join service, the Coordinators' signing key, the eviction records and Kubernetes' Nodes."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Protocol

from ansible_collections.constellation.cluster.plugins.module_utils.core.ports import AttestationValidator, JoinChannel, NodeClient


class Registry(Protocol):
    """The Coordinator's peer registry (core/coordinator.py ``Coordinator``)."""

    def membership(self, client: NodeClient) -> str:
        """'fresh', 'ours' or 'other' (PCR 15)."""

    def apply_registry_peers(self) -> bool:
        """Our WireGuard peers become the registry's."""


class InBandAttestation(Protocol):
    """A peer attests itself on the connection that asks (core/join_service.py ``JoinService``)."""

    def attest_over(self, channel: JoinChannel, validator: AttestationValidator, method: str, expected_user_data: bytes,
                    refused_event: str, **log_fields: Any) -> None:
        """AttestationError unless the peer's fresh attestation is valid and bound to ``expected_user_data``."""


class TrustSigning(Protocol):
    """The Coordinators' key (core/signing.py ``Signing``)."""

    def authenticate_as_coordinator(self, client: Any) -> None:
        """AdminAuth role coordinator on ``client``."""

    def signed_rejoin_ticket(self, ticket: Any, binding: bytes) -> Any:
        """``ticket`` signed, bound to ``binding``."""


class EvictionRecords(Protocol):
    """The evicted peers (core/eviction/evictions.py ``Evictions``)."""

    def record(self, vpn_ip: str, eviction: Mapping[str, Any]) -> None:
        """Writes one eviction."""

    def require_not_evicted(self, vpn_ip: str, method: str) -> None:
        """AccessDenied for an evicted peer."""

    @property
    def unverified(self) -> Dict[str, dict]:
        """The unverified peers by VPN IP."""

    def mark_unverified(self, vpn_ip: str, record: Mapping[str, Any]) -> None:
        """Writes one unverified peer."""

    def clear_unverified(self, vpn_ip: str) -> bool:
        """Forgets one; True if it was unverified."""


class KubernetesNodes(Protocol):
    """An evicted Node's Kubernetes Node object (core/kubernetes.py ``Kubernetes``)."""

    def delete_kubernetes_node(self, vpn_ip: str) -> None:
        """Deletes it where this Coordinator manages Kubernetes; failures are logged."""
