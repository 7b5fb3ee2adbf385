# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What both sides of a peer share: its ports, the node lock, start-up (restore or AcceptingInit),
the persisted node state and the accessors the servers use."""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Dict, Optional

from ansible_collections.constellation.cluster.plugins.module_utils import kms as kms_mod
from ansible_collections.constellation.cluster.plugins.module_utils.core import state_store
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    expected_pcr15,
)
from ansible_collections.constellation.cluster.plugins.module_utils.disk.state_disk import NOT_ENCRYPTED
from ansible_collections.constellation.cluster.plugins.module_utils.core.inputs import (
    ip,
    normalize_disk_uuid,
    parse_admin_pub_key,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.at_rest import PlainStorage, SealedStorage
from ansible_collections.constellation.cluster.plugins.module_utils.core.lock import NodeLock
from ansible_collections.constellation.cluster.plugins.module_utils.core.node_state import NodeState
from ansible_collections.constellation.cluster.plugins.module_utils.core.peer_cache import PeerRegistryCache
from ansible_collections.constellation.cluster.plugins.module_utils.core.ports import KMS, TPM, VPN, Store
from ansible_collections.constellation.cluster.plugins.module_utils.core.state import (
    ROLE_COORDINATOR,
    State,
    StateMachine,
)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.store import StoreError
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import pub_key_from_priv_key

STATE_DISK_KEY_FILE = "state_disk.key"


class CoreBase(StateMachine):
    """One peer. Thread-safe; every method may be called from a server thread."""

    def __init__(self, store: Store, tpm: TPM, vpn: VPN, state_dir: str, public_ip: str,
                 disk_uuid: str, log: Optional[Callable[..., None]] = None,
                 kubeadm_join_args: Optional[Callable[[], Dict[str, Any]]] = None,
                 init_secret_hash: Optional[str] = None, at_rest: Optional[SealedStorage] = None):
        super().__init__(log)
        # The secrets this peer keeps in files (core/at_rest.py): sealed to its TPM by the agent.
        self.at_rest = at_rest if at_rest is not None else PlainStorage()
        self.agent_measurement: Optional[Dict[str, Any]] = None  # attestation/agent_measurement.py, set by the agent
        # hex SHA-256 of this node's init secret (init_secret.py): activation needs its proof. None: any caller
        # may activate this node (as before; the agent logs a warning).
        self.init_secret_hash = init_secret_hash
        self._init_secret: Optional[bytes] = None  # the Coordinator's copy of the cluster's init secret
        # A node that joins by itself: the Coordinators' signing key from its agent config (core/signing.py);
        # join tickets must verify with it. Activated Nodes pin theirs in their node state.
        self.join_coordinator_pub_key: Optional[str] = None
        # ``store`` holds everything while the cluster's state is local; a Coordinator that runs an etcd
        # member (``etcd_member``, core/coordinator_cluster.py) moves the cluster's keys there and ``store``
        # becomes that cluster; ``local_store`` keeps what is this peer's own (state_store.LOCAL_KEYS).
        self.store = store
        self.local_store = store
        self.etcd_member: Optional[Any] = None  # ports.ClusterStoreMember, set by the agent
        self._pending_coordinator: Optional[Any] = None  # an ActivateAsAdditionalCoordinator under way
        self._pending_priv_key: Optional[str] = None
        self._synced_version: Optional[int] = None  # the registry version whose peers WireGuard has
        self._peers_apply_lock = threading.Lock()  # the Coordinator applies registry peers one at a time
        self.tpm = tpm
        self.vpn = vpn
        self.state_dir = state_dir
        self.public_ip = ip(public_ip, "public_ip")
        self.disk_uuid = normalize_disk_uuid(disk_uuid)
        self.kubeadm_join_args = kubeadm_join_args
        self.lock = NodeLock(tpm)
        self._node: Optional[NodeState] = None  # the persisted node state (no secrets beyond the store's)
        self._kms: Optional[KMS] = None
        # The Coordinator's peer registry: read from memory, written through the store (peer_cache.py).
        self.peer_registry = PeerRegistryCache(store)
        self.recovery_pending = False
        # The WireGuard key a joining node announces (node.py): one per Core, generated on first use.
        self._join_key_lock = threading.Lock()
        self._join_priv_key_value: Optional[str] = None
        # The encrypted state disk (ports.StateDiskPort, set by the agent with state_disk_device); None: the state
        # is not on an encrypted disk, and GetState says so.
        self.state_disk: Optional[Any] = None

    # -- start-up
    def load(self) -> State:
        """Restores a persisted state (agent restart) or enters AcceptingInit (fresh node)."""
        raw = state_store.load_node_state(self.local_store)
        pcr15 = self.tpm.pcr15()
        if raw is None:
            if pcr15 != bytes(32):
                self.lock.mark_taken()
                self.failure = "PCR 15 is set but no node state is stored: this node must be reset"
                self._advance(State.FAILED)
                return self._state
            self._advance(State.ACCEPTING_INIT)
            return self._state
        try:
            node = NodeState.from_dict(raw)
        except InputError as err:
            raise StoreError("the stored node state is invalid: %s" % err) from None
        with self._mutex:
            self._node = node
            self._role = node.role
        if pcr15 == bytes(32) and node.stored_state == State.NODE_WAITING_FOR_CLUSTER_JOIN:
            # The node persisted its activation, then died (or the TPM was reset) before or after the
            # extension; no disk key was ever given to it. Take the lock for the stored cluster again.
            self.lock.try_lock_once(node.cluster_id)
            self._log("node_lock", role=node.role, pcr=15, via="restart")
            self._resume()
        elif pcr15 == expected_pcr15(node.cluster_id):
            self.lock.mark_taken()
            self._resume()
        elif pcr15 == bytes(32):
            # A reboot reset the TPM: wait for Recover (the KMS URI proves who asks).
            self.recovery_pending = True
            self._advance(State.ACCEPTING_INIT)
        else:
            self.lock.mark_taken()
            self.failure = "PCR 15 holds another cluster's ID than the stored state"
            self._advance(State.FAILED)
        return self._state

    def _resume(self) -> None:
        node = self._stored_node()
        if node.role == ROLE_COORDINATOR:
            kms_data = state_store.load_kms_data(self.local_store)
            if kms_data is None:
                raise StateError("the store holds a Coordinator state without KMS settings")
            self._kms = kms_mod.open_kms(kms_data["kms_uri"])
            self._init_secret = state_store.load_init_secret(self.local_store)
        self.vpn.setup(node.vpn_ip, node.vpn_priv_key)
        if node.role == ROLE_COORDINATOR:
            self._open_cluster_store(node)
            self._load_evictions()
            registry = self.peer_registry.reload()
            if registry is not None:
                self.vpn.set_peers(list(registry.peers.peers.values()), self.vpn_pub_key)
        else:
            self.vpn.set_peers(list(node.peers or ()), self.vpn_pub_key)
        stored = node.stored_state
        if stored == State.NODE_WAITING_FOR_CLUSTER_JOIN:
            # Locked, but the disk key never came: the agent fetches it from the Coordinator over the VPN
            # (docs/agent.md, "Resumable activation").
            self._log("activation_pending", coordinator_vpn_ip=node.coordinator_vpn_ip)
        self._advance(stored)

    def _load_evictions(self) -> None:
        """The Coordinator's evicted peers (core/trust.py); nothing on other roles."""

    def _open_cluster_store(self, node: NodeState) -> None:
        """A restarted Coordinator with an etcd member rejoins its cluster (core/coordinator_cluster.py)."""

    def _start_cluster_store(self, vpn_ip: str, kms: KMS) -> None:
        """The first Coordinator with an etcd member starts it (core/coordinator_cluster.py)."""

    # -- accessors for servers
    @property
    def node_state(self) -> Dict[str, Any]:
        """The persisted node state in the store's format (``{}`` before activation)."""
        node = self._node
        return node.to_dict() if node is not None else {}

    def _stored_node(self) -> NodeState:
        node = self._node
        if node is None:
            raise StateError("this node holds no cluster state")
        return node

    @property
    def vpn_pub_key(self) -> str:
        return pub_key_from_priv_key(self._stored_node().vpn_priv_key)

    def public_state(self) -> Dict[str, Any]:
        """What GetState tells anyone: state and role only (least disclosure). The details (``get_state``)
        go only to an authenticated admin or Coordinator (agent/admin.py AdminAuth)."""
        return super().get_state()

    def pinned_coordinator_pub_key(self) -> Optional[str]:
        """The Coordinators' key this peer trusts: a Node's, pinned at activation (or from its agent config
        when it joined); an activated Coordinator's own, derived from its KMS. None before activation."""
        node = self._node
        if node is None:
            return None
        if node.role == ROLE_COORDINATOR:
            return self.coordinator_pub_key() if self._kms is not None else None  # pylint: disable=no-member
        return node.coordinator_pub_key

    def get_state(self) -> Dict[str, Any]:
        """State and role, plus the peer's VPN IP and WireGuard public key once it has them, and its disk
        UUID: for the admin and the Coordinators only (the pubapi answers others ``public_state``)."""
        answer = super().get_state()
        node = self._node
        active = self.state in (State.ACTIVATING_NODES, State.NODE_WAITING_FOR_CLUSTER_JOIN, State.IS_NODE)
        answer["vpn_ip"] = node.vpn_ip if active and node is not None else None
        answer["vpn_pub_key"] = self.vpn_pub_key if active and node is not None and node.vpn_priv_key else None
        # The disk UUID reported at activation (what the Coordinator derives this node's disk key for).
        answer["state_disk_uuid"] = (node.disk_uuid or self.disk_uuid) if active and node is not None else None
        answer["state_disk"] = self.state_disk.status() if self.state_disk is not None else dict(NOT_ENCRYPTED)
        # What this peer runs (PCR 13's two events, replayable) and whether its secrets at rest are sealed.
        answer["agent_measurement"] = self.agent_measurement
        answer["secrets_at_rest"] = {"sealed": self.at_rest.sealed, "pcrs": list(self.at_rest.pcrs)}
        return answer

    @property
    def vpn_ip(self) -> Optional[str]:
        return self._node.vpn_ip if self._node is not None else None

    @property
    def coordinator_vpn_ip(self) -> Optional[str]:
        return self._node.coordinator_vpn_ip if self._node is not None else None

    @property
    def cluster_id(self) -> Optional[bytes]:
        return self._node.cluster_id if self._node is not None else None

    def admin_pub_key(self):
        text = self._node.admin_pub_key if self._node is not None else None
        return parse_admin_pub_key(text) if text else None

    # -- persistence
    def _save_node(self, node: Optional[NodeState] = None, **changes: Any) -> None:
        """Persists ``node`` (or the current node state with ``changes``), then makes it current."""
        with self._mutex:
            if node is None:
                node = self._stored_node().replace(**changes)
            state_store.save_node_state(self.local_store, node.to_dict())
            self._node = node

    def _keep_disk_key(self, key: bytes, first: bool = True) -> None:
        """The disk key arrived (activation, join: ``first``; rejoin: not): kept at rest (``_write_disk_key``),
        then, with a state disk, the disk is formatted (first only), opened and mounted and the store moved onto
        it (disk/attach.py). A refusal raises: the activation fails, naming the disk."""
        self._write_disk_key(key)
        if self.state_disk is not None:
            self.state_disk.key_arrived(key, self.disk_uuid, first)

    def _take_lock(self, cluster_id: bytes, method: str, before_extend: Optional[Callable[[], None]] = None) -> None:
        if not self.lock.try_lock_once(cluster_id, before_extend):
            raise StateError("%s: the node lock is already taken (another activation is running or done)" % method)

    def _write_disk_key(self, key: bytes) -> None:
        # The state disk's key, from the attested activation, join or rejoin: kept only sealed (core/at_rest.py).
        self.at_rest.write_file(os.path.join(self.state_dir, STATE_DISK_KEY_FILE), key)

    def read_disk_key(self) -> Optional[bytes]:
        return self.at_rest.read_file(os.path.join(self.state_dir, STATE_DISK_KEY_FILE))
