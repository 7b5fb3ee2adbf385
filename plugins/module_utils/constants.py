# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Names and numbers every layer shares, defined once (SPEC.md 2.7 and 6.4)."""

from __future__ import annotations

# TPM PCRs.
PCR_COUNT = 24
PCR_INDEX_CLUSTER_ID = 15  # the node lock: extended with the cluster ID at activation

# Peer states on the wire (SPEC 6.4: values and names as Constellation's Coordinator).
STATE_UNINITIALIZED = "Uninitialized"
STATE_ACCEPTING_INIT = "AcceptingInit"
STATE_ACTIVATING_NODES = "ActivatingNodes"
STATE_NODE_WAITING_FOR_CLUSTER_JOIN = "NodeWaitingForClusterJoin"
STATE_IS_NODE = "IsNode"
STATE_FAILED = "Failed"

# Peer roles.
ROLE_UNKNOWN = "unknown"
ROLE_COORDINATOR = "coordinator"
ROLE_NODE = "node"
ROLE_ADMIN = "admin"
