# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What activate_nodes does with one attested peer: a pure decision over the peer's membership (its attested
PCR 15: FRESH, OURS or OTHER), its state and role, and what the Coordinator holds about it (evicted, removed).
controller.activate_nodes attests the peers, plans each one here and then executes the plan: it sends the
peers to activate, resume or readmit to the Coordinator, or refuses the whole run with every refusal's reason.
"""

from __future__ import annotations

import enum
from typing import Any

from ansible_collections.constellation.cluster.plugins.module_utils import constants
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import FRESH, OTHER, OURS


class Action(enum.Enum):
    """What the controller does with a peer. The value of a non-refusal is the row's ``action``."""

    MEMBER = "none"  # already a member of this cluster in the wanted role: nothing to do
    ACTIVATE = "activate"  # fresh: the Coordinator activates it
    RESUME = "resume"  # ours, its activation was interrupted: the Coordinator resumes it
    READMIT = "readmit"  # ours, evicted by the Coordinator (failed re-attestation) and attested again now
    REFUSE_NOT_OUR_COORDINATOR = "refuse-not-our-coordinator"  # a further Coordinator that is neither ours nor fresh
    REFUSE_REMOVED = "refuse-removed"  # ours, removed by the admin: it comes back only as a new peer
    REFUSE_STATE = "refuse-state"  # in no state to join (or locked while the cluster ID is unknown)
    REFUSE_OTHER_CLUSTER = "refuse-other-cluster"  # locked to another cluster

    @property
    def refused(self) -> bool:
        return self.name.startswith("REFUSE_")

    @property
    def sent(self) -> bool:
        """Whether the Coordinator is asked to act on the peer (ActivateAdditionalNodes)."""
        return self in (Action.ACTIVATE, Action.RESUME, Action.READMIT)

    @property
    def row(self) -> str:
        """The ``action`` of the peer's row in activate_nodes' result."""
        return "refused" if self.refused else self.value

    def reason(self, report: Any) -> str:
        """Why a refused peer is refused, from its PeerReport (endpoint, state, role, membership, pcr15)."""
        endpoint = report.endpoint
        if self is Action.REFUSE_NOT_OUR_COORDINATOR:
            return ("%s is %s (role %s, PCR 15 %s): not a Coordinator of this cluster; reset it and run again"
                    % (endpoint, report.state, report.role, report.membership))
        if self is Action.REFUSE_REMOVED:
            return ("%s was removed from this cluster (remove_node.yml): reset it (reset.yml), reboot it, then "
                    "run add_nodes.yml again" % endpoint)
        if self is Action.REFUSE_STATE:
            return "%s is %s (role %s)%s" % (endpoint, report.state, report.role, _next_step(report.state))
        if self is Action.REFUSE_OTHER_CLUSTER:
            return "%s is locked to another cluster (PCR 15 %s)" % (endpoint, report.pcr15)
        raise ValueError("%s is not a refusal" % self)


def _next_step(state: str) -> str:
    if state == constants.STATE_FAILED:
        return ": it cannot be resumed; its agent log says why. Reset the node (wipe its agent state, reboot) " \
               "and run add_nodes.yml"
    return ""


def plan_peer(as_role: str, membership: str, state: str, role: str, cluster_id_known: bool = True,
              evicted: bool = False, removed: bool = False) -> Action:
    """The Action for a peer given to activate_nodes as a further Coordinator (``as_role`` ROLE_COORDINATOR)
    or as a node (anything else). ``membership``, ``state`` and ``role`` are from its attested GetState;
    ``cluster_id_known``: the controller knows the cluster ID (else a locked peer is OTHER, see
    cluster_membership); ``evicted``/``removed``: the Coordinator lists the peer's VPN IP among its evicted
    peers / its VPN public key among the peers the admin removed."""
    if as_role == constants.ROLE_COORDINATOR:
        if membership == OURS and role == constants.ROLE_COORDINATOR and state == constants.STATE_ACTIVATING_NODES:
            return Action.MEMBER
        if membership == FRESH and state == constants.STATE_ACCEPTING_INIT:
            return Action.ACTIVATE
        return Action.REFUSE_NOT_OUR_COORDINATOR
    if membership == OURS and removed:
        return Action.REFUSE_REMOVED
    if membership == OURS and state == constants.STATE_IS_NODE:
        return Action.READMIT if evicted else Action.MEMBER
    if membership == FRESH and state == constants.STATE_ACCEPTING_INIT:
        return Action.ACTIVATE
    if membership == OURS and state == constants.STATE_NODE_WAITING_FOR_CLUSTER_JOIN:
        return Action.RESUME
    if membership == OURS or (membership == OTHER and not cluster_id_known):
        return Action.REFUSE_STATE
    return Action.REFUSE_OTHER_CLUSTER
