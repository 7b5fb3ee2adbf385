# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Coordinator's Kubernetes part of the chain of trust (docs/kubeadm.md, "Join inside the chain of
trust"): join arguments, control-plane files and kubelet certificates go only to verified nodes, through
the join ticket (IssueJoinTicket) or the vpnapi (GetJoinArgs, GetCertificateKey: known, non-evicted peers that
proved their WireGuard key). Control-plane material (PKI files, certificate key) goes only to a peer the admin
designated a control plane at its activation; a join ticket never carries it.

The kubeadm work is a port (``KubeadmProvider``, implemented by ``kubeadm/join_provider.py``, which also
checks the kubelet CSRs); this room decides who gets what. A kubelet certificate names the node as the Coordinator knows it: the CSR may ask
only for the caller's own VPN IP, and a node name once certified for one VPN IP (or the Coordinator's
own) is refused to every other node, so no node can obtain a serving certificate in another's name. Each peer
has one name: the one the admin gave it (its admission's name for a joined node, its inventory name for a node
activated by ActivateAdditionalNodes; ``name_node``), or, where the admin gave none (an older controller), the
first name certified for it. A second name is refused."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any, Dict, Optional, Protocol, Tuple, runtime_checkable

from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    AccessDenied,
    ConstellationError,
    InputError,
)

if TYPE_CHECKING:  # pragma: no cover
    from ansible_collections.constellation.cluster.plugins.module_utils.core.context import PeerContext

KUBEADM_UNAVAILABLE = "kubeadm not available on the Coordinator"
KEY_KUBELET_NODE_NAME_PREFIX = "kubeletNodeName/"  # node name -> the VPN IP of the peer it belongs to
KEY_NODE_NAME_PREFIX = "nodeName/"  # VPN IP -> the peer's one node name (the admin's, or its first certified one)


@runtime_checkable
class KubeadmProvider(Protocol):
    """What the Coordinator's kubeadm side offers (``kubeadm/join_provider.py``); every method raises
    ``StateError`` saying why when there is no control plane or no kubeadm on this host."""

    def join_args(self) -> Dict[str, str]:
        """``{api_server_endpoint, token, discovery_token_ca_cert_hash}`` with a fresh token."""

    def certificate_key(self) -> str:
        """A fresh certificate key with the control-plane certificates uploaded under it."""

    def control_plane_files(self) -> list:
        """``[{name, data}]``: the control-plane PKI files."""

    def own_node_name(self) -> Optional[str]:
        """The node name of the Coordinator's own kubelet."""

    def check_kubelet_csr(self, csr_data: bytes, node_vpn_ip: str) -> Tuple[str, Any]:
        """``(node name, csr)`` of a kubelet CSR that asks only for that name and ``node_vpn_ip``;
        InputError naming ``certificate_request`` otherwise."""

    def kubelet_cert(self, csr_data: bytes, node_vpn_ip: str) -> Dict[str, Any]:
        """``{node_name, kubelet_cert}`` for a checked CSR, signed by the cluster CA, valid for the
        provider's ``kubelet_cert_days`` (short: a renewal is a new request, refused to an evicted peer)."""

    def delete_node(self, name: str) -> bool:
        """Deletes the Kubernetes Node object ``name`` (an evicted peer's); True if it existed."""


class ControlPlaneDesignation(Protocol):
    """Whether the admin designated a peer a control plane (core/registry/peer_access.py ``PeerAccess``)."""

    def is_designated_control_plane(self, vpn_ip: str, vpn_pub_key: str) -> bool:
        """True for a Coordinator, or a Node activated with the designation, with this WireGuard key."""


class EvictionCheck(Protocol):
    """Refuses evicted peers (core/eviction/evictions.py ``Evictions``)."""

    def require_not_evicted(self, vpn_ip: str, method: str) -> None:
        """AccessDenied for an evicted peer."""

    def require_verified(self, vpn_ip: str, method: str) -> None:
        """AccessDenied for an evicted or an unverified peer."""


class Kubernetes:
    """The Coordinator's Kubernetes join material. ``kubeadm_provider`` is set by the agent (the vpnapi's
    ``kubeadm``); None: no kubeadm on this Coordinator."""

    def __init__(self, context: PeerContext, peer_access: ControlPlaneDesignation, evictions: EvictionCheck,
                 kubeadm_provider: Optional[KubeadmProvider] = None):
        self.context = context
        self.peer_access = peer_access
        self.evictions = evictions
        self.kubeadm_provider = kubeadm_provider

    def delete_kubernetes_node(self, vpn_ip: str) -> None:
        """An evicted Node's Kubernetes Node object goes (its pods are rescheduled elsewhere), where this
        Coordinator manages Kubernetes and knows the node's name (from the kubelet certificate it issued).
        Failures are logged, never raised: the eviction stands."""
        provider = self.kubeadm_provider
        names = self.kubernetes_node_names(vpn_ip)
        if provider is None or not names:
            self.context.log("kubernetes_node_kept", vpn_ip=vpn_ip,
                             reason="no kubeadm provider" if provider is None else "no node name known for it")
            return
        for name in names:
            try:
                deleted = provider.delete_node(name)
            except ConstellationError as err:
                self.context.log("kubernetes_node_delete_failed", level="error", vpn_ip=vpn_ip, node_name=name,
                                 error=str(err)[:300])
                continue
            self.context.log("kubernetes_node_deleted", vpn_ip=vpn_ip, node_name=name, existed=bool(deleted))

    def kubernetes_node_names(self, vpn_ip: str) -> list:
        """The node names certified for the peer at ``vpn_ip`` (its kubelet certificates), sorted."""
        return sorted(key[len(KEY_KUBELET_NODE_NAME_PREFIX):] for key, value in
                      self.context.store.items(KEY_KUBELET_NODE_NAME_PREFIX) if value.decode("ascii", "replace") == vpn_ip)

    def _provider(self, method: str) -> KubeadmProvider:
        provider = self.kubeadm_provider
        if provider is None:
            raise ConstellationError("%s: %s (this agent has no kubeadm provider)" % (method, KUBEADM_UNAVAILABLE))
        return provider

    def name_node(self, vpn_ip: str, name: str, method: str) -> None:
        """The admin names the peer at ``vpn_ip`` (its admission's name at a join, its inventory name at an
        activation): its only kubelet node name from now on. AccessDenied if the name belongs to another peer,
        or this peer has another name already."""
        refused = self.context.store.update(lambda txn: _bind(txn, name, vpn_ip, admin=True))
        if refused is not None:
            self.context.log("node_name_refused", node_vpn_ip=vpn_ip, node_name=name, reason=refused)
            raise AccessDenied("%s: node name %s %s" % (method, name, refused))
        self.context.log("node_named", node_vpn_ip=vpn_ip, node_name=name)

    def forget_node_name(self, vpn_ip: str) -> None:
        """A join or activation that failed before the peer was recorded gives its name back."""
        self.context.store.update(lambda txn: forget_node_names(txn, vpn_ip))

    def _bind_node_name(self, name: str, vpn_ip: str, method: str) -> None:
        """A node name belongs to one peer, and a peer has one name: the admin's (``name_node``), else the first
        certified for it; the Coordinator's own kubelet name belongs to the Coordinator. Refused (AccessDenied)
        otherwise."""
        owner = self.context.vpn_ip if name == self._provider(method).own_node_name() else None
        if owner is not None and owner != vpn_ip:
            raise AccessDenied("%s: certificate_request: node name %s belongs to another node (%s)"
                               % (method, name, owner))
        if owner is not None:  # the Coordinator's own name, for itself
            return
        refused = self.context.store.update(lambda txn: _bind(txn, name, vpn_ip, admin=False))
        if refused is not None:
            self.context.log("kubelet_cert_refused", node_vpn_ip=vpn_ip, node_name=name, reason=refused)
            raise AccessDenied("%s: certificate_request: node name %s %s" % (method, name, refused))

    def kubelet_cert_for(self, csr_data: bytes, vpn_ip: str, method: str) -> Dict[str, Any]:
        """The kubelet serving certificate for the node at ``vpn_ip``: the CSR checked (its name and the
        node's own VPN IP only), the name bound to that node, then signed with the cluster CA. Short-lived
        (the provider's ``kubelet_cert_days``): a Node renews it with a new request (GetJoinArgs with a
        CSR), and only while it is in good standing: never for an evicted or unverified peer, whichever
        Coordinator it asks."""
        self.evictions.require_verified(vpn_ip, method)
        provider = self._provider(method)
        name, _csr = provider.check_kubelet_csr(csr_data, vpn_ip)  # InputError before anything is recorded
        self._bind_node_name(name, vpn_ip, method)
        issued = provider.kubelet_cert(csr_data, vpn_ip)
        self.context.log("kubelet_cert_issued", node_vpn_ip=vpn_ip, node_name=name)
        return issued

    def require_designated_control_plane(self, vpn_ip: str, vpn_pub_key: Optional[str], method: str) -> None:
        """Control-plane material (the PKI files, the certificate key) goes only to a peer the admin
        designated a control plane (``is_designated_control_plane``: a Coordinator, or a Node activated
        with the designation), identified by the WireGuard key it proved. AccessDenied otherwise."""
        if vpn_pub_key is None or not self.peer_access.is_designated_control_plane(vpn_ip, vpn_pub_key):
            self.context.log("control_plane_refused", node_vpn_ip=vpn_ip, method=method)
            raise AccessDenied("%s: is_control_plane: %s is not designated a control plane by the admin (control "
                               "planes are designated at activation: activate_nodes control_plane_public_endpoints)"
                               % (method, vpn_ip))

    def kubernetes_certificate_key_for(self, vpn_ip: str, method: str = "GetCertificateKey",
                                       vpn_pub_key: Optional[str] = None) -> str:
        """The Coordinator-era alternative to shipping the PKI: a fresh certificate key (the certificates
        uploaded under it) for the verified node at ``vpn_ip``, only if it is a designated control plane."""
        self.context.require_coordinator(method)
        self.require_designated_control_plane(vpn_ip, vpn_pub_key, method)
        key = self._provider(method).certificate_key()
        self.context.log("certificate_key_issued", node_vpn_ip=vpn_ip)
        return key

    def kubernetes_join_for(self, vpn_ip: str, method: str, certificate_request: Optional[bytes] = None,
                            is_control_plane: bool = False, vpn_pub_key: Optional[str] = None) -> Dict[str, Any]:
        """What a verified node at ``vpn_ip`` needs to join: a fresh token, the endpoint, the pinned CA
        hash; with ``certificate_request`` its kubelet certificate (PEM); for a control plane the PKI
        files (``[{name, data (base64)}]``), as Constellation ships them, only to a peer the admin
        designated a control plane (``vpn_pub_key``: the WireGuard key it proved); others asking for
        them get nothing at all."""
        self.context.require_coordinator(method)
        if is_control_plane:
            self.require_designated_control_plane(vpn_ip, vpn_pub_key, method)
        provider = self._provider(method)
        if certificate_request is not None and not isinstance(certificate_request, bytes):
            raise InputError("certificate_request", "a PKCS#10 certificate signing request")
        # The CSR first: a refused one gets nothing, not even a token.
        kubelet = self.kubelet_cert_for(certificate_request, vpn_ip, method) if certificate_request else None
        args = dict(provider.join_args())
        if kubelet is not None:
            args["kubelet_cert"] = kubelet["kubelet_cert"].decode("ascii")
            args["node_name"] = kubelet["node_name"]
        if is_control_plane:
            args["control_plane_files"] = [{"name": f["name"], "data": base64.b64encode(f["data"]).decode("ascii")}
                                           for f in provider.control_plane_files()]
        self.context.log("join_args_issued", node_vpn_ip=vpn_ip, method=method, control_plane=bool(is_control_plane),
                         kubelet_cert=kubelet is not None)
        return args

    def ticket_kubernetes(self, vpn_ip: str, certificate_request: Optional[bytes],
                          is_control_plane: bool) -> Dict[str, Any]:
        """The ``kubeadm`` part of a join ticket: ``available`` and the join arguments, or why not. A
        refused CSR refuses the ticket (InputError / AccessDenied); a Coordinator without a control plane
        hands out a ticket that says so."""
        if self.kubeadm_provider is None and self.context.kubeadm_join_args is not None:
            try:
                return dict(self.context.kubeadm_join_args(), available=True)
            except ConstellationError as err:
                return {"available": False, "reason": str(err)}
        reason = self.kubeadm_provider.available() if self.kubeadm_provider is not None else \
            "%s (this agent has no kubeadm provider)" % KUBEADM_UNAVAILABLE
        if reason is not None:
            return {"available": False, "reason": reason}
        return dict(self.kubernetes_join_for(vpn_ip, "IssueJoinTicket", certificate_request, is_control_plane),
                    available=True)


def _bind(txn, name: str, vpn_ip: str, admin: bool) -> Optional[str]:
    """In one transaction: ``name`` becomes the name of the peer at ``vpn_ip`` (both directions), or why not."""
    owner = txn.get_default(KEY_KUBELET_NODE_NAME_PREFIX + name)
    if owner is not None and owner.decode("ascii", "replace") != vpn_ip:
        return "belongs to another node (%s)" % owner.decode("ascii", "replace")
    current = txn.get_default(KEY_NODE_NAME_PREFIX + vpn_ip)
    if current is not None and current.decode("utf-8", "replace") != name:
        return "is not this node's name: it is named %s%s (one name per node)" % (
            current.decode("utf-8", "replace"), "" if admin else " already")
    if current is None:
        # A peer named before names were recorded per peer: the names certified for it already.
        had = sorted(key[len(KEY_KUBELET_NODE_NAME_PREFIX):] for key, value in txn.items(KEY_KUBELET_NODE_NAME_PREFIX)
                     if value.decode("ascii", "replace") == vpn_ip)
        if had and name not in had:
            return "is not this node's name: it is named %s (one name per node)" % ", ".join(had)
        txn.put(KEY_NODE_NAME_PREFIX + vpn_ip, name.encode("utf-8"))
    if owner is None:
        txn.put(KEY_KUBELET_NODE_NAME_PREFIX + name, vpn_ip.encode("ascii"))
    return None


def forget_node_names(txn, vpn_ip: str) -> None:
    """In one transaction: the node names of the peer at ``vpn_ip`` (both directions)."""
    for key, value in txn.items(KEY_KUBELET_NODE_NAME_PREFIX):
        if value.decode("ascii", "replace") == vpn_ip:
            txn.delete(key)
    if txn.get_default(KEY_NODE_NAME_PREFIX + vpn_ip) is not None:
        txn.delete(KEY_NODE_NAME_PREFIX + vpn_ip)
