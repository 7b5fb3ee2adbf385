# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A Coordinator's etcd member (``SharedStore``; docs/store.md, "Several Coordinators"): the port
``ClusterStoreMember`` (``PeerContext.etcd_member``, set by the agent) holds the cluster's state once the
Coordinator is activated. The first Coordinator starts a cluster of one and moves the cluster's keys there
(``start_first``); a restarted one rejoins from its data (``reopen``); the agent's loop starts a member that
died again (``supervise_etcd_member``); GetState reports it (``state_fields``). Further Coordinators join
through core/cluster.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict

from ansible_collections.constellation.cluster.plugins.module_utils.core.records import state_store
from ansible_collections.constellation.cluster.plugins.module_utils.core.records.node_state import NodeState
from ansible_collections.constellation.cluster.plugins.module_utils.errors import StateError

if TYPE_CHECKING:  # pragma: no cover
    from ansible_collections.constellation.cluster.plugins.module_utils.core.context import PeerContext


class SharedStore:
    """The etcd member's lifecycle over the peer's ``PeerContext``; nothing without a member."""

    def __init__(self, context: PeerContext):
        self.context = context

    def start_first(self, vpn_ip: str, kms: Any) -> None:
        """The first Coordinator: a new etcd cluster of one; the registry written so far moves there."""
        ctx = self.context
        if ctx.etcd_member is None:
            return
        ctx.etcd_member.start(vpn_ip, kms)
        cluster = ctx.etcd_member.open_store(vpn_ip)
        moved = state_store.move_cluster_keys(ctx.local_store, cluster)
        ctx.switch_to(cluster)
        ctx.log("etcd_member_started", vpn_ip=vpn_ip, cluster="new", keys_moved=moved)

    def reopen(self, node: NodeState) -> None:
        """A restarted Coordinator: WireGuard to the Coordinators it knew, then its member (which
        rejoins the cluster from its data), then the shared state."""
        ctx = self.context
        if ctx.etcd_member is None or not ctx.etcd_member.has_data():
            return
        ctx.vpn.set_peers(list(node.peers or ()), ctx.vpn_pub_key)
        ctx.etcd_member.start(node.vpn_ip, ctx.kms)
        ctx.switch_to(ctx.etcd_member.open_store(node.vpn_ip))
        ctx.log("etcd_member_started", vpn_ip=node.vpn_ip, cluster="restart")

    def supervise_etcd_member(self) -> bool:
        """The agent's loop: a member that died while the agent lives would leave the cluster one member
        short, unnoticed (this agent serves from memory). It starts again from its data and rejoins;
        a failed start raises and is tried again next round. True if it was started."""
        ctx = self.context
        if not ctx.shares_state() or ctx.etcd_member.running:
            return False
        ctx.log("etcd_member_exited", level="warning", vpn_ip=ctx.vpn_ip)
        if ctx.kms is None:
            raise StateError("etcd_member: the member cannot start again without the KMS (its TLS)")
        ctx.etcd_member.start(ctx.vpn_ip, ctx.kms)
        ctx.log("etcd_member_started", vpn_ip=ctx.vpn_ip, cluster="restart")
        return True

    def state_fields(self) -> Dict[str, Any]:
        """GetState's ``etcd_member`` ("running" or "stopped") for a Coordinator that shares the state in etcd."""
        if not self.context.shares_state():
            return {}
        return {"etcd_member": "running" if self.context.etcd_member.running else "stopped"}
