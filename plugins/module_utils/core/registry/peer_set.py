# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cluster's versioned peer set and registry (docs/store.md, "Typed records").

* ``VersionedPeerSet``: every change bumps ``resource_version``; a bounded change log lets
  ``updates_since(v)`` answer with only what changed since ``v`` (or just the version when nothing
  did). Constellation's ``GetUpdate`` sent the whole peer list on any change; here the answer grows with
  the change, not with the cluster. A caller too far behind (or ahead, after a restore) gets the full
  set, flagged ``full`` so it replaces rather than merges.
* ``PeerRegistry``: the set with its VPN IP allocator (core/registry/vpn_ips.py) and, with the pod network, its
  pod CIDR allocator (core/registry/pod_cidrs.py), as the Coordinator keeps it.

Pure in-memory logic; the agent's file and etcd stores persist it through ``to_dict``/``from_dict``.
"""

from __future__ import annotations

import ipaddress
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Mapping

from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_record import PeerRecord
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.pod_cidrs import PodCIDRAllocator
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.vpn_ips import VPNIPAllocator
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import VPN_CIDR, normalize_pub_key

DEFAULT_MAX_LOG_CHANGES = 1024
# A version stays an exact JSON number.
MAX_RESOURCE_VERSION = 2 ** 53


@dataclass(frozen=True)
class PeerUpdate:
    """The answer to ``updates_since``. ``full``: ``added`` is the whole set; replace, do not merge."""

    resource_version: int
    full: bool = False
    added: tuple[PeerRecord, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[PeerRecord, ...] = ()

    def __bool__(self) -> bool:
        return self.full or bool(self.added or self.removed or self.changed)

    def to_dict(self) -> dict:
        """Only the version when nothing changed: the answer's size does not grow with the cluster."""
        out: dict = {"resource_version": self.resource_version}
        if self.full:
            out["full"] = True
        if self.added:
            out["added"] = [p.to_dict() for p in self.added]
        if self.removed:
            out["removed"] = list(self.removed)
        if self.changed:
            out["changed"] = [p.to_dict() for p in self.changed]
        return out

    @classmethod
    def from_dict(cls, data: Mapping) -> "PeerUpdate":
        return cls(
            int(data["resource_version"]),
            bool(data.get("full", False)),
            tuple(PeerRecord.from_dict(p) for p in data.get("added", [])),
            tuple(str(ipaddress.ip_address(ip)) for ip in data.get("removed", [])),
            tuple(PeerRecord.from_dict(p) for p in data.get("changed", [])),
        )

    def apply_to(self, peers: Mapping[str, PeerRecord]) -> dict[str, PeerRecord]:
        """The caller's side: its peer map (by VPN IP) after this update."""
        result = {} if self.full else dict(peers)
        for ip in self.removed:
            result.pop(ip, None)
        for record in self.added + self.changed:
            result[record.vpn_ip] = record
        return result


class VersionedPeerSet:
    """Peers by VPN IP with a resource version and a bounded log of what each version changed."""

    def __init__(self, max_log_changes: int = DEFAULT_MAX_LOG_CHANGES):
        if max_log_changes < 1:
            raise InputError("max_log_changes", "at least 1", max_log_changes)
        self.max_log_changes = max_log_changes
        self.version = 0
        self._peers: dict[str, PeerRecord] = {}
        # (version, ((vpn_ip, before, after), ...)); versions older than _log_floor are forgotten.
        self._log: deque = deque()
        self._log_size = 0
        self._log_floor = 0

    @property
    def peers(self) -> dict[str, PeerRecord]:
        return dict(self._peers)

    def __len__(self) -> int:
        return len(self._peers)

    def get(self, vpn_ip: str) -> PeerRecord | None:
        return self._peers.get(vpn_ip)

    def by_pub_key(self, vpn_pub_key: str) -> PeerRecord | None:
        for record in self._peers.values():
            if record.vpn_pub_key == vpn_pub_key:
                return record
        return None

    def apply(self, put: Iterable[PeerRecord] = (), remove: Iterable[str] = ()) -> int:
        """Add/replace and remove peers as one transaction: one new version if anything really
        changed, none otherwise. Validates everything first; on error nothing changes."""
        new = dict(self._peers)
        for ip in remove:
            new.pop(str(ipaddress.ip_address(ip)), None)
        for record in put:
            if not isinstance(record, PeerRecord):
                raise InputError("put", "PeerRecord", type(record).__name__)
            new[record.vpn_ip] = record
        keys: dict[str, str] = {}
        for record in new.values():
            if record.vpn_pub_key in keys:
                raise InputError("vpn_pub_key", "a key not already used by %s" % keys[record.vpn_pub_key], record.vpn_ip)
            keys[record.vpn_pub_key] = record.vpn_ip
        entries = tuple(
            (ip, self._peers.get(ip), new.get(ip))
            for ip in sorted(set(self._peers) | set(new), key=lambda a: int(ipaddress.ip_address(a)))
            if self._peers.get(ip) != new.get(ip)
        )
        if not entries:
            return self.version
        self._peers = new
        self.version += 1
        self._log.append((self.version, entries))
        self._log_size += len(entries)
        while self._log_size > self.max_log_changes and self._log:
            version, dropped = self._log.popleft()
            self._log_size -= len(dropped)
            self._log_floor = version
        return self.version

    def put(self, record: PeerRecord) -> int:
        return self.apply(put=[record])

    def continue_above(self, floor: int) -> int:
        """The same peers at ``floor + 1`` when ``floor`` is not below this set's version: a set restored from a
        backup continues above the version its Nodes hold (they refuse an older one, core/node.py). The log is
        forgotten, so every older version gets the full set."""
        if not isinstance(floor, int) or isinstance(floor, bool) or not 0 <= floor < MAX_RESOURCE_VERSION:
            raise InputError("resource_version", "an integer in [0, %d)" % MAX_RESOURCE_VERSION, floor)
        if floor < self.version:
            return self.version
        self.version = floor + 1
        self._log.clear()
        self._log_size = 0
        self._log_floor = self.version
        return self.version

    def remove(self, vpn_ip: str) -> int:
        return self.apply(remove=[vpn_ip])

    def updates_since(self, resource_version: int) -> PeerUpdate:
        """What changed after ``resource_version``: nothing but the version if nothing did; the net
        added/removed/changed peers if the log reaches back that far; else the full set."""
        if resource_version == self.version:
            return PeerUpdate(self.version)
        if not isinstance(resource_version, int) or resource_version < self._log_floor or resource_version > self.version:
            return self.full_update()
        first: dict[str, PeerRecord | None] = {}
        last: dict[str, PeerRecord | None] = {}
        for version, entries in self._log:
            if version <= resource_version:
                continue
            for ip, before, after in entries:
                first.setdefault(ip, before)
                last[ip] = after
        added, removed, changed = [], [], []
        for ip, before in first.items():
            after = last[ip]
            if before is None and after is not None:
                added.append(after)
            elif before is not None and after is None:
                removed.append(ip)
            elif before != after:
                changed.append(after)
        return PeerUpdate(self.version, False, tuple(added), tuple(removed), tuple(changed))

    def full_update(self) -> PeerUpdate:
        return PeerUpdate(self.version, True, tuple(self._sorted()))

    def _sorted(self) -> list[PeerRecord]:
        return [self._peers[ip] for ip in sorted(self._peers, key=lambda a: int(ipaddress.ip_address(a)))]

    def to_dict(self) -> dict:
        def rec(r):
            return None if r is None else r.to_dict()

        return {
            "resource_version": self.version,
            "max_log_changes": self.max_log_changes,
            "log_floor": self._log_floor,
            "peers": [r.to_dict() for r in self._sorted()],
            "log": [{"version": v, "changes": [[ip, rec(b), rec(a)] for ip, b, a in entries]}
                    for v, entries in self._log],
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> "VersionedPeerSet":
        result = cls(int(data.get("max_log_changes", DEFAULT_MAX_LOG_CHANGES)))
        result.version = int(data["resource_version"])
        result._log_floor = int(data.get("log_floor", result.version))
        records = [PeerRecord.from_dict(p) for p in data.get("peers", [])]
        result._peers = {r.vpn_ip: r for r in records}
        if len(result._peers) != len(records):
            raise InputError("peers", "one record per VPN IP", len(records))

        def rec(d):
            return None if d is None else PeerRecord.from_dict(d)

        previous = result._log_floor
        for item in data.get("log", []):
            version = int(item["version"])
            if not previous < version <= result.version:
                raise InputError("log", "versions increasing up to resource_version", version)
            previous = version
            entries = tuple((str(ipaddress.ip_address(ip)), rec(b), rec(a)) for ip, b, a in item["changes"])
            result._log.append((version, entries))
            result._log_size += len(entries)
        if result._log and result._log[-1][0] != result.version:
            # A log that does not reach the current version cannot answer deltas: forget it.
            result._log.clear()
            result._log_size = 0
            result._log_floor = result.version
        return result


class PeerRegistry:
    """The Coordinator's view: allocate a VPN IP (and, with the pod network, a pod CIDR), record the peer, version
    the change. ``pod_cidrs`` is None when the cluster has no pod network (its peers have no pod CIDR).
    ``reserved_pod_cidrs``: the pod CIDRs of VPN IPs reserved for a node being activated (``reserve``), by VPN IP,
    until the node is recorded (``put_node``) or the reservation is released (``release_reserved``)."""

    def __init__(self, vpn_cidr: str = VPN_CIDR, max_log_changes: int = DEFAULT_MAX_LOG_CHANGES):
        self.allocator = VPNIPAllocator(vpn_cidr)
        self.peers = VersionedPeerSet(max_log_changes)
        self.pod_cidrs: PodCIDRAllocator | None = None
        self.reserved_pod_cidrs: dict[str, str] = {}

    def _gets_pod_cidr(self, role: str) -> bool:
        return self.pod_cidrs is not None and role != "admin"

    def use_pod_cidrs(self, cluster_pod_cidr: str, node_pod_cidr_mask_size: int) -> list[PeerRecord]:
        """Turns the pod network on (the first Coordinator's activation, or a cluster activated before pod CIDRs
        existed): every Coordinator and Node without a pod CIDR gets one, in one new version. The same range
        again changes nothing; another range is a StateError (the allocated CIDRs would not fit it). The
        records that got a pod CIDR."""
        wanted = PodCIDRAllocator(cluster_pod_cidr, node_pod_cidr_mask_size, str(self.allocator.cidr))
        if self.pod_cidrs is not None:
            if (self.pod_cidrs.cidr, self.pod_cidrs.mask_size) != (wanted.cidr, wanted.mask_size):
                raise StateError("the cluster's pod CIDRs are /%d blocks of %s, not /%d blocks of %s: the range cannot "
                                 "change once allocated" % (self.pod_cidrs.mask_size, self.pod_cidrs.cidr,
                                                            wanted.mask_size, wanted.cidr))
            wanted = self.pod_cidrs
        else:
            for record in self.peers.peers.values():
                if record.pod_cidr is not None:
                    wanted.reserve(record.pod_cidr)
        missing = [r for r in self._sorted_records() if r.pod_cidr is None and r.role != "admin"]
        updated = [r.with_pod_cidr(wanted.allocate()) for r in missing]  # StateError if they do not fit: nothing changes
        self.pod_cidrs = wanted
        if updated:
            self.peers.apply(put=updated)
        return updated

    def _sorted_records(self) -> list[PeerRecord]:
        peers = self.peers.peers
        return [peers[ip] for ip in sorted(peers, key=lambda a: int(ipaddress.ip_address(a)))]

    def add(self, vpn_pub_key: str, public_ip: str | None, role: str) -> PeerRecord:
        """Allocate an IP (and a pod CIDR) and add the peer; a key already present keeps its record (idempotent;
        a Coordinator or Node recorded without a pod CIDR gets one)."""
        key = normalize_pub_key(vpn_pub_key, "vpn_pub_key")
        existing = self.peers.by_pub_key(key)
        if existing is not None:
            pod_cidr = existing.pod_cidr
            if pod_cidr is None and self._gets_pod_cidr(role):
                pod_cidr = self.pod_cidrs.allocate()
            if existing.role != role or existing.public_ip != (public_ip or None) or pod_cidr != existing.pod_cidr:
                if self.allocator._kind(role) != self.allocator._kind(existing.role):
                    raise StateError("peer %s cannot change from %s to %s" % (existing.vpn_ip, existing.role, role))
                record = PeerRecord.parse(existing.vpn_ip, key, public_ip, role, pod_cidr=pod_cidr)
                self.peers.put(record)
                return record
            return existing
        ip = self.allocator.allocate(role)
        pod_cidr = None
        try:
            pod_cidr = self.pod_cidrs.allocate() if self._gets_pod_cidr(role) else None
            record = PeerRecord.parse(ip, key, public_ip, role, pod_cidr=pod_cidr)
            self.peers.put(record)
        except Exception:
            self.allocator.release(ip)
            if pod_cidr is not None:
                self.pod_cidrs.release(pod_cidr)
            raise
        return record

    def reserve(self, role: str = "node") -> str:
        """A VPN IP (and pod CIDR) for a node about to be activated at it; ``put_node`` records it."""
        ip = self.allocator.allocate(role)
        if self._gets_pod_cidr(role):
            try:
                self.reserved_pod_cidrs[ip] = self.pod_cidrs.allocate()
            except Exception:
                self.allocator.release(ip)
                raise
        return ip

    def pod_cidr_of(self, vpn_ip: str) -> str | None:
        """The pod CIDR reserved for or held by the peer at ``vpn_ip`` (None: none)."""
        if vpn_ip in self.reserved_pod_cidrs:
            return self.reserved_pod_cidrs[vpn_ip]
        record = self.peers.get(vpn_ip)
        return record.pod_cidr if record is not None else None

    def release_reserved(self, vpn_ip: str) -> None:
        """Gives back a reservation whose node was not recorded (its activation failed)."""
        if self.peers.get(vpn_ip) is None:
            self.allocator.release(vpn_ip)
            pod_cidr = self.reserved_pod_cidrs.pop(vpn_ip, None)
            if pod_cidr is not None and self.pod_cidrs is not None:
                self.pod_cidrs.release(pod_cidr)

    def put_node(self, record: PeerRecord) -> int:
        """Records an activated peer at its reserved (or a fixed) VPN IP; its pod CIDR is the reserved one, the one
        it holds already, the record's own (reserved here), or a new one. The new version."""
        if self.peers.by_pub_key(record.vpn_pub_key) not in (None, self.peers.get(record.vpn_ip)):
            raise StateError("WireGuard key of %s is already used by another peer" % record.vpn_ip)
        if not self.allocator.in_use(record.vpn_ip):
            self.allocator.reserve(record.vpn_ip)
        if self._gets_pod_cidr(record.role):
            pod_cidr = self.reserved_pod_cidrs.pop(record.vpn_ip, None)
            current = self.peers.get(record.vpn_ip)
            if pod_cidr is None and current is not None:
                pod_cidr = current.pod_cidr
            if pod_cidr is None and record.pod_cidr is not None:
                self.pod_cidrs.reserve(record.pod_cidr)
                pod_cidr = record.pod_cidr
            if pod_cidr is None:
                pod_cidr = self.pod_cidrs.allocate()
            record = record.with_pod_cidr(pod_cidr)
        return self.peers.put(record)

    def withdraw(self, vpn_ip: str) -> None:
        """An eviction: the peer leaves the set (its VPN IP and pod CIDR leave every peer's WireGuard) but both stay
        allocated to it: re-admission gives them back (``put_node``), a removal frees them (``release_reserved``)."""
        record = self.peers.get(vpn_ip)
        if record is None:
            return
        self.peers.remove(vpn_ip)
        if record.pod_cidr is not None and self.pod_cidrs is not None:
            self.reserved_pod_cidrs[vpn_ip] = record.pod_cidr

    def remove(self, vpn_ip: str) -> None:
        """Takes the peer out of the set and frees its VPN IP and pod CIDR."""
        record = self.peers.get(vpn_ip)
        if record is None:
            return
        self.peers.remove(vpn_ip)
        self.allocator.release(vpn_ip)
        if record.pod_cidr is not None and self.pod_cidrs is not None and self.pod_cidrs.in_use(record.pod_cidr):
            self.pod_cidrs.release(record.pod_cidr)

    def to_dict(self) -> dict:
        out = {"allocator": self.allocator.to_dict(), "peers": self.peers.to_dict()}
        if self.pod_cidrs is not None:
            out["pod_cidrs"] = dict(self.pod_cidrs.to_dict(), reserved=dict(sorted(self.reserved_pod_cidrs.items())))
        return out

    @classmethod
    def from_dict(cls, data: Mapping) -> "PeerRegistry":
        reg = cls.__new__(cls)
        reg.allocator = VPNIPAllocator.from_dict(data["allocator"])
        reg.peers = VersionedPeerSet.from_dict(data["peers"])
        reg.pod_cidrs = None
        reg.reserved_pod_cidrs = {}
        for ip in reg.peers.peers:
            if not reg.allocator.in_use(ip):
                raise InputError("allocator", "every peer's VPN IP marked in use", ip)
        pods = data.get("pod_cidrs")
        if pods is not None:
            reg.pod_cidrs = PodCIDRAllocator.from_dict(pods, str(reg.allocator.cidr))
            reg.reserved_pod_cidrs = {str(ipaddress.ip_address(ip)): cidr for ip, cidr in dict(pods.get("reserved") or {}).items()}
            held = [r.pod_cidr for r in reg.peers.peers.values() if r.pod_cidr is not None]
            held += list(reg.reserved_pod_cidrs.values())
            for cidr in held:
                if not reg.pod_cidrs.in_use(cidr):
                    raise InputError("pod_cidrs", "every peer's pod CIDR marked in use", cidr)
            if len(set(held)) != len(held):
                raise InputError("pod_cidrs", "one peer per pod CIDR", sorted(c for c in held if held.count(c) > 1)[0])
        return reg
