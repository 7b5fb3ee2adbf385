# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""WireGuard: keys, peer lists, the live state of an interface, and what must change.

Three layers, lowest first (the community.crypto ``luks_device`` pattern):

* ``CommandRunner``: the one place that runs programs (``wg``, ``ip``, ``wireguard-go``), with an
  optional argv prefix so tests can run everything inside a lab host's namespaces.
* ``WireGuard``: operations on one host (read ``wg show <if> dump``, create an interface, apply a
  ``PeerDiff`` with ``wg set``).
* conditions: pure functions that compare what is wanted with what is live (``diff_peers``,
  ``interface_changes``). They decide; the operations only do.

Peers are changed in place (``wg set <if> peer K endpoint ...``), never removed and re-added, so an
unrelated change never drops a live session. A peer list is always explicit and complete: it is never
derived from whatever hosts happen to be in a play. Everything is validated before anything is touched.

Private keys are generated on the host, stored in a 0600 file and handed to ``wg`` as a file path;
they never appear on a command line, in a rendered config, a diff or a log. ``wg show dump`` prints the
private key: the parser drops it on the first line it reads.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from ansible_collections.constellation.cluster.plugins.module_utils.command import (  # noqa: F401 pylint: disable=unused-import
    CommandResult,
    CommandRunner,
)
from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_write
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    ExternalCommandError,
    InputError,
    StateError,
)

try:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
except ImportError:  # pragma: no cover - reported by the modules via HAS_CRYPTOGRAPHY
    HAS_CRYPTOGRAPHY = False
else:
    HAS_CRYPTOGRAPHY = True

VPN_CIDR = "10.118.0.0/16"
LISTEN_PORT = 51820
PERSISTENT_KEEPALIVE = 10
MTU = 1420
KEY_FILE_MODE = 0o600
# wireguard-go refuses to start without this where no kernel module exists (ENVIRONMENT.md).
WIREGUARD_GO_ENV = {"WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD": "1"}


# --------------------------------------------------------------------------- keys


def _raw_private(priv_key: X25519PrivateKey) -> bytes:
    return priv_key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


def _raw_public(priv_key: X25519PrivateKey) -> bytes:
    return priv_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def generate_priv_key() -> str:
    """A new X25519 private key, std-base64 as ``wg genkey`` prints it."""
    return base64.b64encode(_raw_private(X25519PrivateKey.generate())).decode("ascii")


def key_bytes(key: str, field_name: str = "key") -> bytes:
    """Decode a std-base64 WireGuard key (44 characters, 32 bytes) or raise InputError."""
    if not isinstance(key, str):
        raise InputError(field_name, "a base64 WireGuard key (44 characters)", type(key).__name__)
    try:
        raw = base64.b64decode(key.strip(), validate=True)
    except (ValueError, TypeError):
        raw = b""
    if len(raw) != 32:
        # Never echo the value: this function also checks private keys.
        raise InputError(field_name, "a base64 WireGuard key (44 characters, 32 bytes)", "%d characters" % len(key))
    return raw


def pub_key_from_priv_key(priv_key: str) -> str:
    """The public key (std-base64) of a std-base64 private key, as ``wg pubkey`` prints it."""
    raw = key_bytes(priv_key, "priv_key")
    return base64.b64encode(_raw_public(X25519PrivateKey.from_private_bytes(raw))).decode("ascii")


def normalize_pub_key(pub_key: str, field_name: str = "pub_key") -> str:
    return base64.b64encode(key_bytes(pub_key, field_name)).decode("ascii")


@dataclass(frozen=True)
class KeyFileState:
    """What a private key file looks like, without its content."""

    exists: bool
    pub_key: str | None = None
    mode: int | None = None

    @property
    def mode_ok(self) -> bool:
        return self.mode == KEY_FILE_MODE


def read_key_file(path: str) -> KeyFileState:
    """Inspect a private key file; the key itself stays inside this function."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return KeyFileState(exists=False)
    with open(path, "r", encoding="ascii", errors="replace") as handle:
        content = handle.read().strip()
    try:
        pub_key = pub_key_from_priv_key(content)
    except InputError:
        raise InputError("private_key_file", "a file holding one base64 WireGuard private key", path) from None
    return KeyFileState(exists=True, pub_key=pub_key, mode=st.st_mode & 0o7777)


def ensure_key_file(path: str, check_mode: bool = False) -> tuple[KeyFileState, bool]:
    """Create the private key file if absent (on this host, never sent anywhere) and force mode 0600.

    Returns the state after the call and whether anything changed (or would, in check mode).
    """
    state = read_key_file(path)
    if state.exists and state.mode_ok:
        return state, False
    if check_mode:
        return state, True
    if not state.exists:
        atomic_write(path, (generate_priv_key() + "\n").encode("ascii"), KEY_FILE_MODE)
    else:
        os.chmod(path, KEY_FILE_MODE)
    return read_key_file(path), True


# --------------------------------------------------------------------------- peers


def _parse_endpoint(value: str, field_name: str) -> str:
    """``ip:port`` or ``[ipv6]:port`` -> canonical form. Host names are refused: the live state shows
    addresses, and a name would make every run look changed (and depend on DNS)."""
    expected = "an endpoint 'IP:port' or '[IPv6]:port' with a literal IP address"
    if not isinstance(value, str) or ":" not in value:
        raise InputError(field_name, expected, value)
    host, dummy_sep, port_text = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        address = ipaddress.ip_address(host)
        port = int(port_text)
    except ValueError:
        raise InputError(field_name, expected, value) from None
    if not 1 <= port <= 65535:
        raise InputError(field_name, "a port between 1 and 65535", value)
    if address.version == 6:
        return "[%s]:%d" % (address.compressed, port)
    return "%s:%d" % (address, port)


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


@dataclass(frozen=True)
class Peer:
    """One WireGuard peer as wanted: ``AllowedIPs`` is always exactly ``<vpn_ip>/32``.

    ``endpoint`` None means "not known / roaming" (the admin has none): the live endpoint is then left
    as WireGuard learnt it.
    """

    pub_key: str
    vpn_ip: str
    endpoint: str | None = None
    persistent_keepalive: int = PERSISTENT_KEEPALIVE

    @property
    def allowed_ips(self) -> str:
        return "%s/%d" % (self.vpn_ip, 128 if ":" in self.vpn_ip else 32)

    def to_dict(self) -> dict:
        return {
            "pub_key": self.pub_key,
            "vpn_ip": self.vpn_ip,
            "endpoint": self.endpoint,
            "persistent_keepalive": self.persistent_keepalive,
        }


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
        """Best-effort view as a ``Peer`` (for diffs and reports)."""
        vpn_ip = self.allowed_ips[0].split("/")[0] if len(self.allowed_ips) == 1 else ",".join(self.allowed_ips)
        return Peer(self.pub_key, vpn_ip, self.endpoint, self.persistent_keepalive)


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
    ``persistent_keepalive`` (seconds, 0 = off, default 10) and ``state`` (present/absent).
    Raises InputError naming ``peers[i].field``.
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
    for index, item in enumerate(items):
        where = "peers[%d]" % index
        if not isinstance(item, Mapping):
            raise InputError(where, "a mapping with pub_key and vpn_ip", type(item).__name__)
        unknown = set(item) - {"pub_key", "vpn_ip", "endpoint", "persistent_keepalive", "state"}
        if unknown:
            raise InputError(where, "only pub_key, vpn_ip, endpoint, persistent_keepalive, state", sorted(unknown))
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
        result.append(PeerRequest(Peer(pub_key, vpn_ip, endpoint, keepalive), present=(state == "present")))
    return result


# --------------------------------------------------------------------------- conditions


def _peer_matches(wanted: Peer, live: LivePeer) -> bool:
    if live.allowed_ips != (wanted.allowed_ips,):
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
    was reassigned: SPEC §6.6 diffs by AllowedIPs).
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
        wanted_ips.add(peer.allowed_ips)
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
    """The interface as wanted. ``address`` is ``<vpn_ip>/<prefix>`` (SPEC: ``<vpnIP>/16``)."""

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
            peer = Peer(peer.pub_key, peer.vpn_ip, old.endpoint, peer.persistent_keepalive)
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


# --------------------------------------------------------------------------- command seam


# --------------------------------------------------------------------------- operations


def parse_dump(name: str, text: str) -> InterfaceState:
    """Parse ``wg show <if> dump``. The first line's private key is discarded at once."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise ExternalCommandError(["wg", "show", name, "dump"], 0, "empty output")
    head = lines[0].split("\t")
    if len(head) != 4:
        raise ExternalCommandError(["wg", "show", name, "dump"], 0, "unexpected interface line (%d fields)" % len(head))
    pub_key = head[1] if head[1] != "(none)" else None
    listen_port = int(head[2])
    fwmark = 0 if head[3] == "off" else int(head[3], 0)
    del head
    peers: dict[str, LivePeer] = {}
    for line in lines[1:]:
        cols = line.split("\t")
        if len(cols) != 8:
            raise ExternalCommandError(["wg", "show", name, "dump"], 0, "unexpected peer line (%d fields)" % len(cols))
        allowed = tuple(sorted(a for a in cols[3].split(",") if a and a != "(none)"))
        peers[cols[0]] = LivePeer(
            pub_key=cols[0],
            endpoint=None if cols[2] == "(none)" else cols[2],
            allowed_ips=allowed,
            latest_handshake=int(cols[4]),
            transfer_rx=int(cols[5]),
            transfer_tx=int(cols[6]),
            persistent_keepalive=0 if cols[7] == "off" else int(cols[7]),
        )
    return InterfaceState(name=name, pub_key=pub_key, listen_port=listen_port, fwmark=fwmark, peers=peers)


class WireGuard:
    """Operations on the WireGuard interfaces of one host, through a ``CommandRunner``."""

    def __init__(self, runner: CommandRunner | None = None):
        self.runner = runner or CommandRunner()

    # -- reading
    def link(self, name: str) -> LinkState:
        res = self.runner.run(["ip", "-j", "address", "show", "dev", name], check=False)
        if res.rc != 0:
            if "does not exist" in res.stderr or "Cannot find device" in res.stderr:
                return LinkState(exists=False)
            raise ExternalCommandError(list(res.argv), res.rc, res.stderr)
        try:
            info = json.loads(res.stdout)[0]
        except (ValueError, IndexError) as err:
            raise ExternalCommandError(list(res.argv), 0, "unreadable output: %s" % err) from None
        addresses = tuple(sorted(
            "%s/%s" % (a["local"], a["prefixlen"]) for a in info.get("addr_info", []) if a.get("scope") != "link"
        ))
        return LinkState(exists=True, up="UP" in info.get("flags", []), mtu=info.get("mtu"), addresses=addresses)

    def show(self, name: str) -> InterfaceState | None:
        """The live WireGuard state, or None if ``name`` is no WireGuard interface (yet)."""
        res = self.runner.run(["wg", "show", name, "dump"], check=False)
        if res.rc != 0:
            return None
        return parse_dump(name, res.stdout)

    # -- interface
    def create(self, name: str) -> str:
        """Create the interface: kernel WireGuard where available, else wireguard-go. Returns which."""
        kernel = self.runner.run(["ip", "link", "add", "dev", name, "type", "wireguard"], check=False)
        if kernel.rc == 0:
            return "kernel"
        self.runner.run(["wireguard-go", name], env=WIREGUARD_GO_ENV, new_session=True)
        # wireguard-go daemonises before its UAPI socket is ready: wait for it, bounded.
        for dummy_attempt in range(100):
            if self.show(name) is not None:
                return "wireguard-go"
            time.sleep(0.05)
        raise StateError("wireguard-go started but %s did not appear within 5 s" % name)

    def delete(self, name: str) -> None:
        self.runner.run(["ip", "link", "delete", "dev", name])

    def set_private_key(self, name: str, key_file: str) -> None:
        # A file path, never the key on a command line.
        self.runner.run(["wg", "set", name, "private-key", key_file])

    def set_listen_port(self, name: str, port: int) -> None:
        self.runner.run(["wg", "set", name, "listen-port", str(port)])

    def set_address(self, name: str, address: str, current: Iterable[str]) -> None:
        for old in current:
            if old != address:
                self.runner.run(["ip", "address", "delete", old, "dev", name])
        if address not in current:
            self.runner.run(["ip", "address", "add", address, "dev", name])

    def set_mtu(self, name: str, mtu: int) -> None:
        self.runner.run(["ip", "link", "set", "dev", name, "mtu", str(mtu)])

    def set_up(self, name: str) -> None:
        self.runner.run(["ip", "link", "set", "dev", name, "up"])

    def ensure_interface(self, spec: InterfaceSpec, key_file: str, pub_key: str | None) -> list[str]:
        """Bring the interface to ``spec``; returns the steps taken (empty: already right)."""
        link = self.link(spec.name)
        live = self.show(spec.name) if link.exists else None
        if link.exists and live is None:
            raise StateError("%s exists but is not a WireGuard interface" % spec.name)
        changes = interface_changes(spec, link, live, pub_key)
        if "create" in changes:
            self.create(spec.name)
            link = self.link(spec.name)
        if "private_key" in changes:
            self.set_private_key(spec.name, key_file)
        if "listen_port" in changes:
            self.set_listen_port(spec.name, spec.listen_port)
        if "address" in changes:
            self.set_address(spec.name, spec.address, link.addresses)
        if "mtu" in changes:
            self.set_mtu(spec.name, spec.mtu)
        if "up" in changes:
            self.set_up(spec.name)
        return changes

    # -- peers
    def apply_peer_diff(self, name: str, diff: PeerDiff) -> None:
        """Apply a diff with one ``wg set``: unchanged peers are not mentioned, changed peers are
        updated in place, so no live session is dropped by an unrelated change."""
        if diff:
            self.runner.run(wg_set_argv(name, diff))
