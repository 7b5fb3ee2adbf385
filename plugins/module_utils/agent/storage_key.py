# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent's storage key at start and when the accepted measurement sets change (core/at_rest.py; docs/agent.md
"Secrets at rest"; docs/security.md "At rest").

At start the agent measures itself into PCR 13 (on an ordinary host, deployment_mode ``host``; the node image's
agent does not: attestation/deployment.py ``extends_agent_pcr``), then unseals its storage key with the blobs it has. It does NOT
seal the key again to the sets of the policy file it found on disk: nothing protects that file offline, so an
edited file would decide what the key is sealed to. Only a signed document received over the API
(SetMeasurements on a Coordinator, GetMeasurements on a Node) reseals the key (``reseal``).

The version of the newest document this agent applied is its floor, kept in ``<state_dir>/measurements_floor``,
encrypted with the sealed storage key: a policy file older than the floor (an older signed version put back on
the disk) is refused at start, and an older document over the API is refused too."""

from __future__ import annotations

import json
import os
from typing import Callable, Optional, Sequence

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import deployment
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.agent_measurement import measure
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import policy_version
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.tpm import open_tpm
from ansible_collections.constellation.cluster.plugins.module_utils.constants import PCR_INDEX_AGENT
from ansible_collections.constellation.cluster.plugins.module_utils.core.at_rest import SealedStorage, seal_predictions
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError

FLOOR_FILE = "measurements_floor"


def measure_and_unseal(config, measurement, pcrs: Sequence[int], log: Callable, tpm_only: bool = False) -> SealedStorage:
    """PCR 13 <- the agent's code and trust configuration (host mode only); then the storage key is unsealed with
    the blobs the agent has (or made and sealed to the current values of ``pcrs`` on the first start). Nothing is
    resealed. ``tpm_only`` (``measurement`` None): the variant quotes no PCRs (sev-snp); nothing is measured and a
    key sealed to no PCR, bound to this TPM alone, is what it keeps (core/at_rest.py)."""
    if measurement is None:
        log("agent_not_measured", pcr=PCR_INDEX_AGENT, variant=config.variant,
            message="variant %s quotes no PCRs: PCR %d is not extended; the storage key is bound to this TPM only"
            % (config.variant, PCR_INDEX_AGENT))
    elif deployment.extends_agent_pcr(config.deployment_mode):
        _measure(config, measurement, log)
    else:
        log("agent_not_measured", pcr=PCR_INDEX_AGENT, deployment_mode=config.deployment_mode,
            message="the node image's boot chain measures this agent (PCR 11: the UKI with the dm-verity root hash); "
            "PCR %d is left at zero" % PCR_INDEX_AGENT)
    return SealedStorage.open(config.state_dir, lambda: open_tpm(config.tcti), pcrs, log=log,
                              replayable=deployment.replayable_pcrs(config.deployment_mode), tpm_only=tpm_only)


def _measure(config, measurement, log: Callable) -> None:
    with open_tpm(config.tcti) as dev:
        outcome = measure(dev, measurement)
    fields = dict(pcr=PCR_INDEX_AGENT, value=measurement.value.hex(), **{name: digest.hex() for name, digest in measurement.events})
    if outcome == "conflict":
        log("agent_measured", level="error", outcome=outcome, message="PCR %d held another agent's measurement since "
            "the boot (an agent replaced without a reboot): no policy accepts this host until it reboots; reboot this "
            "host" % PCR_INDEX_AGENT, **fields)
    else:
        log("agent_measured", outcome=outcome, **fields)


def reseal(storage: SealedStorage, sets, deployment_mode: str, log: Callable) -> None:
    """The storage key sealed to each set of a signed document received over the API (an image upgrade's next boot)."""
    if storage.reseal(seal_predictions(sets, deployment_mode)):
        log("storage_key_resealed", sets=",".join(storage.sealed_sets), unsealed_with=storage.unsealed_with)


def floor(storage: SealedStorage, state_dir: str) -> Optional[int]:
    """The version floor kept sealed, or None before one was written."""
    data = storage.read_file(os.path.join(state_dir, FLOOR_FILE))
    if data is None:
        return None
    try:
        return int(json.loads(data.decode("utf-8"))["version"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise StateError("%s is not one this agent wrote (corrupt): reset this host's state folder" % FLOOR_FILE) from None


def raise_floor(storage: SealedStorage, state_dir: str, version: int) -> None:
    """Keeps ``version`` as the floor (never lowers it)."""
    current = floor(storage, state_dir)
    if current is None or version > current:
        storage.write_file(os.path.join(state_dir, FLOOR_FILE), json.dumps({"version": int(version)}).encode("utf-8"))


def check_policy_file(storage: SealedStorage, state_dir: str, policy, path: Optional[str]) -> None:
    """At start: the policy file's version is not below the sealed floor (StateError naming both); the first
    start keeps the file's version as the floor."""
    version = policy_version(policy)
    kept = floor(storage, state_dir)
    if kept is None:
        raise_floor(storage, state_dir, version)
    elif version < kept:
        raise StateError("the measurements policy file %s has version %d, older than version %d that this agent "
                         "already applied (kept sealed): an older document would bring back retired sets. Put the "
                         "current signed document back (SetMeasurements, or the node_agent role)" % (path, version, kept))


def check_version(storage: SealedStorage, state_dir: str, sets) -> None:
    """A document received over the API is not older than the sealed floor (InputError naming the version)."""
    kept = floor(storage, state_dir)
    if kept is not None and sets.version < kept:
        raise InputError("version", "a version of at least %d (the newest this agent applied): an older document "
                         "would bring back what was retired" % kept, sets.version)
