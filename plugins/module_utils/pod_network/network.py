# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``PodNetwork``: a node's pod network as a whole - IPv4 forwarding (and, with br_netfilter loaded, bridged
traffic through the netfilter hooks, which kube-proxy's Service rules need), the nftables table, the bridge ``cni0``
with the node's gateway address, and the conflist the kubelet reads.

Conditions decide, operations do (the WireGuard pattern): ``read`` gathers the live state, ``changes`` (pure)
lists what differs from a ``PodNetworkSpec``, ``apply`` changes only that. Everything that can fail is checked
before the first change: the spec, the CNI plugins the conflist names, ``nft`` accepting the table
(``nft --check``). The order makes the node safe at every step: the drop rules are in place before the bridge
exists, and the conflist - what makes the kubelet start pods - comes last. ``remove`` goes the other way.

``cni0`` is made here rather than at the first pod, so the node's own pod CIDR is a connected route on ``cni0``
(more specific than ``cluster_pod_cidr dev wg0``) from the start, and the gateway answers peers before any pod
runs. The bridge plugin finds it as it would have made it.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import secrets
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.command import CommandRunner
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ExternalCommandError, InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import write_if_changed
from ansible_collections.constellation.cluster.plugins.module_utils.pod_network.cni import (
    CNI,
    CNI_PATH,
    load_conflist,
    result_addresses,
)
from ansible_collections.constellation.cluster.plugins.module_utils.pod_network.conflist import (
    BRIDGE,
    CONF_DIR,
    CONFLIST_MODE,
    CONFLIST_NAME,
    PLUGINS,
    PodNetworkSpec,
    dump_conflist,
    render_conflist,
)
from ansible_collections.constellation.cluster.plugins.module_utils.pod_network.nft import NFTables, render_table
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard.live import WireGuard

IP_FORWARD = "net.ipv4.ip_forward"
# With br_netfilter loaded: traffic bridged between two pods of the node passes the iptables/nftables hooks, so
# kube-proxy's Service rules (DNAT, and the masquerade of a pod reaching itself through a Service: hairpin) see it.
BRIDGE_NF = "net.bridge.bridge-nf-call-iptables"
PROBE_PREFIX = "cprobe-"
_PING_COUNTS = re.compile(r"(\d+) packets transmitted, (\d+) (?:packets )?received")


@dataclass(frozen=True)
class BridgeState:
    exists: bool
    kind: Optional[str] = None
    up: bool = False
    mtu: Optional[int] = None
    addresses: Tuple[str, ...] = ()


@dataclass(frozen=True)
class PodNetworkState:
    """What the host has now."""

    conflist: Optional[bytes]
    conflist_mode: Optional[int]
    table: Optional[str]
    bridge: BridgeState
    ip_forward: bool
    other_conflists: Tuple[str, ...] = field(default=())
    bridge_nf: Optional[bool] = None  # None: br_netfilter is not loaded (kubeadm's preflight asks for it)


def changes(spec: PodNetworkSpec, state: PodNetworkState, table_differs: bool) -> List[str]:
    """The steps that bring ``state`` to ``spec``, in the order they are taken."""
    steps = []
    if not state.ip_forward:
        steps.append("ip_forward")
    if state.bridge_nf is False:
        steps.append("bridge_nf_call_iptables")
    if table_differs:
        steps.append("nftables")
    bridge = state.bridge
    if not bridge.exists:
        steps += ["bridge", "bridge_mtu", "bridge_address", "bridge_up"]
    else:
        if bridge.mtu != spec.mtu:
            steps.append("bridge_mtu")
        if bridge.addresses != (spec.bridge_address,):
            steps.append("bridge_address")
        if not bridge.up:
            steps.append("bridge_up")
    if state.conflist != dump_conflist(render_conflist(spec)) or state.conflist_mode != CONFLIST_MODE:
        steps.append("conflist")
    return steps


class PodNetwork:
    """The pod network of one host. ``conf_dir``: where the runtime reads conflists; ``cni_path``: the plugins."""

    def __init__(self, runner: Optional[CommandRunner] = None, conf_dir: str = CONF_DIR, cni_path: str = CNI_PATH):
        self.runner = runner or CommandRunner()
        self.conf_dir = conf_dir
        self.cni_path = cni_path
        self.nft = NFTables(self.runner)
        self.cni = CNI(self.runner, cni_path)

    @property
    def conflist_path(self) -> str:
        return os.path.join(self.conf_dir, CONFLIST_NAME)

    # -- reading
    def bridge(self) -> BridgeState:
        link = WireGuard(self.runner).link(BRIDGE)  # ip's view of any link: exists, up, MTU, addresses
        if not link.exists:
            return BridgeState(exists=False)
        detail = self.runner.run(["ip", "-j", "-d", "link", "show", "dev", BRIDGE])
        try:
            kind = (json.loads(detail.stdout)[0].get("linkinfo") or {}).get("info_kind")
        except (ValueError, IndexError, AttributeError) as err:
            raise ExternalCommandError(list(detail.argv), 0, "unreadable output: %s" % err) from None
        return BridgeState(True, kind, link.up, link.mtu, link.addresses)

    def sysctl(self, name: str) -> Optional[str]:
        """The value of a kernel setting of the host's network namespace, None if the kernel has no such setting."""
        res = self.runner.run(["sysctl", "-n", name], check=False)
        return res.stdout.strip() if res.rc == 0 else None

    def read(self) -> PodNetworkState:
        try:
            with open(self.conflist_path, "rb") as handle:
                conflist = handle.read()
            mode = os.stat(self.conflist_path).st_mode & 0o7777
        except FileNotFoundError:
            conflist, mode = None, None
        try:
            names = sorted(os.listdir(self.conf_dir))
        except FileNotFoundError:
            names = []
        others = tuple(n for n in names if n.endswith((".conflist", ".conf", ".json")) and n < CONFLIST_NAME)
        bridge_nf = self.sysctl(BRIDGE_NF)
        return PodNetworkState(conflist, mode, self.nft.live(), self.bridge(), self.sysctl(IP_FORWARD) == "1", others,
                               None if bridge_nf is None else bridge_nf == "1")

    # -- changing
    def plan(self, spec: PodNetworkSpec) -> Tuple[PodNetworkState, List[str]]:
        """The live state and the steps ``apply`` would take; also runs every check that can fail."""
        self.cni.check_plugins(PLUGINS)
        table = render_table(spec)
        self.nft.check(table)
        state = self.read()
        if state.bridge.exists and state.bridge.kind != "bridge":
            raise StateError("%s exists but is a %s interface, not a bridge: remove it or free the name"
                             % (BRIDGE, state.bridge.kind or "non-bridge"))
        return state, changes(spec, state, self.nft.differs(table))

    def apply(self, spec: PodNetworkSpec, check_mode: bool = False) -> Tuple[PodNetworkState, List[str]]:
        state, steps = self.plan(spec)
        if check_mode:
            return state, steps
        run = self.runner.run
        if "ip_forward" in steps:
            run(["sysctl", "-q", "-w", "%s=1" % IP_FORWARD])
        if "bridge_nf_call_iptables" in steps:
            run(["sysctl", "-q", "-w", "%s=1" % BRIDGE_NF])
        if "nftables" in steps:
            self.nft.apply(render_table(spec))
        if "bridge" in steps:
            run(["ip", "link", "add", "name", BRIDGE, "type", "bridge"])
        if "bridge_mtu" in steps:
            run(["ip", "link", "set", "dev", BRIDGE, "mtu", str(spec.mtu)])
        if "bridge_address" in steps:
            for old in state.bridge.addresses:
                if old != spec.bridge_address:
                    run(["ip", "address", "delete", old, "dev", BRIDGE])
            if spec.bridge_address not in state.bridge.addresses:
                run(["ip", "address", "add", spec.bridge_address, "dev", BRIDGE])
        if "bridge_up" in steps:
            run(["ip", "link", "set", "dev", BRIDGE, "up"])
        if "conflist" in steps:
            os.makedirs(self.conf_dir, mode=0o755, exist_ok=True)
            write_if_changed(self.conflist_path, dump_conflist(render_conflist(spec)), CONFLIST_MODE)
        return state, steps

    def remove(self, check_mode: bool = False) -> Tuple[PodNetworkState, List[str]]:
        """Removes the conflist (no new pods), the bridge (with it every pod's host side) and the table."""
        state = self.read()
        steps = []
        if state.conflist is not None:
            steps.append("conflist")
        if state.bridge.exists and state.bridge.kind == "bridge":
            steps.append("bridge")
        if state.table is not None:
            steps.append("nftables")
        if check_mode:
            return state, steps
        if "conflist" in steps:
            os.unlink(self.conflist_path)
        if "bridge" in steps:
            self.runner.run(["ip", "link", "delete", "dev", BRIDGE])
        if "nftables" in steps:
            self.nft.delete()
        return state, steps

    # -- probing
    def probe(self, addresses: List[str], count: int = 3, wait: int = 2) -> dict:
        """A probe pod: a network namespace made through the node's conflist with the real plugins (CNI ADD, as
        the kubelet's runtime would), ``count`` pings to each address from inside it, then CNI DEL and the
        namespace removed, whatever happened. Returns the probe's address and, per address, packets sent and
        received and whether it answered."""
        targets = []
        for i, address in enumerate(addresses or []):
            try:
                targets.append(str(ipaddress.ip_address(address)))
            except ValueError:
                raise InputError("addresses[%d]" % i, "an IP address", address) from None
        if not targets:
            raise InputError("addresses", "a non-empty list of IP addresses to ping", addresses)
        for name, value in (("count", count), ("wait", wait)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 60:
                raise InputError(name, "an integer from 1 to 60", value)
        conflist = load_conflist(self.conflist_path)
        self.cni.check_plugins([p["type"] for p in conflist["plugins"]])
        name = PROBE_PREFIX + secrets.token_hex(4)
        netns = "/run/netns/%s" % name
        self.runner.run(["ip", "netns", "add", name])
        try:
            added = self.cni.add(conflist, name, netns)
            try:
                results = [self._ping(name, target, count, wait) for target in targets]
            finally:
                self.cni.delete(conflist, name, netns)
        finally:
            self.runner.run(["ip", "netns", "delete", name], check=False)
        return {"probe_address": (result_addresses(added) or [""])[0].split("/")[0], "results": results}

    def _ping(self, netns: str, target: str, count: int, wait: int) -> dict:
        res = self.runner.run(["ip", "netns", "exec", netns, "ping", "-n", "-q", "-c", str(count), "-W", str(wait),
                               target], check=False, timeout=count * (wait + 1) + 10)
        found = _PING_COUNTS.search(res.stdout)
        sent, received = (int(found.group(1)), int(found.group(2))) if found else (0, 0)
        return {"address": target, "reachable": received > 0, "transmitted": sent, "received": received}
