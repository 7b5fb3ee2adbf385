# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The live interface: wg show dump parsing and the WireGuard operations through the one command runner
(module_utils/command.py)."""

from __future__ import annotations

import ipaddress
import json
import time
from typing import Iterable

from ansible_collections.constellation.cluster.plugins.module_utils.command import CommandRunner
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ExternalCommandError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard.keys import (  # noqa: F401
    WIREGUARD_GO_ENV,
)
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard.config import (  # noqa: F401
    InterfaceSpec,
    InterfaceState,
    LinkState,
    LivePeer,
    PeerDiff,
    interface_changes,
    wg_set_argv,
)


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

    def set_private_key(self, name: str, key_file: str | None, priv_key: str | None = None) -> None:
        # A file path, or the key on wg's standard input; never the key on a command line.
        if priv_key is not None:
            self.runner.run(["wg", "set", name, "private-key", "/dev/stdin"], stdin=priv_key + "\n")
        else:
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

    def route(self, name: str, network: str) -> None:
        """Routes ``network`` into the interface: ONE route for the cluster's pod range, never one per peer
        (docs/wireguard.md, "Pod CIDRs"). ``ip route replace`` is idempotent."""
        self.runner.run(["ip", "route", "replace", str(ipaddress.ip_network(network)), "dev", name])

    def ensure_interface(self, spec: InterfaceSpec, key_file: str | None, pub_key: str | None,
                         priv_key: str | None = None) -> list[str]:
        """Bring the interface to ``spec``; returns the steps taken (empty: already right). The private key
        comes from ``key_file`` or, kept in no file, ``priv_key`` (passed on wg's standard input)."""
        link = self.link(spec.name)
        live = self.show(spec.name) if link.exists else None
        if link.exists and live is None:
            raise StateError("%s exists but is not a WireGuard interface" % spec.name)
        changes = interface_changes(spec, link, live, pub_key)
        if "create" in changes:
            self.create(spec.name)
            link = self.link(spec.name)
        if "private_key" in changes:
            self.set_private_key(spec.name, key_file, priv_key)
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
