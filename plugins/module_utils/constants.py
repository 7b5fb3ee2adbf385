# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Names and numbers every layer shares, defined once."""

from __future__ import annotations

# TPM PCRs.
PCR_COUNT = 24
PCR_INDEX_CLUSTER_ID = 15  # the node lock: extended with the cluster ID at activation
# The measured agent (attestation/agent_measurement.py): extended with the agent's code and configuration before
# it serves anything. PCRs 0-15 cannot be reset without a reboot (16 and 23 can be, from locality 0, so software
# could replay them); of those, 13 is the one no firmware, grub, shim or kernel extends on a typical node and
# systemd-stub only for system-extension add-ons next to a UKI (Constellation's images expect it to be zero).
PCR_INDEX_AGENT = 13

# Peer states on the wire: values and names as Constellation's Coordinator (docs/protocol.md, "States").
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

# Renamed options keep their old names as deprecated aliases until this release of the collection.
# The pod network (docs/wireguard.md, "Pod CIDRs"): the cluster's pod range and each peer's share of it, as
# kube-controller-manager's --cluster-cidr and --node-cidr-mask-size name them.
CLUSTER_POD_CIDR = "10.244.0.0/16"
NODE_POD_CIDR_MASK_SIZE = 24

COLLECTION_NAME = "constellation.cluster"
RENAMED_OPTIONS_REMOVED_IN = "2.0.0"


def deprecated_alias(alias: str) -> dict:
    """An argument spec's deprecated_aliases entry: an old option name that keeps working, with a deprecation
    warning, until RENAMED_OPTIONS_REMOVED_IN."""
    return dict(name=alias, version=RENAMED_OPTIONS_REMOVED_IN, collection_name=COLLECTION_NAME)
