# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A peer's persisted node state, typed. ``to_dict``/``from_dict`` give the store's format
(``state_store.save_node_state``: base64 for bytes, the same keys as before this class existed):

* both roles: ``role, vpn_ip, vpn_priv_key, cluster_id, measurement_salt, admin_pub_key,
  coordinator_vpn_ip, disk_uuid, state``, and with the pod network ``cluster_pod_cidr, pod_cidr``;
* Coordinator: ``cluster_name``; Node: ``coordinator_vpn_pub_key`` (may be null), ``peers``,
  ``resource_version``;
* any other key is kept as it was read (``extra``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.core.inputs import (
    CLUSTER_ID_LENGTH,
    MEASUREMENT_SALT_LENGTH,
    b64,
    b64d,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.state import ROLE_NODE, State
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_record import PeerRecord
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import parse_pod_cidr

_KNOWN = ("role", "vpn_ip", "vpn_priv_key", "cluster_id", "measurement_salt", "admin_pub_key", "coordinator_vpn_ip",
          "disk_uuid", "state", "cluster_name", "coordinator_vpn_pub_key", "peers", "resource_version",
          "coordinator_pub_key", "cluster_pod_cidr", "pod_cidr")


@dataclass(frozen=True)
class NodeState:
    role: str
    vpn_ip: str
    vpn_priv_key: str  # WireGuard private key, base64 as WireGuard writes it
    cluster_id: bytes
    measurement_salt: bytes
    admin_pub_key: Optional[str] = None
    coordinator_vpn_ip: Optional[str] = None
    disk_uuid: Optional[str] = None
    state: Optional[int] = None  # None: a state saved before states were stored (IsNode)
    cluster_name: Optional[str] = None
    coordinator_vpn_pub_key: Optional[str] = None
    peers: Optional[Tuple[PeerRecord, ...]] = None  # a Node's copy of the peer list
    resource_version: Optional[int] = None  # of ``peers``
    # A Node's pinned Coordinator signing key (core/signing.py): rejoin tickets and peer updates must verify with it.
    coordinator_pub_key: Optional[str] = None
    # The pod network (docs/wireguard.md, "Pod CIDRs"): the cluster's pod range (routed into wg0) and this peer's own
    # pod CIDR, as its activation gave them; None without the pod network.
    cluster_pod_cidr: Optional[str] = None
    pod_cidr: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict)

    @property
    def stored_state(self) -> State:
        return State(int(self.state)) if self.state is not None else State.IS_NODE

    def replace(self, **changes: Any) -> "NodeState":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> Dict[str, Any]:
        out = dict(self.extra)
        out.update(role=self.role, vpn_ip=self.vpn_ip, vpn_priv_key=self.vpn_priv_key, cluster_id=b64(self.cluster_id),
                   measurement_salt=b64(self.measurement_salt))
        for name in ("admin_pub_key", "coordinator_vpn_ip", "disk_uuid", "state", "cluster_name",
                     "resource_version", "coordinator_pub_key", "cluster_pod_cidr", "pod_cidr"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.role == ROLE_NODE or self.coordinator_vpn_pub_key is not None:
            out["coordinator_vpn_pub_key"] = self.coordinator_vpn_pub_key
        if self.peers is not None:
            out["peers"] = [p.to_dict() for p in self.peers]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "NodeState":
        """A stored node state (as ``state_store.load_node_state`` checked it); InputError names a bad field."""
        if not isinstance(data, Mapping):
            raise InputError("node_state", "a mapping", type(data).__name__)
        for name in ("role", "vpn_ip", "vpn_priv_key"):
            if not isinstance(data.get(name), str):
                raise InputError("node_state." + name, "a string")
        peers = data.get("peers")
        if peers is not None:
            if not isinstance(peers, list):
                raise InputError("node_state.peers", "a list", type(peers).__name__)
            peers = tuple(PeerRecord.from_dict(p) for p in peers)
        for name in ("state", "resource_version"):
            value = data.get(name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise InputError("node_state." + name, "an integer", value)
        for name in ("cluster_pod_cidr", "pod_cidr"):
            if data.get(name) is not None:
                parse_pod_cidr(data[name], "node_state." + name)
        return cls(role=data["role"], vpn_ip=data["vpn_ip"], vpn_priv_key=data["vpn_priv_key"],
                   cluster_id=b64d(data.get("cluster_id"), "node_state.cluster_id", CLUSTER_ID_LENGTH),
                   measurement_salt=b64d(data.get("measurement_salt"), "node_state.measurement_salt",
                                         MEASUREMENT_SALT_LENGTH),
                   admin_pub_key=data.get("admin_pub_key"), coordinator_vpn_ip=data.get("coordinator_vpn_ip"),
                   disk_uuid=data.get("disk_uuid"), state=data.get("state"), cluster_name=data.get("cluster_name"),
                   coordinator_vpn_pub_key=data.get("coordinator_vpn_pub_key"), peers=peers,
                   resource_version=data.get("resource_version"), coordinator_pub_key=data.get("coordinator_pub_key"),
                   cluster_pod_cidr=data.get("cluster_pod_cidr"), pod_cidr=data.get("pod_cidr"),
                   extra={k: v for k, v in data.items() if k not in _KNOWN})
