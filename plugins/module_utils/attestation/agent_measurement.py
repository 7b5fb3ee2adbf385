# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The measured agent (docs/attestation.md, "The agent's PCR"): what the node agent extends into PCR 13
before it serves anything, and the value every validator expects there.

Two events, in this order, each a SHA-256 digest extended into the SHA-256 bank (TPM2_PCR_Extend):

1. ``agent_code``: SHA-256 of the agent's code, the lines ``<relative path> <sha256 hex>\\n`` of every ``*.py``
   file under the collection's ``plugins/module_utils`` (what the node_agent role's archive holds), sorted by path;
2. ``agent_config``: SHA-256 of the canonical JSON of the agent's *trust configuration*, what decides which
   attestation keys it accepts: the attestation variant and the EK trust anchors (SHA-256 of each CA certificate,
   sorted; none for variants without EK roots).

PCR 13 = SHA-256(SHA-256(0^32 || code) || config), replayable from the two events the agent logs
(``agent_measured``) and reports in GetState. Host-specific settings (addresses, ports, paths, intervals, the
per-host init secret hash) are not measured: the same value holds on every peer of a cluster, so one policy entry
covers all of them. The measurements policy is not measured: it holds PCR 13's expected value, and its signature is
checked against the pinned key when it is loaded (a host may hold a signed or an unsigned copy of one policy).

Which values pass on PCR 13 (``enforce_agent_pcr``, the one rule of every validator: the Coordinator, the
controller's actions, the atls connection and the agent): those of the ``agents`` the signed measurements document
lists, by name (attestation/measurements.py), in every set; a document that lists none accepts only the value the
validator computes itself from the code it runs and the trust configuration it was given (OWN_AGENT). Any entry a
policy set has for PCR 13 is replaced (Constellation's images list it as reserved, zero). So a cluster runs the
agents its document names - two during an agent upgrade - and a changed agent file or trust setting that no entry
names yields another value: the host is refused at activation and evicted by re-attestation.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.constants import PCR_INDEX_AGENT
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError

MEASURED_CONFIG_VERSION = 1
_MODULE_UTILS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CACHE: Dict[str, bytes] = {}
# The name of the agent a validator accepts where the measurements document lists no ``agents``: its own value.
OWN_AGENT = "self"
AGENT_LABEL = "the agent"


def code_root() -> str:
    """The ``plugins/module_utils`` folder this code runs from (what the agent measures about itself)."""
    return _MODULE_UTILS


def code_digest(root: Optional[str] = None) -> bytes:
    """SHA-256 of the agent's code under ``root`` (default: the running code), as the module docstring says."""
    root = os.path.abspath(root or _MODULE_UTILS)
    cached = _CACHE.get(root)
    if cached is not None:
        return cached
    entries: List[Tuple[str, str]] = []
    if not os.path.isdir(root):
        raise AttestationError("the agent's code folder %s does not exist (cannot measure the agent)" % root)
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, "rb") as handle:
                    entries.append((os.path.relpath(path, root).replace(os.sep, "/"), hashlib.sha256(handle.read()).hexdigest()))
    listing = "".join("%s %s\n" % entry for entry in sorted(entries))
    digest = hashlib.sha256(listing.encode("utf-8")).digest()
    _CACHE[root] = digest
    return digest


def measured_config(variant: str, ek_ca_certs: Sequence[Any] = ()) -> Dict[str, Any]:
    """The trust configuration that is measured: ``ek_ca_certs`` (cryptography certificates, the Trust's
    ``ek_ca_certs``: the self-signed anchors and the intermediates beside them)."""
    from cryptography.hazmat.primitives import serialization

    anchors = sorted(hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest() for cert in ek_ca_certs)
    return {"version": MEASURED_CONFIG_VERSION, "variant": variant, "ek_ca_sha256": anchors}


def config_digest(config: Dict[str, Any]) -> bytes:
    return hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode("utf-8")).digest()


def extend(old: bytes, digest: bytes) -> bytes:
    """What TPM2_PCR_Extend does to a SHA-256 PCR."""
    return hashlib.sha256(old + digest).digest()


@dataclass(frozen=True)
class AgentMeasurement:
    """The agent's two events and the PCR value they give."""

    code: bytes
    config: bytes

    @classmethod
    def of(cls, variant: str, ek_ca_certs: Sequence[Any] = (), root: Optional[str] = None) -> "AgentMeasurement":
        return cls(code_digest(root), config_digest(measured_config(variant, ek_ca_certs)))

    @property
    def events(self) -> List[Tuple[str, bytes]]:
        return [("agent_code", self.code), ("agent_config", self.config)]

    @property
    def value(self) -> bytes:
        value = bytes(32)
        for _name, digest in self.events:
            value = extend(value, digest)
        return value

    def to_dict(self) -> Dict[str, Any]:
        return {"pcr": PCR_INDEX_AGENT, "value": self.value.hex(),
                "events": [{"event": name, "digest": digest.hex()} for name, digest in self.events]}


def replay(events: Sequence[Dict[str, str]]) -> bytes:
    """PCR 13 from an event list as ``AgentMeasurement.to_dict`` writes it (verify.yml replays it)."""
    value = bytes(32)
    for event in events:
        value = extend(value, bytes.fromhex(event["digest"]))
    return value


def enforce_agent_pcr(policy, own_value: bytes):
    """``policy`` (a Measurements, or each set of a MeasurementSets) with PCR 13 enforced at the value of any agent
    the document accepts (its ``agents``: a named alternative each, so a match says which agent the peer runs), or
    at ``own_value`` - what the validator's own code and trust configuration give - when it lists none. A policy
    file's own PCR 13 entry is replaced; the result is what validators compare, never what is sealed to."""
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
        Measurement, Measurements, accepted_agents, per_set)

    agents = accepted_agents(policy)
    if agents:
        alternatives = tuple((name, agent.value) for name, agent in agents.items())
        expectation = Measurement(alternatives[0][1], False, alternatives, AGENT_LABEL)
    else:
        expectation = Measurement(own_value, False)

    def one(measurements):
        pcrs = dict(measurements.pcrs)
        pcrs[PCR_INDEX_AGENT] = expectation
        return Measurements(pcrs)

    return per_set(policy, one)


def matched_agent(checks) -> Optional[str]:
    """The agent a validation's table says the peer runs: the name of the accepted agent its PCR 13 matched,
    OWN_AGENT where the document lists none; None when PCR 13 was not checked or did not match."""
    for check in checks or ():
        if check.index == PCR_INDEX_AGENT:
            return (check.matched or OWN_AGENT) if check.ok else None
    return None


def measure(tpm, measurement: AgentMeasurement) -> str:
    """Extends PCR 13 of ``tpm`` (attestation/tpm.py's TPM) with the agent's events, once per boot:
    ``"measured"``; ``"already"`` when PCR 13 already holds exactly this measurement (the agent restarted
    without a reboot); ``"conflict"`` when it held something else (another agent or configuration ran since
    the boot: the extension still happens, and no policy accepts the result until the host reboots)."""
    current = tpm.pcr_read("sha256", [PCR_INDEX_AGENT])[PCR_INDEX_AGENT]
    if current == measurement.value:
        return "already"
    for _name, digest in measurement.events:
        tpm.pcr_extend(PCR_INDEX_AGENT, digest)
    return "measured" if current == bytes(32) else "conflict"
