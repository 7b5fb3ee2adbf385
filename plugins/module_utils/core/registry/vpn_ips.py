# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""VPN IP allocation (docs/wireguard.md, "Addresses and ports"): coordinators get 10.118.0.1-10.118.0.10, nodes and admins 10.118.0.11
and up; freed addresses are reused first (lowest first), else a "next" counter moves on. Pure in-memory
logic, persisted with the peer registry (core/registry/peer_set.py)."""

from __future__ import annotations

import ipaddress
from typing import Mapping

from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_record import ROLES
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import VPN_CIDR

COORDINATOR_IP_COUNT = 10


class VPNIPAllocator:
    """Hands out VPN IPs: coordinators from the first 10 host addresses, everyone else after them."""

    def __init__(self, vpn_cidr: str = VPN_CIDR):
        try:
            self.cidr = ipaddress.ip_network(vpn_cidr, strict=True)
        except ValueError:
            raise InputError("vpn_cidr", "a network such as 10.118.0.0/16", vpn_cidr) from None
        if self.cidr.version != 4 or self.cidr.num_addresses < COORDINATOR_IP_COUNT + 4:
            raise InputError("vpn_cidr", "an IPv4 network of at least /28", vpn_cidr)
        base = int(self.cidr.network_address)
        self._ranges = {
            "coordinator": (base + 1, base + COORDINATOR_IP_COUNT),
            "node": (base + COORDINATOR_IP_COUNT + 1, int(self.cidr.broadcast_address) - 1),
        }
        self._next = {kind: lo for kind, (lo, _hi) in self._ranges.items()}
        self._free: dict[str, set[int]] = {kind: set() for kind in self._ranges}

    @staticmethod
    def _kind(role: str) -> str:
        if role not in ROLES:
            raise InputError("role", "one of %s" % ", ".join(ROLES), role)
        return "coordinator" if role == "coordinator" else "node"

    def _kind_of(self, ip: int) -> str:
        for kind, (lo, hi) in self._ranges.items():
            if lo <= ip <= hi:
                return kind
        raise InputError("vpn_ip", "a host address of %s" % self.cidr, str(ipaddress.ip_address(ip)))

    def allocate(self, role: str) -> str:
        kind = self._kind(role)
        free = self._free[kind]
        if free:
            ip = min(free)
            free.discard(ip)
        else:
            ip = self._next[kind]
            if ip > self._ranges[kind][1]:
                raise StateError("no VPN IP left in the %s range of %s" % (kind, self.cidr))
            self._next[kind] = ip + 1
        return str(ipaddress.ip_address(ip))

    def in_use(self, vpn_ip: str) -> bool:
        ip = int(ipaddress.ip_address(vpn_ip))
        kind = self._kind_of(ip)
        return ip < self._next[kind] and ip not in self._free[kind]

    def release(self, vpn_ip: str) -> None:
        ip = int(ipaddress.ip_address(vpn_ip))
        kind = self._kind_of(ip)
        if ip < self._next[kind]:
            self._free[kind].add(ip)

    def reserve(self, vpn_ip: str) -> None:
        """Mark an address as used (e.g. a peer imported with a fixed IP)."""
        ip = int(ipaddress.ip_address(vpn_ip))
        kind = self._kind_of(ip)
        if ip in self._free[kind]:
            self._free[kind].discard(ip)
        elif ip >= self._next[kind]:
            self._free[kind].update(range(self._next[kind], ip))
            self._next[kind] = ip + 1
        else:
            raise StateError("VPN IP %s is already in use" % vpn_ip)

    def to_dict(self) -> dict:
        def ip(i):
            return str(ipaddress.ip_address(i))

        return {
            "vpn_cidr": str(self.cidr),
            "next_coordinator_ip": ip(self._next["coordinator"]),
            "next_node_ip": ip(self._next["node"]),
            "free_coordinator_ips": [ip(i) for i in sorted(self._free["coordinator"])],
            "free_node_ips": [ip(i) for i in sorted(self._free["node"])],
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> "VPNIPAllocator":
        alloc = cls(data.get("vpn_cidr", VPN_CIDR))
        for kind in ("coordinator", "node"):
            nxt = int(ipaddress.ip_address(data["next_%s_ip" % kind]))
            lo, hi = alloc._ranges[kind]
            if not lo <= nxt <= hi + 1:
                raise InputError("next_%s_ip" % kind, "an address of the %s range" % kind, data["next_%s_ip" % kind])
            alloc._next[kind] = nxt
            for text in data.get("free_%s_ips" % kind, []):
                i = int(ipaddress.ip_address(text))
                if alloc._kind_of(i) != kind or i >= nxt:
                    raise InputError("free_%s_ips" % kind, "addresses below next_%s_ip" % kind, text)
                alloc._free[kind].add(i)
        return alloc
