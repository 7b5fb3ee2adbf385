# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A peer's Core: states, roles, the node lock and the activation logic (docs/protocol.md, "States").

No sockets here: the agent's servers (``agent/pubapi.py``, ``vpnapi.py``, ``admin.py``) call the services
and turn errors into answers; where an operation needs a transport (activating a node, a join), the caller
passes it in as a port (``ports.py``). Nothing in this package imports Ansible, ``atls``, ``rpc/``,
``agent/`` or ``kubeadm/`` (the repository's test_layout.py).

* States only advance (docs/protocol.md, "States"). A node whose activation was interrupted after the node lock waits
  (``NodeWaitingForClusterJoin``, persisted) and resumes (``activation``); ``Failed`` is left for what
  cannot be resumed.
* The node lock (``NodeLock``, ``lock``): an in-process compare-and-swap, then PCR 15 is extended with
  the cluster ID (``tpm.mark_initialized``) BEFORE any other secret is stored or used. A second
  activation, or a concurrent one, is refused with ``StateError``.
* Activation as Coordinator (``coordinator``) derives the measurement secret and cluster ID from the
  KMS, allocates the VPN IPs and persists everything in the store; activation as Node (``node``) takes
  the VPN IP, peers, cluster ID and admin key, and stores the disk key derived for the UUID it reported.
* Persistence: the node state (``NodeState``), KMS settings and the peer registry live in the store
  (``state_store``), so an agent restart loses nothing; ``recovery`` resumes after a TPM reset.

Rooms (docs/architecture.md, "The Core"): ``state``, ``inputs``, ``ports``, ``lock``, ``vpn``, ``at_rest``; the
peer registry (``registry/``: ``peer_record``, ``peer_set``, ``cache``, ``vpn_ips``, ``peer_access``); re-attestation
and eviction (``eviction/``: ``peer_trust``, ``trust_ports``, ``evictions``, ``eviction_store``, ``reattest_loop``,
``certified_ak_store``); the records kept and handed out (``records/``: ``state_store``, ``node_state``,
``node_records``, ``sealed_key_file``, ``tickets``). The services, one per concern, each holding the shared
``PeerContext`` (``context``) and its collaborators through small Protocols declared where they are used; for every
service the attribute, the module and the class share a stem: ``coordinator`` (activation as Coordinator, registry,
updates), ``join_service`` (IssueJoinTicket), ``admissions`` (the admin's consent to joins: admitted EKs),
``kubernetes`` (join material), ``signing``, ``activation`` (the Coordinator activates and resumes nodes),
``shared_store`` (its etcd member), ``cluster`` (further Coordinators on one etcd cluster), ``node`` (the Node's
side), ``recovery`` (start-up, Recover, rejoin), ``status`` (GetState), ``backup`` (the Coordinator's state exported
and restored onto a fresh peer), ``evictions`` (``eviction/evictions.py``), ``removal`` (the admin removes a Node),
``peer_access`` (``registry/peer_access.py``: who gets what, data keys), ``peer_trust`` (``eviction/peer_trust.py``:
re-attestation, eviction, rejoin tickets; ``reattest_loop`` drives it) and ``accepted_measurements`` (the accepted
measurement sets). ``coordinator_removal`` takes a Coordinator out (its etcd member and registry entry). ``Core`` is
the composition root only: it builds the context and the services and exposes them as attributes.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.core.accepted_measurements import AcceptedMeasurements
from ansible_collections.constellation.cluster.plugins.module_utils.core.admissions import Admissions
from ansible_collections.constellation.cluster.plugins.module_utils.core.activation import (
    ACTIVATION_WORKERS,
    MAX_NODES_PER_CALL,
    Activation,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.at_rest import SealedStorage
from ansible_collections.constellation.cluster.plugins.module_utils.core.context import STATE_DISK_KEY_FILE, PeerContext
from ansible_collections.constellation.cluster.plugins.module_utils.core.backup import Backup
from ansible_collections.constellation.cluster.plugins.module_utils.core.coordinator import Coordinator
from ansible_collections.constellation.cluster.plugins.module_utils.core.cluster import Cluster
from ansible_collections.constellation.cluster.plugins.module_utils.core.eviction.evictions import Evictions
from ansible_collections.constellation.cluster.plugins.module_utils.core.join_service import JoinService
from ansible_collections.constellation.cluster.plugins.module_utils.core.kubernetes import Kubernetes
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_access import RESERVED_DATA_KEY_IDS, PeerAccess
from ansible_collections.constellation.cluster.plugins.module_utils.core.removal import Removal
from ansible_collections.constellation.cluster.plugins.module_utils.core.inputs import (
    ADMIN_PUB_KEY_MAX,
    CLUSTER_ID_LENGTH,
    HAS_CRYPTOGRAPHY,
    MEASUREMENT_SALT_LENGTH,
    new_disk_uuid,
    normalize_disk_uuid,
    parse_admin_pub_key,
    parse_measurement_salt,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.lock import NodeLock, TPMDevice
from ansible_collections.constellation.cluster.plugins.module_utils.core.node import Node
from ansible_collections.constellation.cluster.plugins.module_utils.core.records.node_state import NodeState
from ansible_collections.constellation.cluster.plugins.module_utils.core.records.tickets import (
    CoordinatorActivation,
    JoinTicket,
    NodeActivationRequest,
    NodeActivationStep,
    RejoinTicket,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.ports import TPM, VPN, Store
from ansible_collections.constellation.cluster.plugins.module_utils.core.eviction.reattest_loop import ReattestLoop
from ansible_collections.constellation.cluster.plugins.module_utils.core.recovery import Recovery
from ansible_collections.constellation.cluster.plugins.module_utils.core.shared_store import SharedStore
from ansible_collections.constellation.cluster.plugins.module_utils.core.signing import Signing
from ansible_collections.constellation.cluster.plugins.module_utils.core.state import (
    ROLE_COORDINATOR,
    ROLE_NODE,
    ROLE_UNKNOWN,
    State,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.status import Status
from ansible_collections.constellation.cluster.plugins.module_utils.core.eviction.peer_trust import PeerTrust
from ansible_collections.constellation.cluster.plugins.module_utils.core.vpn import WireGuardVPN
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    ConstellationError,
    InputError,
    StateError,
)


class Core:
    """One peer, composed: the shared ``context`` and one service per concern. Thread-safe; every service
    may be called from a server thread.

    The positional and the other keyword arguments are the ``PeerContext``'s (core/context.py), passed on as
    they are; the four keywords here configure services, not the shared state."""

    def __init__(self, *context_args: Any, kubeadm_provider: Optional[Any] = None,
                 activation_workers: int = ACTIVATION_WORKERS, insecure_join_without_admission: bool = False,
                 measurements_policy: Optional[Any] = None, **context_kwargs: Any):
        self.context = context = PeerContext(*context_args, **context_kwargs)
        self.signing = Signing(context)
        self.peer_access = PeerAccess(context)
        self.evictions = Evictions(context)
        self.shared_store = SharedStore(context)
        self.kubernetes = Kubernetes(context, self.peer_access, self.evictions, kubeadm_provider)
        self.coordinator = Coordinator(context, self.shared_store, self.peer_access, self.signing)
        self.admissions = Admissions(context, insecure_join_without_admission)  # the admin's consent to joins: the admitted EKs
        self.join_service = JoinService(context, self.coordinator, self.peer_access, self.kubernetes, self.signing,
                                        self.admissions)
        self.activation = Activation(context, self.coordinator, self.signing, self.peer_access, self.evictions,
                                     self.kubernetes, activation_workers)
        self.cluster = Cluster(context, self.coordinator, self.signing)
        self.node = Node(context)
        # the accepted measurement sets (image upgrades); ``measurements_policy``: the agent's policy in force
        self.accepted_measurements = AcceptedMeasurements(context, measurements_policy)
        self.peer_trust = PeerTrust(context, self.coordinator, self.join_service, self.signing, self.evictions,
                                    self.kubernetes, self.accepted_measurements.record_peer_set,
                                    self.accepted_measurements.record_peer_agent)
        self.status = Status(context, self.shared_store, self.evictions, self.signing, self.admissions)
        self.recovery = Recovery(context, self.shared_store, self.evictions, self.status)
        self.backup = Backup(context, self.recovery, self.peer_access, self.coordinator)
        self.removal = Removal(context, self.coordinator, self.kubernetes, self.evictions)

    # The few read-only accessors every side uses; everything else: the services above.
    @property
    def state(self) -> State:
        return self.context.state

    @property
    def role(self) -> str:
        return self.context.role

    def get_state(self) -> Dict[str, Any]:
        """GetState's details (core/status.py)."""
        return self.status.get_state()


__all__ = [
    "ACTIVATION_WORKERS", "ADMIN_PUB_KEY_MAX", "CLUSTER_ID_LENGTH", "HAS_CRYPTOGRAPHY", "MAX_NODES_PER_CALL",
    "MEASUREMENT_SALT_LENGTH", "RESERVED_DATA_KEY_IDS", "ROLE_COORDINATOR", "ROLE_NODE", "ROLE_UNKNOWN",
    "STATE_DISK_KEY_FILE", "ConstellationError", "Coordinator", "CoordinatorActivation", "Core", "InputError",
    "Cluster", "JoinTicket", "Activation", "NodeActivationRequest", "Node", "PeerContext", "PeerTrust",
    "Recovery",
    "ReattestLoop", "RejoinTicket", "NodeActivationStep", "NodeLock", "NodeState", "State", "StateError",
    "TPMDevice", "WireGuardVPN", "new_disk_uuid", "normalize_disk_uuid", "parse_admin_pub_key",
    "parse_measurement_salt",
]
