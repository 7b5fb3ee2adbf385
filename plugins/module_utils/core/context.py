# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What every service of a peer's Core shares (``PeerContext``): its ports (store, TPM, VPN, KMS), the
node lock, the state machine, the persisted node state and the few accessors all sides read. The
services (``coordinator``, ``activation``, ``cluster``, ``node``, ``peer_trust``, ``recovery``, ...)
hold one ``PeerContext`` each; nothing here decides anything beyond state checks and persistence."""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Dict, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import deployment
from ansible_collections.constellation.cluster.plugins.module_utils.core.records import state_store
from ansible_collections.constellation.cluster.plugins.module_utils.core.at_rest import PlainStorage, SealedStorage
from ansible_collections.constellation.cluster.plugins.module_utils.core.inputs import (
    ip,
    normalize_disk_uuid,
    parse_admin_pub_key,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.lock import NodeLock
from ansible_collections.constellation.cluster.plugins.module_utils.core.records.node_state import NodeState
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.cache import PeerRegistryCache
from ansible_collections.constellation.cluster.plugins.module_utils.core.ports import KMS, TPM, VPN, Store
from ansible_collections.constellation.cluster.plugins.module_utils.core.state import State, StateMachine
from ansible_collections.constellation.cluster.plugins.module_utils.errors import StateError
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import pub_key_from_priv_key

STATE_DISK_KEY_FILE = "state_disk.key"


class PeerContext(StateMachine):
    """One peer's shared state. Thread-safe: ``mutex`` (the state machine's) guards the node state."""

    def __init__(self, store: Store, tpm: TPM, vpn: VPN, state_dir: str, public_ip: str,
                 disk_uuid: str, log: Optional[Callable[..., None]] = None,
                 kubeadm_join_args: Optional[Callable[[], Dict[str, Any]]] = None,
                 init_secret_hash: Optional[str] = None, at_rest: Optional[SealedStorage] = None, *,
                 join_coordinator_pub_key: Optional[str] = None, agent_measurement: Optional[Dict[str, Any]] = None,
                 deployment_mode: Optional[str] = None, state_disk: Optional[Any] = None,
                 etcd_member: Optional[Any] = None):
        super().__init__(log)
        # The secrets this peer keeps in files (core/at_rest.py): sealed to its TPM by the agent.
        self.at_rest = at_rest if at_rest is not None else PlainStorage()
        self.agent_measurement = agent_measurement  # attestation/agent_measurement.py, from the agent
        self.deployment_mode = deployment_mode or deployment.DEFAULT  # attestation/deployment.py, from the agent
        # hex SHA-256 of this node's init secret (init_secret.py): activation needs its proof. None: any caller
        # may activate this node (as before; the agent logs a warning).
        self.init_secret_hash = init_secret_hash
        self.init_secret: Optional[bytes] = None  # the Coordinator's copy of the cluster's init secret
        # A node that joins by itself: the Coordinators' signing key from its agent config (core/signing.py);
        # join tickets must verify with it. Activated Nodes pin theirs in their node state.
        self.join_coordinator_pub_key = join_coordinator_pub_key
        # ``store`` holds everything while the cluster's state is local; a Coordinator that runs an etcd
        # member (``etcd_member``, core/shared_store.py) moves the cluster's keys there and ``store``
        # becomes that cluster; ``local_store`` keeps what is this peer's own (state_store.LOCAL_KEYS).
        self.store = store
        self.local_store = store
        self.etcd_member = etcd_member  # ports.ClusterStoreMember, from the agent config
        self.tpm = tpm
        self.vpn = vpn
        self.state_dir = state_dir
        self.public_ip = ip(public_ip, "public_ip")
        self.disk_uuid = normalize_disk_uuid(disk_uuid)
        self.kubeadm_join_args = kubeadm_join_args
        self.lock = NodeLock(tpm)
        self.node: Optional[NodeState] = None  # the persisted node state (no secrets beyond the store's)
        self.kms: Optional[KMS] = None
        # The Coordinator's peer registry: read from memory, written through the store (peer_cache.py).
        self.peer_registry = PeerRegistryCache(store)
        self.peers_apply_lock = threading.Lock()  # the Coordinator applies registry peers one at a time
        self.recovery_pending = False
        # The encrypted state disk (ports.StateDiskPort, from the agent with state_disk_device); None: the state
        # is not on an encrypted disk, and GetState says so.
        self.state_disk = state_disk

    # -- the cluster's store
    def switch_to(self, cluster: Any) -> None:
        """The cluster's state now lives in ``cluster`` (an etcd member's store, core/shared_store.py)."""
        self.store = cluster
        self.peer_registry = PeerRegistryCache(cluster, shared=True)

    def shares_state(self) -> bool:
        """An activated Coordinator whose cluster state lives in its etcd member."""
        return self.etcd_member is not None and self.state == State.ACTIVATING_NODES and self.store is not self.local_store

    def require_coordinator(self, method: str) -> KMS:
        """This peer is an activated Coordinator: its KMS, or StateError."""
        self.require_state(method, State.ACTIVATING_NODES)
        if self.kms is None:
            raise StateError("%s: this Coordinator has no KMS" % method)
        return self.kms

    # -- accessors
    @property
    def node_state(self) -> Dict[str, Any]:
        """The persisted node state in the store's format (``{}`` before activation)."""
        node = self.node
        return node.to_dict() if node is not None else {}

    def stored_node(self) -> NodeState:
        node = self.node
        if node is None:
            raise StateError("this node holds no cluster state")
        return node

    @property
    def vpn_pub_key(self) -> str:
        return pub_key_from_priv_key(self.stored_node().vpn_priv_key)

    @property
    def vpn_ip(self) -> Optional[str]:
        return self.node.vpn_ip if self.node is not None else None

    @property
    def coordinator_vpn_ip(self) -> Optional[str]:
        return self.node.coordinator_vpn_ip if self.node is not None else None

    @property
    def cluster_id(self) -> Optional[bytes]:
        return self.node.cluster_id if self.node is not None else None

    @property
    def resource_version(self) -> int:
        node = self.node
        return int(node.resource_version) if node is not None and node.resource_version is not None else -1

    def admin_pub_key(self):
        text = self.node.admin_pub_key if self.node is not None else None
        return parse_admin_pub_key(text) if text else None

    # -- persistence
    def save_node(self, node: Optional[NodeState] = None, **changes: Any) -> None:
        """Persists ``node`` (or the current node state with ``changes``), then makes it current."""
        with self.mutex:
            if node is None:
                node = self.stored_node().replace(**changes)
            state_store.save_node_state(self.local_store, node.to_dict())
            self.node = node

    def keep_disk_key(self, key: bytes, first: bool = True) -> None:
        """The disk key arrived (activation, join: ``first``; rejoin: not): kept at rest (``write_disk_key``),
        then, with a state disk, the disk is formatted (first only), opened and mounted and the store moved onto
        it (disk/attach.py). A refusal raises: the activation fails, naming the disk."""
        self.write_disk_key(key)
        if self.state_disk is not None:
            self.state_disk.key_arrived(key, self.disk_uuid, first)

    def take_lock(self, cluster_id: bytes, method: str, before_extend: Optional[Callable[[], None]] = None) -> None:
        if not self.lock.try_lock_once(cluster_id, before_extend):
            raise StateError("%s: the node lock is already taken (another activation is running or done)" % method)

    def write_disk_key(self, key: bytes) -> None:
        # The state disk's key, from the attested activation, join or rejoin: kept only sealed (core/at_rest.py).
        self.at_rest.write_file(os.path.join(self.state_dir, STATE_DISK_KEY_FILE), key)

    def read_disk_key(self) -> Optional[bytes]:
        return self.at_rest.read_file(os.path.join(self.state_dir, STATE_DISK_KEY_FILE))
