# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Peers and interfaces as wanted and as found, the difference between them, and the wg set/syncconf
renderings."""

from __future__ import annotations

import dataclasses
import ipaddress
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from ansible_collections.constellation.cluster.plugins.module_utils import encoding
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard.keys import (  # noqa: F401
    LISTEN_PORT,
    MTU,
    PERSISTENT_KEEPALIVE,
    VPN_CIDR,
    normalize_pub_key,
)


# --------------------------------------------------------------------------- peers


def _parse_endpoint(value: str, field_name: str) -> str:
    """``ip:port`` or ``[ipv6]:port`` -> canonical form. Host names are refused: the live state shows
    addresses, and a name would make every run look changed (and depend on DNS)."""
    expected = "an endpoint 'IP:port' or '[IPv6]:port' with a literal IP address"
    host, port = encoding.parse_endpoint(value if isinstance(value, str) else None, field_name)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise InputError(field_name, expected, value) from None
    return encoding.format_endpoint(address.compressed, port)


def _parse_vpn_ip(value: object, field_name: str, vpn_cidr: ipaddress.IPv4Network | ipaddress.IPv6Network) -> str:
    text = str(value) if value is not None else ""
    try:
        net = ipaddress.ip_network(text, strict=True)
    except ValueError:
        raise InputError(field_name, "an IP address or a /32 inside %s" % vpn_cidr, value) from None
    if net.num_addresses != 1:
        raise InputError(field_name, "a single address (/32)", value)
    address = net.network_address
    if address.version != vpn_cidr.version or address not in vpn_cidr:
        raise InputError(field_name, "an address inside the VPN CIDR %s" % vpn_cidr, value)
    if address in (vpn_cidr.network_address, vpn_cidr.broadcast_address):
        raise InputError(field_name, "a host address of %s (not network or broadcast)" % vpn_cidr, value)
    return str(address)


def parse_pod_cidr(value: object, field_name: str) -> str:
    """A peer's pod CIDR (docs/wireguard.md, "Pod CIDRs"): a network with no host bits set, never a default route."""
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        net = ipaddress.ip_network(value, strict=True)
    except ValueError:
        raise InputError(field_name, "a network with no host bits set, such as 10.244.1.0/24", value) from None
    if net.prefixlen == 0:
        raise InputError(field_name, "a network narrower than the default route", value)
    return str(net)


@dataclass(frozen=True)
class Peer:
    """One WireGuard peer as wanted: ``AllowedIPs`` is exactly ``<vpn_ip>/32``, plus the peer's ``pod_cidr``
    when it has one (docs/wireguard.md, "Pod CIDRs").

    ``endpoint`` None means "not known / roaming" (the admin has none): the live endpoint is then left
    as WireGuard learnt it.
    """

    pub_key: str
    vpn_ip: str
    endpoint: str | None = None
    persistent_keepalive: int = PERSISTENT_KEEPALIVE
    pod_cidr: str | None = None

    @property
    def allowed_ip_list(self) -> tuple[str, ...]:
        """The AllowedIPs, sorted as ``parse_dump`` sorts the live ones (the order does not matter to WireGuard)."""
        ips = ["%s/%d" % (self.vpn_ip, 128 if ":" in self.vpn_ip else 32)]
        if self.pod_cidr:
            ips.append(self.pod_cidr)
        return tuple(sorted(ips))

    @property
    def allowed_ips(self) -> str:
        """The AllowedIPs as ``wg set ... allowed-ips`` and ``wg setconf`` take them."""
        return ",".join(self.allowed_ip_list)

    def to_dict(self) -> dict:
        out = {
            "pub_key": self.pub_key,
            "vpn_ip": self.vpn_ip,
            "endpoint": self.endpoint,
            "persistent_keepalive": self.persistent_keepalive,
        }
        if self.pod_cidr:
            out["pod_cidr"] = self.pod_cidr
        return out


@dataclass(frozen=True)
class LivePeer:
    """A peer as ``wg show <if> dump`` reports it (the preshared key is dropped)."""

    pub_key: str
    endpoint: str | None
    allowed_ips: tuple[str, ...]
    latest_handshake: int
    transfer_rx: int
    transfer_tx: int
    persistent_keepalive: int

    def to_peer(self) -> Peer:
        """Best-effort view as a ``Peer`` (for diffs and reports): one host address is the VPN IP, one network
        beside it the pod CIDR; anything else shows as the joined list."""
        hosts = [a for a in self.allowed_ips if a.endswith(("/32", "/128"))]
        others = [a for a in self.allowed_ips if a not in hosts]
        if len(hosts) == 1 and len(others) <= 1:
            return Peer(self.pub_key, hosts[0].split("/")[0], self.endpoint, self.persistent_keepalive,
                        others[0] if others else None)
        return Peer(self.pub_key, ",".join(self.allowed_ips), self.endpoint, self.persistent_keepalive)


@dataclass(frozen=True)
class InterfaceState:
    """The live interface minus its private key."""

    name: str
    pub_key: str | None
    listen_port: int
    fwmark: int
    peers: Mapping[str, LivePeer] = field(default_factory=dict)

    def peer_list(self) -> list[Peer]:
        return [p.to_peer() for p in self.peers.values()]


@dataclass(frozen=True)
class PeerDiff:
    """What must change: ``changed`` holds the wanted (new) version of each peer changed in place."""

    added: tuple[Peer, ...] = ()
    removed: tuple[Peer, ...] = ()
    changed: tuple[Peer, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)

    def to_dict(self) -> dict:
        return {
            "added": [p.to_dict() for p in self.added],
            "removed": [p.to_dict() for p in self.removed],
            "changed": [p.to_dict() for p in self.changed],
        }


@dataclass(frozen=True)
class PeerRequest:
    """One validated entry of a peer list: the peer and whether it must be present."""

    peer: Peer
    present: bool = True


def parse_peer_list(
    items: Sequence[Mapping],
    vpn_cidr: str = VPN_CIDR,
    own_pub_key: str | None = None,
    exclusive: bool = False,
) -> list[PeerRequest]:
    """Validate a complete peer list before anything is touched.

    Each item: ``pub_key``, ``vpn_ip`` (address or /32), optional ``endpoint`` (IP:port),
    ``persistent_keepalive`` (seconds, 0 = off, default 10), ``pod_cidr`` (a network outside the VPN CIDR
    and every other peer's pod CIDR) and ``state`` (present/absent). Raises InputError naming ``peers[i].field``.
    """
    try:
        cidr = ipaddress.ip_network(vpn_cidr, strict=True)
    except ValueError:
        raise InputError("vpn_cidr", "a network such as 10.118.0.0/16", vpn_cidr) from None
    if not isinstance(items, (list, tuple)):
        raise InputError("peers", "a list of peers", type(items).__name__)
    if exclusive and not any((item or {}).get("state", "present") == "present" for item in items if isinstance(item, Mapping)):
        # An empty exclusive list would remove every peer: almost always a templating mistake.
        raise InputError("peers", "at least one present peer when exclusive is true (refusing to remove every peer)", len(items))
    own = normalize_pub_key(own_pub_key, "own pub_key") if own_pub_key else None
    result: list[PeerRequest] = []
    seen_keys: dict[str, int] = {}
    seen_ips: dict[str, int] = {}
    seen_pod_cidrs: list[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, int]] = []
    for index, item in enumerate(items):
        where = "peers[%d]" % index
        if not isinstance(item, Mapping):
            raise InputError(where, "a mapping with pub_key and vpn_ip", type(item).__name__)
        unknown = set(item) - {"pub_key", "vpn_ip", "endpoint", "persistent_keepalive", "pod_cidr", "state"}
        if unknown:
            raise InputError(where, "only pub_key, vpn_ip, endpoint, persistent_keepalive, pod_cidr, state", sorted(unknown))
        state = item.get("state", "present") or "present"
        if state not in ("present", "absent"):
            raise InputError(where + ".state", "present or absent", state)
        pub_key = normalize_pub_key(item.get("pub_key"), where + ".pub_key")
        if own is not None and pub_key == own:
            raise InputError(where + ".pub_key", "a key other than this interface's own public key", pub_key)
        if pub_key in seen_keys:
            raise InputError(where + ".pub_key", "a key not already used by peers[%d]" % seen_keys[pub_key], pub_key)
        seen_keys[pub_key] = index
        if state == "absent":
            # Removal is by key; a VPN IP given with it is checked but may be reused by a present
            # peer (a node replaced by a new key keeps its address).
            if item.get("vpn_ip") not in (None, ""):
                _parse_vpn_ip(item.get("vpn_ip"), where + ".vpn_ip", cidr)
            if item.get("pod_cidr") not in (None, ""):
                parse_pod_cidr(item.get("pod_cidr"), where + ".pod_cidr")
            result.append(PeerRequest(Peer(pub_key, ""), present=False))
            continue
        vpn_ip = _parse_vpn_ip(item.get("vpn_ip"), where + ".vpn_ip", cidr)
        if vpn_ip in seen_ips:
            raise InputError(where + ".vpn_ip", "an address not already used by peers[%d]" % seen_ips[vpn_ip], vpn_ip)
        seen_ips[vpn_ip] = index
        endpoint = item.get("endpoint")
        endpoint = _parse_endpoint(endpoint, where + ".endpoint") if endpoint not in (None, "") else None
        keepalive = item.get("persistent_keepalive", PERSISTENT_KEEPALIVE)
        if keepalive is None:
            keepalive = PERSISTENT_KEEPALIVE
        try:
            keepalive = int(keepalive)
        except (TypeError, ValueError):
            raise InputError(where + ".persistent_keepalive", "seconds between 0 and 65535", keepalive) from None
        if isinstance(item.get("persistent_keepalive"), bool) or not 0 <= keepalive <= 65535:
            raise InputError(where + ".persistent_keepalive", "seconds between 0 and 65535", item.get("persistent_keepalive"))
        pod_cidr = item.get("pod_cidr")
        if pod_cidr not in (None, ""):
            pod_cidr = parse_pod_cidr(pod_cidr, where + ".pod_cidr")
            net = ipaddress.ip_network(pod_cidr)
            if net.version == cidr.version and net.overlaps(cidr):
                raise InputError(where + ".pod_cidr", "a network not overlapping the VPN CIDR %s" % cidr, pod_cidr)
            for other, other_index in seen_pod_cidrs:
                if net.version == other.version and net.overlaps(other):
                    raise InputError(where + ".pod_cidr", "a network not overlapping peers[%d].pod_cidr %s"
                                     % (other_index, other), pod_cidr)
            seen_pod_cidrs.append((net, index))
        else:
            pod_cidr = None
        result.append(PeerRequest(Peer(pub_key, vpn_ip, endpoint, keepalive, pod_cidr), present=(state == "present")))
    return result


# --------------------------------------------------------------------------- conditions


def _peer_matches(wanted: Peer, live: LivePeer) -> bool:
    if tuple(sorted(live.allowed_ips)) != wanted.allowed_ip_list:
        return False
    if live.persistent_keepalive != wanted.persistent_keepalive:
        return False
    # A wanted endpoint of None leaves a learnt (roaming) endpoint alone.
    return wanted.endpoint is None or live.endpoint == wanted.endpoint


def diff_peers(requests: Iterable[PeerRequest], live: InterfaceState, exclusive: bool = False) -> PeerDiff:
    """Compare a validated peer list with the live interface.

    A present peer that exists with other settings is *changed* (updated in place: its session
    survives). A live peer is *removed* when it is marked absent, when ``exclusive`` and it is not
    listed, or when a wanted peer takes over one of its allowed IPs with a different key (the VPN IP
    was reassigned: peers are diffed by AllowedIPs, docs/wireguard.md).
    """
    added: list[Peer] = []
    changed: list[Peer] = []
    removed: dict[str, Peer] = {}
    wanted_keys: set[str] = set()
    wanted_ips: set[str] = set()
    for request in requests:
        peer = request.peer
        if not request.present:
            if peer.pub_key in live.peers:
                removed[peer.pub_key] = live.peers[peer.pub_key].to_peer()
            continue
        wanted_keys.add(peer.pub_key)
        wanted_ips.update(peer.allowed_ip_list)
        current = live.peers.get(peer.pub_key)
        if current is None:
            added.append(peer)
        elif not _peer_matches(peer, current):
            changed.append(peer)
    for key, current in live.peers.items():
        if key in wanted_keys or key in removed:
            continue
        if exclusive or wanted_ips.intersection(current.allowed_ips):
            removed[key] = current.to_peer()
    return PeerDiff(tuple(added), tuple(removed.values()), tuple(changed))


@dataclass(frozen=True)
class InterfaceSpec:
    """The interface as wanted. ``address`` is ``<vpn_ip>/<prefix>`` (``<vpn_ip>/16``, docs/wireguard.md, "Addresses and ports")."""

    name: str
    address: str
    listen_port: int = LISTEN_PORT
    mtu: int = MTU


@dataclass(frozen=True)
class LinkState:
    """What ``ip`` reports about the link."""

    exists: bool
    up: bool = False
    mtu: int | None = None
    addresses: tuple[str, ...] = ()


def validate_interface_name(name: str) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= 15 or any(c in name for c in "/ \t\n:") or name in (".", ".."):
        raise InputError("name", "an interface name of 1-15 characters without '/', ':' or spaces", name)
    return name


def parse_interface_spec(name: str, address: str, listen_port: int = LISTEN_PORT, mtu: int = MTU,
                         vpn_cidr: str | None = VPN_CIDR) -> InterfaceSpec:
    validate_interface_name(name)
    try:
        iface = ipaddress.ip_interface(address)
    except ValueError:
        raise InputError("address", "an address with prefix such as 10.118.0.11/16", address) from None
    if "/" not in str(address):
        raise InputError("address", "an address with prefix such as 10.118.0.11/16", address)
    if vpn_cidr:
        try:
            cidr = ipaddress.ip_network(vpn_cidr, strict=True)
        except ValueError:
            raise InputError("vpn_cidr", "a network such as 10.118.0.0/16", vpn_cidr) from None
        if iface.ip.version != cidr.version or iface.ip not in cidr:
            raise InputError("address", "an address inside the VPN CIDR %s" % cidr, address)
    if not 1 <= int(listen_port) <= 65535:
        raise InputError("listen_port", "a port between 1 and 65535", listen_port)
    if not 576 <= int(mtu) <= 65535:
        raise InputError("mtu", "an MTU between 576 and 65535", mtu)
    return InterfaceSpec(name, iface.with_prefixlen, int(listen_port), int(mtu))


def interface_changes(spec: InterfaceSpec, link: LinkState, wg: InterfaceState | None, pub_key: str | None) -> list[str]:
    """Names of the steps needed to bring the live interface to ``spec`` (empty: nothing to do).

    ``pub_key`` is the public key of the wanted private key (None: not known yet, e.g. the key file
    does not exist in check mode, so the key will be set).
    """
    if not link.exists:
        return ["create", "private_key", "listen_port", "address", "mtu", "up"]
    changes = []
    if wg is None or pub_key is None or wg.pub_key != pub_key:
        changes.append("private_key")
    if wg is None or wg.listen_port != spec.listen_port:
        changes.append("listen_port")
    if link.addresses != (spec.address,):
        changes.append("address")
    if link.mtu != spec.mtu:
        changes.append("mtu")
    if not link.up:
        changes.append("up")
    return changes


# --------------------------------------------------------------------------- rendering


def render_peers(peers: Iterable[Peer], listen_port: int | None = None) -> str:
    """The peers in ``wg setconf`` format, sorted by VPN IP. Never holds a private key (so it can be
    shown in diffs and logs); feed the key to ``wg`` separately as a file."""
    lines: list[str] = []
    if listen_port is not None:
        lines += ["[Interface]", "ListenPort = %d" % listen_port, ""]

    def order(peer: Peer):
        try:
            return (0, int(ipaddress.ip_address(peer.vpn_ip)), peer.pub_key)
        except ValueError:
            return (1, 0, peer.pub_key)

    for peer in sorted(peers, key=order):
        lines += ["[Peer]", "PublicKey = %s" % peer.pub_key, "AllowedIPs = %s" % peer.allowed_ips]
        if peer.endpoint:
            lines.append("Endpoint = %s" % peer.endpoint)
        if peer.persistent_keepalive:
            lines.append("PersistentKeepalive = %d" % peer.persistent_keepalive)
        lines.append("")
    return "\n".join(lines)


def apply_to_peers(current: Iterable[Peer], diff: PeerDiff) -> list[Peer]:
    """The peer list after ``diff`` (for the "after" side of a diff in check mode)."""
    by_key = {p.pub_key: p for p in current}
    for peer in diff.removed:
        by_key.pop(peer.pub_key, None)
    for peer in diff.changed:
        old = by_key.get(peer.pub_key)
        if peer.endpoint is None and old is not None:
            peer = dataclasses.replace(peer, endpoint=old.endpoint)
        by_key[peer.pub_key] = peer
    for peer in diff.added:
        by_key[peer.pub_key] = peer
    return list(by_key.values())


def wg_set_argv(name: str, diff: PeerDiff) -> list[str]:
    """One ``wg set`` call for the whole diff: additions and in-place changes first, removals last,
    so a reassigned VPN IP moves to its new key before the old key goes."""
    argv = ["wg", "set", name]
    for peer in list(diff.added) + list(diff.changed):
        argv += ["peer", peer.pub_key, "allowed-ips", peer.allowed_ips]
        if peer.endpoint:
            argv += ["endpoint", peer.endpoint]
        argv += ["persistent-keepalive", str(peer.persistent_keepalive) if peer.persistent_keepalive else "off"]
    for peer in diff.removed:
        argv += ["peer", peer.pub_key, "remove"]
    return argv
