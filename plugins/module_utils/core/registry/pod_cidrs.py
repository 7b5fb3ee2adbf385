# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pod CIDR allocation (docs/wireguard.md, "Pod CIDRs"): every Coordinator and Node gets one block of
``node_pod_cidr_mask_size`` out of ``cluster_pod_cidr`` (10.244.0.0/16 in /24s by default), next to its VPN IP;
freed blocks are reused first (lowest first), else a "next" counter moves on (the pattern of
core/registry/vpn_ips.py). Pure in-memory logic, persisted with the peer registry (core/registry/peer_set.py)."""

from __future__ import annotations

import ipaddress
from typing import Any, Mapping

from ansible_collections.constellation.cluster.plugins.module_utils.constants import CLUSTER_POD_CIDR, NODE_POD_CIDR_MASK_SIZE
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import VPN_CIDR

# A block must hold the bridge's gateway and at least two pods (host-local leaves out network and broadcast).
_MIN_HOST_BITS = 2


def parse_cluster_pod_cidr(cluster_pod_cidr: Any, node_pod_cidr_mask_size: Any, vpn_cidr: str = VPN_CIDR,
                           prefix: str = "") -> tuple:
    """``(network, mask size)`` validated: a network with no host bits set, not overlapping the VPN CIDR, and a
    mask size that splits it into at least one block with room for pods. Errors name ``<prefix>cluster_pod_cidr``
    and ``<prefix>node_pod_cidr_mask_size``."""
    try:
        if not isinstance(cluster_pod_cidr, str):
            raise ValueError(cluster_pod_cidr)
        net = ipaddress.ip_network(cluster_pod_cidr, strict=True)
    except ValueError:
        raise InputError(prefix + "cluster_pod_cidr", "a network with no host bits set, such as %s" % CLUSTER_POD_CIDR,
                         cluster_pod_cidr) from None
    vpn = ipaddress.ip_network(vpn_cidr)
    if net.version == vpn.version and net.overlaps(vpn):
        raise InputError(prefix + "cluster_pod_cidr", "a network not overlapping the VPN CIDR %s" % vpn, cluster_pod_cidr)
    if isinstance(node_pod_cidr_mask_size, bool) or not isinstance(node_pod_cidr_mask_size, int):
        raise InputError(prefix + "node_pod_cidr_mask_size", "an integer prefix length such as %d" % NODE_POD_CIDR_MASK_SIZE,
                         node_pod_cidr_mask_size)
    if not net.prefixlen <= node_pod_cidr_mask_size <= net.max_prefixlen - _MIN_HOST_BITS:
        raise InputError(prefix + "node_pod_cidr_mask_size", "a prefix length between %d (the cluster_pod_cidr's) and %d"
                         % (net.prefixlen, net.max_prefixlen - _MIN_HOST_BITS), node_pod_cidr_mask_size)
    return net, node_pod_cidr_mask_size


class PodCIDRAllocator:
    """Hands out the blocks of ``cluster_pod_cidr``, lowest free first."""

    def __init__(self, cluster_pod_cidr: str = CLUSTER_POD_CIDR, node_pod_cidr_mask_size: int = NODE_POD_CIDR_MASK_SIZE,
                 vpn_cidr: str = VPN_CIDR):
        self.cidr, self.mask_size = parse_cluster_pod_cidr(cluster_pod_cidr, node_pod_cidr_mask_size, vpn_cidr)
        self.count = 2 ** (self.mask_size - self.cidr.prefixlen)
        self._block = 2 ** (self.cidr.max_prefixlen - self.mask_size)
        self._next = 0
        self._free: set[int] = set()

    def _network(self, index: int) -> str:
        address = ipaddress.ip_address(int(self.cidr.network_address) + index * self._block)
        return "%s/%d" % (address, self.mask_size)

    def _index(self, pod_cidr: str) -> int:
        try:
            net = ipaddress.ip_network(pod_cidr, strict=True)
        except (TypeError, ValueError):
            net = None
        if net is None or net.version != self.cidr.version or net.prefixlen != self.mask_size or not net.subnet_of(self.cidr):
            raise InputError("pod_cidr", "a /%d block of %s" % (self.mask_size, self.cidr), pod_cidr)
        return (int(net.network_address) - int(self.cidr.network_address)) // self._block

    def allocate(self) -> str:
        if self._free:
            index = min(self._free)
            self._free.discard(index)
        else:
            if self._next >= self.count:
                raise StateError("no pod CIDR left in cluster_pod_cidr %s (%d blocks of /%d, all in use)"
                                 % (self.cidr, self.count, self.mask_size))
            index = self._next
            self._next += 1
        return self._network(index)

    def in_use(self, pod_cidr: str) -> bool:
        index = self._index(pod_cidr)
        return index < self._next and index not in self._free

    def release(self, pod_cidr: str) -> None:
        index = self._index(pod_cidr)
        if index < self._next:
            self._free.add(index)

    def reserve(self, pod_cidr: str) -> None:
        """Mark a block as used (a peer that already holds it, e.g. restored from a backup)."""
        index = self._index(pod_cidr)
        if index in self._free:
            self._free.discard(index)
        elif index >= self._next:
            self._free.update(range(self._next, index))
            self._next = index + 1
        else:
            raise StateError("pod CIDR %s is already in use" % pod_cidr)

    def to_dict(self) -> dict:
        return {
            "cluster_pod_cidr": str(self.cidr),
            "node_pod_cidr_mask_size": self.mask_size,
            "next_pod_cidr": self._network(self._next) if self._next < self.count else None,
            "free_pod_cidrs": [self._network(i) for i in sorted(self._free)],
        }

    @classmethod
    def from_dict(cls, data: Mapping, vpn_cidr: str = VPN_CIDR) -> "PodCIDRAllocator":
        alloc = cls(data.get("cluster_pod_cidr"), data.get("node_pod_cidr_mask_size"), vpn_cidr)
        nxt = data.get("next_pod_cidr")
        alloc._next = alloc.count if nxt is None else alloc._index(nxt)
        for text in data.get("free_pod_cidrs", []):
            index = alloc._index(text)
            if index >= alloc._next:
                raise InputError("free_pod_cidrs", "blocks below next_pod_cidr", text)
            alloc._free.add(index)
        return alloc
