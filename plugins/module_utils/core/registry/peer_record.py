# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A peer of the cluster (``PeerRecord``, docs/store.md, "Typed records") and its store and WireGuard forms. The VPN IP
allocation is core/registry/vpn_ips.py, the pod CIDR allocation core/registry/pod_cidrs.py, the versioned peer set
and the registry core/registry/peer_set.py."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from typing import Iterable, Mapping

from ansible_collections.constellation.cluster.plugins.module_utils.constants import ROLE_ADMIN, ROLE_COORDINATOR, ROLE_NODE
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import (
    LISTEN_PORT,
    PERSISTENT_KEEPALIVE,
    Peer,
    normalize_pub_key,
    parse_pod_cidr,
)

ROLES = (ROLE_COORDINATOR, ROLE_NODE, ROLE_ADMIN)
# Store key names of docs/store.md, "Typed records", for the stores that persist a peer set.
STORE_PEER_PREFIX = "peerPrefix"
STORE_RESOURCE_VERSION = "peersResourceVersion"
_GO_ROLES = {"coordinator": "Coordinator", "node": "Node", "admin": "Admin"}


@dataclass(frozen=True)
class PeerRecord:
    """One cluster member as the Coordinator stores it (docs/store.md, "Typed records" ``peerPrefix<vpnIP>``)."""

    vpn_ip: str
    vpn_pub_key: str
    public_ip: str | None = None
    role: str = "node"
    # The peer's pod CIDR (docs/wireguard.md, "Pod CIDRs"): None for an admin, a cluster without the pod network,
    # and a member recorded before there were pod CIDRs.
    pod_cidr: str | None = None

    @classmethod
    def parse(cls, vpn_ip: str, vpn_pub_key: str, public_ip: str | None = None, role: str = "node",
              field_name: str = "peer", pod_cidr: str | None = None) -> "PeerRecord":
        try:
            ip = str(ipaddress.ip_address(vpn_ip))
        except ValueError:
            raise InputError(field_name + ".vpn_ip", "an IP address", vpn_ip) from None
        if public_ip not in (None, ""):
            try:
                public_ip = str(ipaddress.ip_address(public_ip))
            except ValueError:
                raise InputError(field_name + ".public_ip", "an IP address or nothing (admin)", public_ip) from None
        else:
            public_ip = None
        if role not in ROLES:
            raise InputError(field_name + ".role", "one of %s" % ", ".join(ROLES), role)
        if pod_cidr in (None, ""):
            pod_cidr = None
        else:
            pod_cidr = parse_pod_cidr(pod_cidr, field_name + ".pod_cidr")
        return cls(ip, normalize_pub_key(vpn_pub_key, field_name + ".vpn_pub_key"), public_ip, role, pod_cidr)

    def with_pod_cidr(self, pod_cidr: str | None) -> "PeerRecord":
        return PeerRecord.parse(self.vpn_ip, self.vpn_pub_key, self.public_ip, self.role, pod_cidr=pod_cidr)

    def to_peer(self, port: int = LISTEN_PORT, persistent_keepalive: int = PERSISTENT_KEEPALIVE) -> Peer:
        """The WireGuard peer: endpoint only where a public IP is known (the admin has none)."""
        endpoint = None
        if self.public_ip:
            endpoint = ("[%s]:%d" if ":" in self.public_ip else "%s:%d") % (self.public_ip, port)
        return Peer(self.vpn_pub_key, self.vpn_ip, endpoint, persistent_keepalive, self.pod_cidr)

    def to_dict(self) -> dict:
        """The record as signed peer sets and stores carry it; ``pod_cidr`` only when there is one (a record
        without reads as before pod CIDRs existed)."""
        out = {"vpn_ip": self.vpn_ip, "vpn_pub_key": self.vpn_pub_key, "public_ip": self.public_ip, "role": self.role}
        if self.pod_cidr is not None:
            out["pod_cidr"] = self.pod_cidr
        return out

    @classmethod
    def from_dict(cls, data: Mapping) -> "PeerRecord":
        return cls.parse(data.get("vpn_ip"), data.get("vpn_pub_key"), data.get("public_ip"), data.get("role", "node"),
                         pod_cidr=data.get("pod_cidr"))

    def to_store_value(self) -> bytes:
        """Go ``encoding/json`` of the Coordinator's peer (``VPNPubKey`` []byte = std-base64); ``PodCIDR`` only
        when there is one."""
        value = {"PublicIP": self.public_ip or "", "VPNIP": self.vpn_ip, "VPNPubKey": self.vpn_pub_key,
                 "Role": _GO_ROLES[self.role]}
        if self.pod_cidr is not None:
            value["PodCIDR"] = self.pod_cidr
        return json.dumps(value, separators=(",", ":")).encode()

    @classmethod
    def from_store_value(cls, value: bytes) -> "PeerRecord":
        data = json.loads(value)
        roles = {v: k for k, v in _GO_ROLES.items()}
        return cls.parse(data["VPNIP"], data["VPNPubKey"], data.get("PublicIP"), roles.get(data.get("Role"), "?"),
                         pod_cidr=data.get("PodCIDR"))


def wireguard_peer_list(records: Iterable[PeerRecord], own_pub_key: str | None = None,
                        port: int = LISTEN_PORT) -> list[dict]:
    """A peer set as the explicit list ``wireguard.parse_peer_list``/``wireguard_peers`` take, without
    the caller's own entry (the Coordinator's set includes every member, the caller too)."""
    own = normalize_pub_key(own_pub_key, "own_pub_key") if own_pub_key else None
    return [record.to_peer(port).to_dict() for record in
            sorted(records, key=lambda r: int(ipaddress.ip_address(r.vpn_ip))) if record.vpn_pub_key != own]
