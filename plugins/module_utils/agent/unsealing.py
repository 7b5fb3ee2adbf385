# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent's start-up before anything is served or read (docs/agent.md, "Secrets at rest"): the attestation
variant (issuer and validators) and the policy file; PCR 13 <- the agent's code and trust configuration; the storage
key unsealed (agent/storage_key.py); the sealed store opened; the disk UUID read (or created once)."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Dict, List, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.agent_measurement import AgentMeasurement
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import PeerPolicies, peer_policies
from ansible_collections.constellation.cluster.plugins.module_utils.agent import storage_key
from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import AgentConfig
from ansible_collections.constellation.cluster.plugins.module_utils.agent.policy_file import PolicyFile
from ansible_collections.constellation.cluster.plugins.module_utils.core import new_disk_uuid, normalize_disk_uuid
from ansible_collections.constellation.cluster.plugins.module_utils.core.at_rest import PlainStorage, SealedStorage, sealed_pcr_sets
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.store import open_store


class AgentAttestation:
    """The agent's attestation from the chooser: ``issuer``, ``node_validator`` (fresh nodes: the policy plus PCR 15
    = zeros), ``peer_validator`` (peers whose PCR 15 is checked elsewhere: the Coordinator a node joins, whose
    cluster ID a fresh node cannot know, and the nodes the Core activates or resumes, whose PCR 15 the Core checks
    against its own cluster ID); the validators share one registry of certified AKs (qemu-vtpm-ek) or of verified
    AMD chains (sev-snp). With a policy (every variant but ``dummy``): ``policy`` as the file holds it (before PCR 13
    and 15), ``sealed_pcrs`` (the PCRs the storage key is sealed to) and, for a variant that quotes PCRs,
    ``measurement`` (the agent's PCR 13). What a variant adds to the policy is attestation/policy.py
    ``peer_policies``' rule."""

    def __init__(self, config: AgentConfig, policy_file: PolicyFile):
        variant = config.variant
        chosen = choose.spec(variant)
        trust = choose.load_trust(variant, config.ek_ca, None, "ek_ca", config.insecure_trust_any_ak,
                                  amd_roots_path=config.amd_roots)
        self.variant = variant
        self.policy: Any = None
        self.measurement: Optional[AgentMeasurement] = None
        self.sealed_pcrs: List[int] = []
        self.seals = chosen.needs_policy  # the test suite's dummy variant has no TPM: nothing is sealed
        if chosen.needs_policy:
            # The one policy loader: with a pinned key the file's signature is checked before it is parsed.
            self.policy = policy_file.load()
            if chosen.quotes_pcrs:
                # The agent's PCR: every peer runs this code with this trust configuration (agent_measurement.py).
                self.measurement = AgentMeasurement.of(variant, trust.ek_ca_certs)
        policies = self.policies(self.policy)
        if policies.sealed is not None:
            self.sealed_pcrs = sorted({i for pcrs in sealed_pcr_sets(policies.sealed, config.deployment_mode).values()
                                       for i in pcrs})
        issuer_options: Dict[str, Any] = {"ak_alg": config.ak_alg} if variant != "dummy" else {}
        if chosen.needs_amd_roots:
            issuer_options["snp_report_source"] = config.snp_report_source
            issuer_options.update({name: getattr(config, name) for name in ("amd_cert_cache", "amd_kds_fetch")
                                   if getattr(config, name) is not None})
        self.issuer = choose.issuer(variant, config.tcti, **issuer_options)
        self.node_validator = choose.validator(variant, policies.fresh_node, trust)
        self.peer_validator = choose.validator(variant, policies.coordinator, trust)

    def policies(self, policy: Any) -> PeerPolicies:
        """What this agent's validators and seal take from ``policy`` (attestation/policy.py ``peer_policies``)."""
        return peer_policies(self.variant, policy, self.measurement.value if self.measurement is not None else None)

    @property
    def certified_aks(self) -> Any:
        """The AKs the validators certified (qemu-vtpm-ek; None for the other variants)."""
        return getattr(self.peer_validator, "certified_aks", None)


def measure_and_unseal(config: AgentConfig, attestation: AgentAttestation, log) -> SealedStorage:
    """PCR 13 <- the agent's code and trust configuration (variants that quote PCRs); then the storage key is
    unsealed (agent/storage_key.py: never resealed to the policy file found on disk, whose version must not be below
    the sealed floor). A variant that quotes no PCRs (sev-snp) still keeps its secrets sealed to a TPM, to no PCR
    (core/at_rest.py): StateError naming ``tcti`` when this host has none."""
    if not attestation.seals:  # the test suite's dummy variant: no TPM, nothing sealed
        return PlainStorage()
    try:
        storage = storage_key.measure_and_unseal(config, attestation.measurement, attestation.sealed_pcrs, log,
                                                 tpm_only=attestation.measurement is None)
    except AttestationError as err:
        if attestation.measurement is not None:
            raise
        raise StateError("tcti: variant %s quotes no TPM, but the agent seals its secrets at rest and keeps its node "
                         "lock (PCR 15) in one, and none could be opened (%s): give this host a TPM (a vTPM, or "
                         "swtpm as the lab does) and set tcti" % (config.variant, err)) from None
    storage_key.check_policy_file(storage, config.state_dir, attestation.policy, config.measurements)
    return storage


def open_sealed_store(config: AgentConfig, at_rest: SealedStorage):
    """A file store is sealed as a whole (core/at_rest.py); the default one is <state_dir>/store.json."""
    # The WireGuard key was once kept in plain form next to the store: it goes (the sealed store holds it now).
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(config.state_dir, "%s.key" % config.vpn_interface))
    return open_store(config.store or {"type": "file", "path": os.path.join(config.state_dir, "store.json")},
                      cipher=at_rest)


def read_disk_uuid(config: AgentConfig, state_disk: Any) -> str:
    """A formatted state disk's LUKS2 UUID is the disk UUID (the Coordinator derives the disk key for it); else
    the disk UUID file's, created once."""
    header_uuid = state_disk.header_uuid() if state_disk is not None else None
    if header_uuid:
        return normalize_disk_uuid(header_uuid)
    path = config.state_disk_uuid_file or os.path.join(config.state_dir, "disk_uuid")
    try:
        with open(path, encoding="ascii") as handle:
            return normalize_disk_uuid(handle.read().strip())
    except FileNotFoundError:
        value = new_disk_uuid()
        with open(path, "w", encoding="ascii") as handle:
            handle.write(value + "\n")
        return value
