# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The accepted measurement sets in force on this agent (core/accepted_measurements.py decides, this applies): a
new policy document is checked, the storage key sealed to its sets ahead of a reboot, the policy file (and its
signature) written and the validators of the aTLS server, the clients and re-attestation swapped, without a
restart."""

from __future__ import annotations

import threading
from typing import Any, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import deployment
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.agent_measurement import (
    IMAGE_AGENT, accepted_values)
from ansible_collections.constellation.cluster.plugins.module_utils.agent import storage_key
from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import AgentConfig
from ansible_collections.constellation.cluster.plugins.module_utils.agent.policy_file import PolicyFile, own_measurement_set
from ansible_collections.constellation.cluster.plugins.module_utils.agent.unsealing import AgentAttestation
from ansible_collections.constellation.cluster.plugins.module_utils.core.accepted_measurements import check_document
from ansible_collections.constellation.cluster.plugins.module_utils.core.at_rest import SealedStorage

NOT_ACCEPTED = "(not accepted)"


class MeasurementPolicy:
    """The policy in force (``current()``: as the policy file holds it, before PCR 13 and 15), the pinned key
    (``pub_key``), ``apply``, ``own_set`` and ``own_agent``: what the Core's ``AcceptedMeasurements`` asks of the
    agent."""

    def __init__(self, config: AgentConfig, policy_file: PolicyFile, attestation: AgentAttestation,
                 at_rest: SealedStorage, log):
        self.config = config
        self.policy_file = policy_file
        self.attestation = attestation
        self.at_rest = at_rest
        self.log = log
        self.policy = attestation.policy
        self._lock = threading.Lock()

    @property
    def pub_key(self) -> Any:
        return self.policy_file.pub_key

    def current(self) -> Any:
        return self.policy

    def apply(self, document: bytes, signature: Optional[str], sets=None) -> bool:
        """Checks a new policy document (with the pinned key: its signature first; a version not below ours),
        seals the storage key to its sets ahead of a reboot, writes the policy file (and its signature)
        atomically and swaps the validators of the aTLS server, the clients and re-attestation. Returns
        whether anything changed."""
        with self._lock:
            if sets is None:
                sets = check_document(document, signature, self.policy_file.pub_key, self.policy)
            storage_key.check_version(self.at_rest, self.config.state_dir, sets)  # the sealed floor
            if self.policy is not None and sets == self.policy:
                return False
            # First: a reboot after the file changed must find its key. Only here, with a document received over
            # the API, is the key resealed (agent/storage_key.py).
            policies = self.attestation.policies(sets)
            storage_key.reseal(self.at_rest, policies.sealed, self.config.deployment_mode, self.log)
            self.policy_file.write(document, signature)
            # a stop before it leaves the floor below the file, never above
            storage_key.raise_floor(self.at_rest, self.config.state_dir, sets.version)
            self.policy = sets
            if policies.full is not None:
                self.attestation.node_validator.measurements = policies.fresh_node  # one attribute write each
                self.attestation.peer_validator.measurements = policies.coordinator
            self.log("measurements_applied", version=sets.version, sets=",".join(sets.sets))
            return True

    def own_set(self) -> Optional[str]:
        """The accepted set this peer's own PCRs match (the Coordinator is not re-attested by itself)."""
        measurement = self.attestation.measurement
        if measurement is None or self.policy is None:  # a variant that quotes no PCRs has no PCRs to match here
            return None
        return own_measurement_set(self.attestation.policies(self.policy).full, self.config.tcti)

    def own_agent(self) -> Optional[Tuple[str, bytes]]:
        """(name, PCR 13 value) of the agent this peer runs, named as the policy in force accepts it (the
        ``agents`` entry of its value, agent_measurement.OWN_AGENT where none are listed, NOT_ACCEPTED where the policy
        does not accept it). In the node image: agent_measurement.IMAGE_AGENT (its PCR 13 holds zero, its image set
        covers it) with the value its code and trust configuration give, what it accepts as its own agent on host
        peers where the document lists none."""
        measurement = self.attestation.measurement
        if measurement is None or self.policy is None:
            return None
        if not deployment.extends_agent_pcr(self.config.deployment_mode):
            return IMAGE_AGENT, measurement.value
        names = [name for name, value in accepted_values(self.policy, measurement.value).items()
                 if value == measurement.value]
        return (names[0] if names else NOT_ACCEPTED), measurement.value
