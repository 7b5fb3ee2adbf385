# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The VPN port's real adapter: the WireGuard Core (wireguard.py) as the agent uses it.

While a cluster grows, every Node applies an update per newly added peer and the Coordinator one per
Node it adds, so ``set_peers`` runs O(n) times per host. Reading the interface (``wg show dump``)
each time doubled the programs spawned and made wireguard-go serialize every peer for every update.
The adapter therefore keeps the peers it applied last and diffs against those (one ``wg set`` per
change, nothing spawned when nothing changed). It reads the interface again, and so repairs a change
made from outside, when its view may be stale: on the first call, after ``setup``, after any failure,
and when the last read is ``reconcile_interval`` seconds old.
"""

from __future__ import annotations

import ipaddress
import threading
import time
from typing import Callable, Dict, List, Optional

from ansible_collections.constellation.cluster.plugins.module_utils import kms as kms_mod
from ansible_collections.constellation.cluster.plugins.module_utils.errors import StateError
from ansible_collections.constellation.cluster.plugins.module_utils.peers import PeerRecord
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import (
    LISTEN_PORT,
    VPN_CIDR,
    CommandRunner,
    InterfaceState,
    LivePeer,
    PeerDiff,
    PeerRequest,
    WireGuard,
    diff_peers,
    parse_interface_spec,
    pub_key_from_priv_key,
)

# Seconds after which set_peers reads the live interface again instead of trusting what it applied.
RECONCILE_INTERVAL = 10.0


def _after(view: InterfaceState, diff: PeerDiff) -> InterfaceState:
    """The interface as it is once ``diff`` is applied to ``view`` (what ``wg set`` does: an added or
    changed peer gets exactly its allowed IP and keepalive; no endpoint keeps the one it had)."""
    peers: Dict[str, LivePeer] = dict(view.peers)
    for peer in diff.removed:
        peers.pop(peer.pub_key, None)
    for peer in list(diff.added) + list(diff.changed):
        old = peers.get(peer.pub_key)
        endpoint = peer.endpoint or (old.endpoint if old is not None else None)
        peers[peer.pub_key] = LivePeer(peer.pub_key, endpoint, (peer.allowed_ips,), 0, 0, 0,
                                       peer.persistent_keepalive)
    return InterfaceState(view.name, view.pub_key, view.listen_port, view.fwmark, peers)


class WireGuardVPN:
    """One interface, a full peer list. Implements ``ports.VPN``."""

    def __init__(self, interface: str = "wg0", key_file: str = "wg0.key", runner: Optional[CommandRunner] = None,
                 listen_port: int = LISTEN_PORT, vpn_cidr: str = VPN_CIDR,
                 reconcile_interval: float = RECONCILE_INTERVAL, clock: Callable[[], float] = time.monotonic):
        self.interface = interface
        self.key_file = key_file
        self.listen_port = listen_port
        self.vpn_cidr = vpn_cidr
        self.reconcile_interval = reconcile_interval
        self.wg = WireGuard(runner or CommandRunner())
        self._clock = clock
        self._lock = threading.Lock()
        # The peers as we last made them; None: unknown (read the interface before the next change).
        self._view: Optional[InterfaceState] = None
        self._read_at = 0.0

    def setup(self, vpn_ip: str, priv_key: str) -> None:
        kms_mod.write_secret_file(self.key_file, priv_key.encode("ascii") + b"\n")
        prefix = ipaddress.ip_network(self.vpn_cidr).prefixlen
        spec = parse_interface_spec(self.interface, "%s/%d" % (vpn_ip, prefix), self.listen_port,
                                    vpn_cidr=self.vpn_cidr)
        with self._lock:
            self._view = None  # the interface may have been (re)created
            self.wg.ensure_interface(spec, self.key_file, pub_key_from_priv_key(priv_key))

    def set_peers(self, records: List[PeerRecord], own_pub_key: str) -> bool:
        """Makes the interface's peers exactly ``records`` (minus ourselves), changing in place."""
        wanted = [PeerRequest(r.to_peer(self.listen_port)) for r in records if r.vpn_pub_key != own_pub_key]
        with self._lock:
            view, now = self._view, self._clock()
            if view is None or now - self._read_at >= self.reconcile_interval:
                self._view = None
                view = self.wg.show(self.interface)
                if view is None:
                    raise StateError("WireGuard interface %s does not exist" % self.interface)
                self._read_at = now
            diff = diff_peers(wanted, view, exclusive=True)
            if diff:
                self._view = None  # a failed wg set leaves the interface unknown
                self.wg.apply_peer_diff(self.interface, diff)
                view = _after(view, diff)
            self._view = view
        return bool(diff)
