# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The VPN port's real adapter: the WireGuard Core (wireguard.py) as the agent uses it."""

from __future__ import annotations

import ipaddress
import threading
from typing import List, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.errors import StateError
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_record import PeerRecord
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import (
    LISTEN_PORT,
    VPN_CIDR,
    CommandRunner,
    PeerRequest,
    WireGuard,
    diff_peers,
    parse_interface_spec,
    pub_key_from_priv_key,
)


class WireGuardVPN:
    """One interface, a full peer list. Implements ``ports.VPN``."""

    def __init__(self, interface: str = "wg0", runner: Optional[CommandRunner] = None,
                 listen_port: int = LISTEN_PORT, vpn_cidr: str = VPN_CIDR):
        self.interface = interface
        self.listen_port = listen_port
        self.vpn_cidr = vpn_cidr
        self.wg = WireGuard(runner or CommandRunner())
        self._lock = threading.Lock()

    def setup(self, vpn_ip: str, priv_key: str, cluster_pod_cidr: Optional[str] = None) -> None:
        """The interface up; with ``cluster_pod_cidr``, one route of the whole pod range into it (docs/wireguard.md,
        "Pod CIDRs"): a pod CIDR no attested peer holds then ends in WireGuard, which drops it, instead of
        leaving by the default route in the clear."""
        # The private key reaches wg on its standard input, never a file: at rest it is only in the sealed store.
        prefix = ipaddress.ip_network(self.vpn_cidr).prefixlen
        spec = parse_interface_spec(self.interface, "%s/%d" % (vpn_ip, prefix), self.listen_port,
                                    vpn_cidr=self.vpn_cidr)
        with self._lock:
            self.wg.ensure_interface(spec, None, pub_key_from_priv_key(priv_key), priv_key=priv_key)
            if cluster_pod_cidr:
                self.wg.route(self.interface, cluster_pod_cidr)

    def teardown(self) -> bool:
        """Deletes the interface (a reset: ResetAgent); False if there was none."""
        with self._lock:
            if self.wg.show(self.interface) is None:
                return False
            self.wg.delete(self.interface)
        return True

    def set_peers(self, records: List[PeerRecord], own_pub_key: str) -> bool:
        """Makes the interface's peers exactly ``records`` (minus ourselves), changing in place."""
        wanted = [PeerRequest(r.to_peer(self.listen_port)) for r in records if r.vpn_pub_key != own_pub_key]
        with self._lock:
            live = self.wg.show(self.interface)
            if live is None:
                raise StateError("WireGuard interface %s does not exist" % self.interface)
            diff = diff_peers(wanted, live, exclusive=True)
            self.wg.apply_peer_diff(self.interface, diff)
        return bool(diff)
