# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The records the Core hands out and takes: activation results, the node activation request
and step, and the join ticket (docs/protocol.md, "IssueJoinTicket", the parts that apply here)."""

from __future__ import annotations

import dataclasses
import ipaddress
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils import kms as kms_mod
from ansible_collections.constellation.cluster.plugins.module_utils.core.inputs import (
    CLUSTER_ID_LENGTH,
    MEASUREMENT_SALT_LENGTH,
    b64,
    b64d,
    ip,
    parse_admin_pub_key,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.signing import parse_coordinator_pub_key
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_record import PeerRecord
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import parse_pod_cidr


def parse_peers(raw: Any, field: str) -> List[PeerRecord]:
    """A peer list as a message carries it (activation requests, tickets): at most 65,536
    ``{vpn_ip, vpn_pub_key, public_ip, role[, pod_cidr]}`` objects; InputError naming ``field[index]`` otherwise."""
    if not isinstance(raw, list) or len(raw) > 65536:
        raise InputError(field, "a list of {vpn_ip, vpn_pub_key, public_ip, role}", type(raw).__name__)
    peers = []
    for index, item in enumerate(raw):
        where = "%s[%d]" % (field, index)
        if not isinstance(item, Mapping):
            raise InputError(where, "an object", type(item).__name__)
        peers.append(PeerRecord.parse(item.get("vpn_ip"), item.get("vpn_pub_key"), item.get("public_ip"),
                                      item.get("role", "node"), where, pod_cidr=item.get("pod_cidr")))
    return peers


@dataclass(frozen=True)
class CoordinatorActivation:
    cluster_id: bytes
    coordinator_vpn_ip: str
    coordinator_vpn_pub_key: str
    state: str
    cluster_pod_cidr: Optional[str] = None
    coordinator_pod_cidr: Optional[str] = None

    def to_dict(self) -> Dict[str, Any]:
        out = {"cluster_id": b64(self.cluster_id), "coordinator_vpn_ip": self.coordinator_vpn_ip,
               "coordinator_vpn_pub_key": self.coordinator_vpn_pub_key, "state": self.state}
        if self.cluster_pod_cidr is not None:
            out.update(cluster_pod_cidr=self.cluster_pod_cidr, coordinator_pod_cidr=self.coordinator_pod_cidr)
        return out


def parse_node_pod_cidr(params: Mapping[str, Any]) -> Tuple[Optional[str], Optional[str]]:
    """``(node_pod_cidr, cluster_pod_cidr)`` of an activation request or ticket (docs/wireguard.md, "Pod CIDRs"):
    both or neither, the node's inside the cluster's."""
    node, cluster = params.get("node_pod_cidr"), params.get("cluster_pod_cidr")
    if node is None and cluster is None:
        return None, None
    if node is None or cluster is None:
        raise InputError("node_pod_cidr" if node is None else "cluster_pod_cidr",
                         "a network too (node_pod_cidr and cluster_pod_cidr go together)")
    node, cluster = parse_pod_cidr(node, "node_pod_cidr"), parse_pod_cidr(cluster, "cluster_pod_cidr")
    node_net, cluster_net = ipaddress.ip_network(node), ipaddress.ip_network(cluster)
    if node_net.version != cluster_net.version or not node_net.subnet_of(cluster_net):
        raise InputError("node_pod_cidr", "a network inside cluster_pod_cidr %s" % cluster, node)
    return node, cluster


@dataclass(frozen=True)
class NodeActivationRequest:
    """What the Coordinator sends a node in the first step of ActivateAsNode."""

    node_vpn_ip: str
    peers: Tuple[PeerRecord, ...]
    cluster_id: bytes
    measurement_salt: bytes
    admin_pub_key: str
    coordinator_vpn_ip: str
    # Proof of this node's init secret (init_secret.py); checked by the node before its node lock.
    init_proof: Optional[bytes] = field(default=None, repr=False)
    # The Coordinators' signing key (core/signing.py), pinned by the node: every ticket and peer update it
    # gets later must carry a signature that verifies with it.
    coordinator_pub_key: Optional[str] = None
    # The node's own pod CIDR and the cluster's pod range (docs/wireguard.md, "Pod CIDRs"); None without the pod network.
    node_pod_cidr: Optional[str] = None
    cluster_pod_cidr: Optional[str] = None

    @classmethod
    def from_dict(cls, params: Mapping[str, Any]) -> "NodeActivationRequest":
        if not isinstance(params, Mapping):
            raise InputError("params", "a JSON object", type(params).__name__)
        node_vpn_ip = ip(params.get("node_vpn_ip"), "node_vpn_ip")
        coordinator_vpn_ip = ip(params.get("coordinator_vpn_ip"), "coordinator_vpn_ip")
        peers = parse_peers(params.get("peers"), "peers")
        cluster_id = b64d(params.get("cluster_id"), "cluster_id", CLUSTER_ID_LENGTH)
        salt = b64d(params.get("measurement_salt"), "measurement_salt", MEASUREMENT_SALT_LENGTH)
        admin_pub_key = params.get("admin_pub_key")
        parse_admin_pub_key(admin_pub_key)
        proof = params.get("init_proof")
        init_proof = b64d(proof, "init_proof", 32) if proof is not None else None
        pinned = params.get("coordinator_pub_key")
        pinned = parse_coordinator_pub_key(pinned) if pinned is not None else None
        node_pod_cidr, cluster_pod_cidr = parse_node_pod_cidr(params)
        return cls(node_vpn_ip, tuple(peers), cluster_id, salt, admin_pub_key, coordinator_vpn_ip, init_proof, pinned,
                   node_pod_cidr, cluster_pod_cidr)

    def to_dict(self) -> Dict[str, Any]:
        out = {"node_vpn_ip": self.node_vpn_ip, "peers": [p.to_dict() for p in self.peers],
               "cluster_id": b64(self.cluster_id), "measurement_salt": b64(self.measurement_salt),
               "admin_pub_key": self.admin_pub_key, "coordinator_vpn_ip": self.coordinator_vpn_ip}
        if self.init_proof is not None:
            out["init_proof"] = b64(self.init_proof)
        if self.coordinator_pub_key is not None:
            out["coordinator_pub_key"] = self.coordinator_pub_key
        if self.node_pod_cidr is not None:
            out.update(node_pod_cidr=self.node_pod_cidr, cluster_pod_cidr=self.cluster_pod_cidr)
        return out

    def without_proof(self) -> "NodeActivationRequest":
        return dataclasses.replace(self, init_proof=None)


@dataclass(frozen=True)
class NodeActivationStep:
    """The node's answer to the first step: its disk UUID and WireGuard public key."""

    state_disk_uuid: str
    node_vpn_pub_key: str


@dataclass(frozen=True, repr=False)
class JoinTicket:
    """What the join service hands a verified node (docs/protocol.md, "IssueJoinTicket", the parts that apply here)."""

    cluster_id: bytes
    measurement_salt: bytes
    measurement_secret: bytes
    state_disk_key: bytes
    node_vpn_ip: str
    peers: Tuple[PeerRecord, ...]
    coordinator_vpn_ip: str
    admin_pub_key: str
    kubeadm: Dict[str, Any] = field(default_factory=dict)
    # The key that signed it (the node checks with its own pinned one). A ticket carries no proof of any init
    # secret: the Coordinators' signature tells the node the ticket is its cluster's.
    coordinator_pub_key: Optional[str] = None
    # The Coordinators' signature (core/signing.py) over the ticket and the request and connection it answers.
    signature: Optional[str] = None
    # The node's own pod CIDR and the cluster's pod range (signed with the rest); None without the pod network.
    node_pod_cidr: Optional[str] = None
    cluster_pod_cidr: Optional[str] = None

    def __repr__(self) -> str:
        return "JoinTicket(node_vpn_ip=%r, <secrets>)" % self.node_vpn_ip

    def signed(self, signature: str) -> "JoinTicket":
        return dataclasses.replace(self, signature=signature)

    def to_dict(self) -> Dict[str, Any]:
        out = {"cluster_id": b64(self.cluster_id), "measurement_salt": b64(self.measurement_salt),
               "measurement_secret": b64(self.measurement_secret), "state_disk_key": b64(self.state_disk_key),
               "node_vpn_ip": self.node_vpn_ip, "peers": [p.to_dict() for p in self.peers],
               "coordinator_vpn_ip": self.coordinator_vpn_ip, "admin_pub_key": self.admin_pub_key,
               "kubeadm": dict(self.kubeadm)}
        if self.coordinator_pub_key is not None:
            out["coordinator_pub_key"] = self.coordinator_pub_key
        if self.node_pod_cidr is not None:
            out.update(node_pod_cidr=self.node_pod_cidr, cluster_pod_cidr=self.cluster_pod_cidr)
        if self.signature is not None:
            out["signature"] = self.signature
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "JoinTicket":
        request = NodeActivationRequest.from_dict(data)
        kubeadm = data.get("kubeadm") or {}
        if not isinstance(kubeadm, Mapping):
            raise InputError("kubeadm", "an object", type(kubeadm).__name__)
        return cls(request.cluster_id, request.measurement_salt,
                   b64d(data.get("measurement_secret"), "measurement_secret", 32),
                   b64d(data.get("state_disk_key"), "state_disk_key", kms_mod.STATE_DISK_KEY_LENGTH),
                   request.node_vpn_ip, request.peers, request.coordinator_vpn_ip, request.admin_pub_key,
                   dict(kubeadm), request.coordinator_pub_key, _signature(data), request.node_pod_cidr,
                   request.cluster_pod_cidr)

    def activation_request(self) -> NodeActivationRequest:
        """The ticket's non-secret part, as the activation request it replaces."""
        return NodeActivationRequest(self.node_vpn_ip, self.peers, self.cluster_id, self.measurement_salt,
                                     self.admin_pub_key, self.coordinator_vpn_ip,
                                     coordinator_pub_key=self.coordinator_pub_key, node_pod_cidr=self.node_pod_cidr,
                                     cluster_pod_cidr=self.cluster_pod_cidr)


@dataclass(frozen=True, repr=False)
class RejoinTicket:
    """What a rebooted Node gets from its Coordinator (IssueRejoinTicket) instead of the KMS URI:
    only what it needs to resume - its own disk key, the measurement secret (which proves the
    cluster ID) and its peers at ``resource_version``."""

    state_disk_key: bytes
    measurement_secret: bytes
    peers: Tuple[PeerRecord, ...]
    resource_version: int
    # The Coordinators' signature (core/signing.py) over the ticket and the request and connection it answers.
    signature: Optional[str] = None

    def __repr__(self) -> str:
        return "RejoinTicket(peers=%d, resource_version=%d, <secrets>)" % (len(self.peers), self.resource_version)

    def signed(self, signature: str) -> "RejoinTicket":
        return dataclasses.replace(self, signature=signature)

    def to_dict(self) -> Dict[str, Any]:
        out = {"state_disk_key": b64(self.state_disk_key), "measurement_secret": b64(self.measurement_secret),
               "peers": [p.to_dict() for p in self.peers], "resource_version": self.resource_version}
        if self.signature is not None:
            out["signature"] = self.signature
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RejoinTicket":
        if not isinstance(data, Mapping):
            raise InputError("ticket", "a JSON object", type(data).__name__)
        peers = parse_peers(data.get("peers"), "ticket.peers")
        version = data.get("resource_version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise InputError("ticket.resource_version", "a non-negative integer", type(version).__name__)
        return cls(b64d(data.get("state_disk_key"), "ticket.state_disk_key", kms_mod.STATE_DISK_KEY_LENGTH),
                   b64d(data.get("measurement_secret"), "ticket.measurement_secret", 32), tuple(peers), version,
                   _signature(data))


def _signature(data: Mapping[str, Any]) -> Optional[str]:
    value = data.get("signature")
    if value is not None and (not isinstance(value, str) or len(value) > 128):
        raise InputError("ticket.signature", "standard base64 of an Ed25519 signature", type(value).__name__)
    return value
