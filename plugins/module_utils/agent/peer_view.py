# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the RPC servers ask about this peer before a handler runs (rpc/access.py ``PeerView``), read from the
Core: its state, whether an admin key is pinned, whether a PeerAuth'd caller is still the registered, non-evicted
peer, whether it is a designated control plane. The agent's wiring gives one to each ``FrameServer``
(``peer_view=CorePeerView(core)``); the server imports neither the Core nor the agent."""

from __future__ import annotations

from ansible_collections.constellation.cluster.plugins.module_utils.core.state import ACTIVATED, State
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AccessDenied
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.access import PeerView


class CorePeerView(PeerView):
    """``core``: a ``core.Core`` (its context, peer_access, evictions and kubernetes services)."""

    def __init__(self, core):
        self.core = core

    def state(self) -> str:
        return self.core.context.state.wire_name

    def admin_key_pinned(self) -> bool:
        ctx = self.core.context
        if ctx.state in ACTIVATED or ctx.state == State.NODE_WAITING_FOR_CLUSTER_JOIN:
            return True
        # A rebooted peer that holds a cluster's state and waits for Recover or its rejoin (PCR 15 reset).
        return bool(ctx.recovery_pending) and ctx.admin_pub_key() is not None

    def check_not_evicted(self, method: str, peer_ip: str) -> None:
        self.core.evictions.require_not_evicted(peer_ip, method)

    def check_peer(self, method: str, peer_ip: str, vpn_pub_key: str) -> None:
        """An eviction or a removal may come while a connection is open: every request looks again (from memory)."""
        self.check_not_evicted(method, peer_ip)
        record = self.core.peer_access.vpn_peer_record(peer_ip)
        if record is None or record.vpn_pub_key != vpn_pub_key:
            raise AccessDenied("%s: %s is no longer the peer that authenticated this connection" % (method, peer_ip))

    def check_verified(self, method: str, peer_ip: str) -> None:
        self.core.evictions.require_verified(peer_ip, method)

    def check_control_plane(self, method: str, peer_ip: str, vpn_pub_key: str) -> None:
        self.core.kubernetes.require_designated_control_plane(peer_ip, vpn_pub_key, method)
