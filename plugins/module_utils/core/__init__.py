# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A peer's Core: states, roles, the node lock and the activation logic (SPEC.md 4, 6).

No sockets here: the servers in ``rpc/`` call these methods and turn errors into answers; where an
operation needs a transport (activating a node, a join), the caller passes it in as a port
(``ports.py``). Nothing in this package imports Ansible or ``rpc/``.

* States only advance (SPEC 6.4). A node whose activation was interrupted after the node lock waits
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

Rooms: ``state``, ``inputs``, ``records``, ``node_state``, ``ports``, ``lock``, ``vpn``, ``base``,
``coordinator``, ``activation`` (the Coordinator activates and resumes nodes), ``coordinators``
(further Coordinators on one etcd cluster), ``trust`` (re-attestation,
eviction, rejoin tickets), ``node``, ``recovery``; ``Core`` composes the last three.
"""

from __future__ import annotations

from ansible_collections.constellation.cluster.plugins.module_utils.core.base import STATE_DISK_KEY_FILE, CoreBase
from ansible_collections.constellation.cluster.plugins.module_utils.core.activation import (
    ACTIVATION_WORKERS,
    MAX_NODES_PER_CALL,
    NodeActivation,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.peer_access import RESERVED_DATA_KEY_IDS
from ansible_collections.constellation.cluster.plugins.module_utils.core.coordinator_cluster import CoordinatorCluster
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
from ansible_collections.constellation.cluster.plugins.module_utils.core.node import NodeSide
from ansible_collections.constellation.cluster.plugins.module_utils.core.node_state import NodeState
from ansible_collections.constellation.cluster.plugins.module_utils.core.records import (
    CoordinatorActivation,
    JoinTicket,
    NodeActivationRequest,
    NodeActivationStep,
    RejoinTicket,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.recovery import Recovery
from ansible_collections.constellation.cluster.plugins.module_utils.core.state import (
    ROLE_COORDINATOR,
    ROLE_NODE,
    ROLE_UNKNOWN,
    State,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.trust import PeerTrust, ReattestLoop
from ansible_collections.constellation.cluster.plugins.module_utils.core.vpn import WireGuardVPN
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    ConstellationError,
    InputError,
    StateError,
)


class Core(PeerTrust, CoordinatorCluster, NodeSide, Recovery):
    """One peer: both sides (the Coordinator's with node activation) and recovery over the shared ``CoreBase``. Thread-safe; every method
    may be called from a server thread."""


__all__ = [
    "ACTIVATION_WORKERS", "ADMIN_PUB_KEY_MAX", "CLUSTER_ID_LENGTH", "HAS_CRYPTOGRAPHY", "MAX_NODES_PER_CALL",
    "MEASUREMENT_SALT_LENGTH", "RESERVED_DATA_KEY_IDS", "ROLE_COORDINATOR", "ROLE_NODE", "ROLE_UNKNOWN",
    "STATE_DISK_KEY_FILE", "ConstellationError", "CoordinatorActivation", "Core", "CoreBase", "InputError",
    "CoordinatorCluster", "JoinTicket", "NodeActivationRequest", "PeerTrust",
    "ReattestLoop", "RejoinTicket", "NodeActivationStep", "NodeLock", "NodeState", "State", "StateError",
    "TPMDevice", "WireGuardVPN", "new_disk_uuid", "normalize_disk_uuid", "parse_admin_pub_key",
    "parse_measurement_salt",
]
