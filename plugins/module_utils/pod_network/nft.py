# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node's nftables table ``inet constellation_pod_network``, rendered from a ``PodNetworkSpec`` and applied
in one ``nft -f`` transaction (the table is replaced whole or not at all).

* ``forward`` and ``output``: a packet to the cluster's pod range that would leave by any interface other than
  ``wg0``, ``cni0`` or ``lo`` is dropped (and counted). A pod CIDR no attested peer holds has no WireGuard peer,
  so the one route ``cluster_pod_cidr dev wg0`` ends in WireGuard's drop; should that route be missing (the agent
  down, an operator's change), the default route would carry pod traffic out in the clear: this rule stops it.
  With ``br_netfilter`` (kube-proxy), a packet bridged between two pods of the node shows ``cni0`` as its output
  interface, so it passes.
* ``postrouting`` (when ``masquerade``): pod traffic from this node's pod CIDR to anything outside the cluster's
  pod range and the VPN CIDR is masqueraded (pod egress to the Internet or to the node's own network); pod to
  pod traffic keeps its addresses.

The live table is compared with the rendered one after both are normalised (no counters, no blank lines, the
elements of anonymous sets sorted: the kernel lists them in its own order).
"""

from __future__ import annotations

import re
from typing import List, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.command import CommandRunner
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ExternalCommandError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.pod_network.conflist import BRIDGE, PodNetworkSpec

FAMILY, TABLE = "inet", "constellation_pod_network"
VPN_INTERFACE = "wg0"
PACKAGE = "nftables"
# What normalize() drops and sorts: a rule's counter values, the elements of an anonymous set.
_COUNTER, _SET = re.compile(r"counter packets \d+ bytes \d+"), re.compile(r"\{ ([^{}]*) \}")


def render_table(spec: PodNetworkSpec) -> str:
    """The table as ``nft list table`` prints it (tabs, one rule a line)."""
    allowed = '{ "%s", "%s", "lo" }' % (VPN_INTERFACE, BRIDGE)
    drop = ('\t\tip daddr %s oifname != %s counter drop comment "pod range only via %s"'
            % (spec.cluster_pod_cidr, allowed, VPN_INTERFACE))
    lines = ["table %s %s {" % (FAMILY, TABLE)]
    for chain in ("forward", "output"):
        lines += ["\tchain %s {" % chain, "\t\ttype filter hook %s priority filter; policy accept;" % chain,
                  drop, "\t}"]
    if spec.masquerade:
        lines += ["\tchain postrouting {", "\t\ttype nat hook postrouting priority srcnat; policy accept;",
                  "\t\tip saddr %s ip daddr != { %s, %s } counter masquerade comment \"pod egress\""
                  % (spec.pod_cidr, spec.cluster_pod_cidr, spec.vpn_cidr), "\t}"]
    lines.append("}")
    return "\n".join(lines) + "\n"


def replace_script(table: str) -> str:
    """One transaction that replaces the table whatever is there: create it (a no-op if it exists), delete it,
    then create it as wanted."""
    return "table %s %s\ndelete table %s %s\n%s" % (FAMILY, TABLE, FAMILY, TABLE, table)


def delete_script() -> str:
    return "table %s %s\ndelete table %s %s\n" % (FAMILY, TABLE, FAMILY, TABLE)


def normalize(text: Optional[str]) -> List[str]:
    """The table's lines without counters, indentation and blank lines, anonymous sets sorted."""
    if not text:
        return []
    out = []
    for line in text.splitlines():
        line = _COUNTER.sub("counter", line.strip())
        line = _SET.sub(lambda m: "{ %s }" % ", ".join(sorted(e.strip() for e in m.group(1).split(","))), line)
        if line:
            out.append(line)
    return out


class NFTables:
    """The table on one host, through a ``CommandRunner``."""

    def __init__(self, runner: Optional[CommandRunner] = None):
        self.runner = runner or CommandRunner()

    def _nft(self, argv: List[str], stdin: Optional[str] = None, check: bool = True):
        res = self.runner.run(["nft"] + argv, check=False, stdin=stdin)
        if res.rc == 127 and not res.stdout:
            raise StateError("nft: not found (Debian's %s installs it): %s" % (PACKAGE, res.stderr.strip()))
        if check and res.rc != 0:
            raise ExternalCommandError(["nft"] + argv, res.rc, res.stderr)
        return res

    def live(self) -> Optional[str]:
        """The live table as nft lists it, or None when there is none."""
        res = self._nft(["list", "table", FAMILY, TABLE], check=False)
        if res.rc != 0:
            if "No such file or directory" in res.stderr or "does not exist" in res.stderr:
                return None
            raise ExternalCommandError(["nft", "list", "table", FAMILY, TABLE], res.rc, res.stderr)
        return res.stdout

    def counters(self) -> dict:
        """Per chain, the packets its rules counted (``{"forward": 3, ...}``): how many were dropped or masqueraded."""
        out = {}
        chain = None
        for line in (self.live() or "").splitlines():
            found = re.match(r"\s*chain (\S+) \{", line)
            if found:
                chain = found.group(1)
            packets = re.search(r"counter packets (\d+)", line)
            if packets and chain:
                out[chain] = out.get(chain, 0) + int(packets.group(1))
        return out

    def check(self, table: str) -> None:
        """``nft --check``: the kernel and nft accept the table; nothing is changed."""
        self._nft(["--check", "-f", "-"], stdin=replace_script(table))

    def apply(self, table: str) -> None:
        self._nft(["-f", "-"], stdin=replace_script(table))

    def delete(self) -> None:
        self._nft(["-f", "-"], stdin=delete_script())

    def differs(self, table: str) -> bool:
        return normalize(self.live()) != normalize(table)
