# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The measurements policy: expected PCR values, enforced or warn-only (docs/attestation.md, "Measurements policy").

JSON shape as Constellation's ``measurements.M``: ``{"4": {"expected": "<hex>", "warnOnly": false}}``;
a bare hex string as value is the legacy form and means enforced.

Several accepted sets (a rolling image upgrade, docs/site.md "Upgrade the image"): ``{"accepted": {"<name>":
{"4": {...}, ...}, ...}}``, each set in the shape above; a peer passes when it matches ANY set, and the result
names the set it matched. A plain policy is one set named ``default`` (DEFAULT_SET_NAME). ``parse_policy`` reads
both forms: a ``Measurements`` for the plain form (so a caller that knows only plain policies sees what it expects), a
``MeasurementSets`` for the named form; both have ``sets``, ``match`` and ``compare``, and ``per_set`` applies
a transform (the agent's PCR 13, PCR 15 for fresh nodes, ...) to each set.

The named form may list the agents it accepts beside its sets (docs/attestation.md, "The agent's PCR"):
``{"agents": {"<name>": {"pcr": 13, "value": "<hex>", "events": [{"event": .., "digest": "<hex>"}]}}}``, each entry
what ``AgentMeasurement.to_dict`` writes (``pcr`` and ``events`` optional; events given must replay to the value).
Every set accepts every agent listed; ``attestation/agent_measurement.py`` enforces them on PCR 13.

A set may hold an AMD SEV-SNP policy under the key ``snp`` (sev_snp.SNPPolicy: TCB minimums, launch measurement,
...; docs/attestation.md, "AMD SEV-SNP reports"): plain form ``{"4": {...}, "snp": {...}}``, named form inside each
set. A set with ``snp`` passes only a peer whose verified report passes it; a peer that brings a report is refused
by a set without ``snp`` (fail closed: nobody decided what its report must show).
"""

from __future__ import annotations

import binascii
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Tuple, Union

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import agent_measurement
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.sev_snp import Report, SNPError, SNPPolicy
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.variant import PCRCheck
from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_write
from ansible_collections.constellation.cluster.plugins.module_utils.constants import (  # noqa: F401 pylint: disable=unused-import
    PCR_COUNT, PCR_INDEX_AGENT, PCR_INDEX_CLUSTER_ID)
from ansible_collections.constellation.cluster.plugins.module_utils.encoding import load_json, read_text
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError, InputError

# 32 bytes for TPM SHA-256 PCRs, 48 for TDX RTMRs (docs/attestation.md, "Measurements policy").
_ALLOWED_LENGTHS = (32, 48)
_INDEX = re.compile(r"\A[0-9]{1,2}\Z")  # ASCII digits only: "²" is a digit to str.isdigit(), not to int()
# The name a plain (single-set) policy's one set gets, and what a set's name may be (an image version).
DEFAULT_SET_NAME = "default"
ACCEPTED_KEY = "accepted"
VERSION_KEY = "version"
AGENTS_KEY = "agents"
SNP_KEY = "snp"
_SET_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._+-]{0,63}\Z")
_EVENT_NAME = re.compile(r"\A[A-Za-z0-9_.-]{1,64}\Z")
MAX_SETS = 16
MAX_AGENTS = 16
MAX_AGENT_EVENTS = 16


@dataclass(frozen=True)
class Measurement:
    """One PCR's expected value. ``alternatives``: named values of which any passes (the agents a document accepts
    on PCR 13); ``expected`` is then the first of them, and ``label`` says what the PCR holds in messages."""

    expected: bytes
    warn_only: bool = False
    alternatives: Tuple[Tuple[str, bytes], ...] = ()
    label: str = ""

    def matching(self, found: Optional[bytes]) -> Optional[str]:
        """The name of the alternative ``found`` equals ("" without alternatives), or None when nothing matches."""
        if found is None:
            return None
        if not self.alternatives:
            return "" if found == self.expected else None
        for name, value in self.alternatives:
            if found == value:
                return name
        return None

    def describe_expected(self, matched: Optional[str]) -> str:
        """The expected value as the table and the messages show it: the value that matched, else every
        alternative by name."""
        if not self.alternatives:
            return self.expected.hex()
        if matched is not None:
            return dict(self.alternatives)[matched].hex()
        return "one of " + ", ".join("%s=%s" % (name, value.hex()) for name, value in self.alternatives)


@dataclass(frozen=True)
class AcceptedAgent:
    """An agent a measurements document accepts: its PCR 13 value and, when the document gives them, the events that
    replay to it (agent_measurement.AgentMeasurement)."""

    value: bytes
    events: Tuple[Tuple[str, bytes], ...] = ()

    @classmethod
    def from_dict(cls, name: str, data: object) -> "AcceptedAgent":
        field_name = "%s.%s" % (AGENTS_KEY, name)
        if not isinstance(data, Mapping):
            raise InputError(field_name, "a mapping with value (and optionally pcr and events)", type(data).__name__)
        unknown = set(data) - {"pcr", "value", "events"}
        if unknown:
            raise InputError(field_name, "only the keys pcr, value and events", sorted(str(k) for k in unknown))
        if "pcr" in data and (data["pcr"] != PCR_INDEX_AGENT or isinstance(data["pcr"], bool)):
            raise InputError(field_name + ".pcr", "%d (the agent's PCR)" % PCR_INDEX_AGENT, data["pcr"])
        if "value" not in data:
            raise InputError(field_name + ".value", "the agent's PCR %d value, 64 hex characters" % PCR_INDEX_AGENT, None)
        value = _parse_digest(field_name + ".value", data["value"])
        if "events" not in data:
            return cls(value)
        events = data["events"]
        if not isinstance(events, list) or not 0 < len(events) <= MAX_AGENT_EVENTS:
            raise InputError(field_name + ".events", "a list of 1 to %d events {event, digest}" % MAX_AGENT_EVENTS,
                             len(events) if isinstance(events, list) else type(events).__name__)
        parsed = []
        for position, event in enumerate(events):
            where = "%s.events[%d]" % (field_name, position)
            if not isinstance(event, Mapping) or set(event) != {"event", "digest"}:
                raise InputError(where, "a mapping of exactly event and digest",
                                 sorted(str(k) for k in event) if isinstance(event, Mapping) else type(event).__name__)
            if not isinstance(event["event"], str) or not _EVENT_NAME.match(event["event"]):
                raise InputError(where + ".event", "an event name of 1-64 characters [A-Za-z0-9_.-]", event["event"])
            parsed.append((event["event"], _parse_digest(where + ".digest", event["digest"])))
        replayed = agent_measurement.replay([{"digest": digest.hex()} for _event, digest in parsed])
        if replayed != value:
            raise InputError(field_name + ".events", "events that replay to %s.value %s" % (field_name, value.hex()),
                             "they replay to %s" % replayed.hex())
        return cls(value, tuple(parsed))

    def to_dict(self) -> Dict[str, object]:
        out: Dict[str, object] = {"pcr": PCR_INDEX_AGENT, "value": self.value.hex()}
        if self.events:
            out["events"] = [{"event": name, "digest": digest.hex()} for name, digest in self.events]
        return out


@dataclass
class Measurements:
    """PCR index -> Measurement, and optionally what an AMD SEV-SNP report must show (``snp``). ``compare`` is what
    validators call."""

    pcrs: Dict[int, Measurement] = field(default_factory=dict)
    snp: Optional[SNPPolicy] = None

    def with_pcrs(self, pcrs: Mapping[int, Measurement]) -> "Measurements":
        """The same set with other PCR expectations (the transforms of per_set): ``snp`` stays."""
        return Measurements(dict(pcrs), snp=self.snp)

    def __post_init__(self) -> None:
        lengths = set()
        for index, measurement in self.pcrs.items():
            _check_index(index)
            if len(measurement.expected) not in _ALLOWED_LENGTHS:
                raise InputError("measurements[%d].expected" % index, "32 or 48 bytes",
                                 "%d bytes" % len(measurement.expected))
            lengths.add(len(measurement.expected))
        if len(lengths) > 1:
            raise InputError("measurements", "all expected values of equal length",
                             sorted(lengths))

    @classmethod
    def from_dict(cls, data: Mapping) -> "Measurements":
        if not isinstance(data, Mapping):
            raise InputError("measurements", "a mapping of PCR index to {expected, warnOnly}",
                             type(data).__name__)
        pcrs: Dict[int, Measurement] = {}
        snp = None
        for key, value in data.items():
            if key == SNP_KEY:
                snp = SNPPolicy.from_dict(value, SNP_KEY)
                continue
            index = _parse_index(key)
            name = "measurements[%d]" % index
            if isinstance(value, str):
                pcrs[index] = Measurement(_parse_hex("%s" % name, value), False)
                continue
            if isinstance(value, (bytes, bytearray)):
                pcrs[index] = Measurement(bytes(value), False)
                continue
            if not isinstance(value, Mapping):
                raise InputError(name, "a hex string or {expected, warnOnly}", type(value).__name__)
            unknown = set(value) - {"expected", "warnOnly", "warn_only"}
            if unknown:
                raise InputError(name, "only the keys expected and warnOnly", sorted(str(k) for k in unknown))
            if "expected" not in value:
                raise InputError(name + ".expected", "a hex string", None)
            warn_only = value.get("warnOnly", value.get("warn_only", False))
            if not isinstance(warn_only, bool):
                raise InputError(name + ".warnOnly", "a boolean", warn_only)
            expected = value["expected"]
            if isinstance(expected, (bytes, bytearray)):
                expected = bytes(expected)
            else:
                expected = _parse_hex(name + ".expected", expected)
            pcrs[index] = Measurement(expected, warn_only)
        return cls(pcrs, snp=snp)

    def to_dict(self) -> Dict[str, Dict[str, object]]:
        out: Dict[str, Dict[str, object]] = {str(index): {"expected": m.expected.hex(), "warnOnly": m.warn_only}
                                             for index, m in sorted(self.pcrs.items())}
        if self.snp is not None:
            out[SNP_KEY] = self.snp.to_dict()
        return out

    @classmethod
    def loads(cls, text: str) -> "Measurements":
        """A JSON policy (encoding.load_json: bounded; every error is an InputError)."""
        return cls.from_dict(load_json(text, "measurements"))

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def load(cls, path: str) -> "Measurements":
        return cls.loads(read_text(path, "measurements", expected="a readable JSON file"))

    def save(self, path: str) -> None:
        """Atomic (fileutil.atomic_write); a policy is public, so world-readable."""
        atomic_write(path, self.dumps().encode("utf-8"), 0o644)

    def compare(self, pcrs: Mapping[int, bytes],
                snp_report: Optional[Report] = None) -> Tuple[List[PCRCheck], List[str]]:
        """Checks quoted PCR values against the policy, ascending by index, and a verified SEV-SNP report
        against ``snp`` (a set with ``snp`` needs a report that passes it; a report needs a set with ``snp``).

        Returns the per-PCR table and the warn-only mismatches; raises AttestationError on the
        first enforced mismatch (naming the PCR, expected and found value).
        """
        checks: List[PCRCheck] = []
        warnings: List[str] = []
        failures: List[str] = []
        for index in sorted(self.pcrs):
            measurement = self.pcrs[index]
            found: Optional[bytes] = pcrs.get(index)
            found_hex = found.hex() if found is not None else ""
            matched = measurement.matching(found)
            ok = matched is not None
            expected = measurement.describe_expected(matched)
            checks.append(PCRCheck(index, expected, found_hex, measurement.warn_only, ok, matched or "",
                                   {name: value.hex() for name, value in measurement.alternatives}))
            if ok:
                continue
            message = "PCR %d%s: expected %s, found %s" % (
                index, " (%s)" % measurement.label if measurement.label else "", expected,
                found_hex or "nothing (not quoted)")
            if measurement.warn_only:
                warnings.append(message + " (warn-only)")
            else:
                failures.append(message)
        snp_error = self._check_snp(snp_report)
        if snp_error is not None:
            failures.append(str(snp_error))
        if failures:
            raise MeasurementsMismatch("measurements mismatch: " + "; ".join(failures), checks, warnings,
                                       snp_error=snp_error)
        return checks, warnings

    def _check_snp(self, report: Optional[Report]) -> Optional[SNPError]:
        if self.snp is None and report is None:
            return None
        if self.snp is None:
            return SNPError(SNP_KEY, "an SEV-SNP report", "a measurement set with an snp policy (none in this set)")
        if report is None:
            return SNPError(SNP_KEY, "no SEV-SNP report", "a verified report that passes the set's snp policy")
        try:
            self.snp.check(report)
        except SNPError as err:
            return err
        return None

    # A plain policy is one accepted set named DEFAULT_SET_NAME (the MeasurementSets interface).
    @property
    def sets(self) -> Dict[str, "Measurements"]:
        return {DEFAULT_SET_NAME: self}

    def match(self, pcrs: Mapping[int, bytes],
              snp_report: Optional[Report] = None) -> Tuple[str, List[PCRCheck], List[str]]:
        """``compare`` that also names the set that matched (always DEFAULT_SET_NAME here)."""
        checks, warnings = self.compare(pcrs, snp_report)
        return DEFAULT_SET_NAME, checks, warnings


class MeasurementSets:
    """Several named accepted sets (an image upgrade: the old image's and the new one's). A peer passes when
    it matches any set; ``match`` says which. Immutable: a new document is a new object (the agent swaps it)."""

    def __init__(self, sets: Mapping[str, Measurements], version: int = 0,
                 agents: Optional[Mapping[str, AcceptedAgent]] = None):
        if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version < 2 ** 53:
            raise InputError("measurements.version", "an integer >= 0", type(version).__name__)
        self.version = version  # raised by every new document: agents refuse an older one (a replayed, retired set)
        if not isinstance(sets, Mapping) or not sets:
            raise InputError("measurements.accepted", "at least one named set", sets)
        if len(sets) > MAX_SETS:
            raise InputError("measurements.accepted", "at most %d sets" % MAX_SETS, len(sets))
        for name, policy in sets.items():
            check_set_name(name)
            if not isinstance(policy, Measurements):
                raise InputError("measurements.accepted[%s]" % name, "a Measurements set", type(policy).__name__)
        self._sets: Dict[str, Measurements] = dict(sets)
        agents = dict(agents or {})
        if len(agents) > MAX_AGENTS:
            raise InputError(AGENTS_KEY, "at most %d agents" % MAX_AGENTS, len(agents))
        for name, agent in agents.items():
            check_agent_name(name)
            if not isinstance(agent, AcceptedAgent):
                raise InputError("%s.%s" % (AGENTS_KEY, name), "an AcceptedAgent", type(agent).__name__)
        self._agents: Dict[str, AcceptedAgent] = agents

    @property
    def sets(self) -> Dict[str, Measurements]:
        return dict(self._sets)

    @property
    def agents(self) -> Dict[str, AcceptedAgent]:
        """The agents the document accepts on PCR 13, by name, in document order ({}: none listed)."""
        return dict(self._agents)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, MeasurementSets) and self._sets == other._sets and self.version == other.version
                and self._agents == other._agents)

    def __repr__(self) -> str:
        return "MeasurementSets(%s, version=%d)" % (", ".join(self._sets), self.version)

    @classmethod
    def from_dict(cls, data: Mapping) -> "MeasurementSets":
        """``{"version": N, "accepted": {name: <set>}}`` (version optional, 0); the plain form becomes one set
        named DEFAULT_SET_NAME, version 0, no agents."""
        top = {ACCEPTED_KEY, VERSION_KEY, AGENTS_KEY}
        if isinstance(data, Mapping) and AGENTS_KEY in data and ACCEPTED_KEY not in data:
            raise InputError(AGENTS_KEY, "the named form: agents beside accepted sets "
                             "({\"accepted\": {...}, \"agents\": {...}})", sorted(str(k) for k in data))
        if isinstance(data, Mapping) and ACCEPTED_KEY in data and set(data) <= top:
            accepted = data[ACCEPTED_KEY]
            if not isinstance(accepted, Mapping):
                raise InputError("measurements.accepted", "a mapping of set name to measurements",
                                 type(accepted).__name__)
            sets = {}
            for name, value in accepted.items():
                check_set_name(name)
                try:
                    sets[name] = Measurements.from_dict(value)
                except InputError as err:
                    raise InputError("measurements.accepted[%s]" % name, "a valid set", str(err)) from None
            return cls(sets, data.get(VERSION_KEY, 0), _parse_agents(data.get(AGENTS_KEY, {})))
        if isinstance(data, Mapping) and ACCEPTED_KEY in data:
            raise InputError("measurements", "only the keys accepted, version and agents next to accepted",
                             sorted(str(k) for k in set(data) - top))
        return cls({DEFAULT_SET_NAME: Measurements.from_dict(data)})

    def to_dict(self) -> Dict[str, object]:
        out: Dict[str, object] = {VERSION_KEY: self.version} if self.version else {}
        out[ACCEPTED_KEY] = {name: policy.to_dict() for name, policy in self._sets.items()}
        if self._agents:
            out[AGENTS_KEY] = {name: agent.to_dict() for name, agent in self._agents.items()}
        return out

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def match(self, pcrs: Mapping[int, bytes],
              snp_report: Optional[Report] = None) -> Tuple[str, List[PCRCheck], List[str]]:
        """(name of the first set, in document order, that ``pcrs`` (and ``snp_report``) match; its table; its
        warnings). Raises
        MeasurementsMismatch naming every set's mismatches when none matches (its table: the closest set's)."""
        misses = []
        for name, policy in self._sets.items():
            try:
                checks, warnings = policy.compare(pcrs, snp_report)
            except MeasurementsMismatch as err:
                misses.append((name, err))
                continue
            return name, checks, warnings
        if len(misses) == 1:
            raise misses[0][1]
        _name, closest = min(misses, key=lambda item: sum(1 for c in item[1].checks if not c.ok and not c.warn_only))
        text = "; ".join("set %s: %s" % (name, str(err)[len("measurements mismatch: "):]) for name, err in misses)
        raise MeasurementsMismatch("measurements mismatch: no accepted set matches (%s): %s"
                                   % (", ".join(self._sets), text), closest.checks, closest.warnings,
                                   snp_error=closest.snp_error)

    def compare(self, pcrs: Mapping[int, bytes],
                snp_report: Optional[Report] = None) -> Tuple[List[PCRCheck], List[str]]:
        """Measurements.compare's contract: the matched set's table and warnings."""
        _name, checks, warnings = self.match(pcrs, snp_report)
        return checks, warnings


Policy = Union[Measurements, MeasurementSets]


def parse_policy(data: Mapping) -> Policy:
    """A policy document: MeasurementSets for the named form (``{"accepted": ...}``, with ``agents`` or without),
    Measurements otherwise."""
    if isinstance(data, Mapping) and (ACCEPTED_KEY in data or AGENTS_KEY in data):
        return MeasurementSets.from_dict(data)
    return Measurements.from_dict(data)


def policy_version(policy: Optional[Policy]) -> int:
    """The version of a named-sets document (0 for a plain policy or none)."""
    return getattr(policy, "version", 0) or 0


def as_sets(policy: Policy) -> MeasurementSets:
    """Any policy as named sets (a plain one: one set named DEFAULT_SET_NAME)."""
    return policy if isinstance(policy, MeasurementSets) else MeasurementSets({DEFAULT_SET_NAME: policy})


def per_set(policy: Optional[Policy], transform: Callable[[Measurements], Measurements]) -> Optional[Policy]:
    """``transform`` applied to each set; a plain policy stays plain, named sets stay named."""
    if policy is None:
        return None
    if isinstance(policy, MeasurementSets):
        return MeasurementSets({name: transform(m) for name, m in policy.sets.items()}, policy.version, policy.agents)
    return transform(policy)


def check_set_name(name: object, field_name: str = "measurements.accepted", what: str = "set names") -> str:
    if not isinstance(name, str) or not _SET_NAME.match(name):
        raise InputError(field_name, "%s of 1-64 characters [A-Za-z0-9._+-], starting with a letter or digit" % what,
                         name if isinstance(name, str) else type(name).__name__)
    return name


# The name the Coordinator reports for a peer that runs the validator's own agent where the document lists none
# (agent_measurement.OWN_AGENT): a document may not give it to an entry, or the report would be ambiguous.
RESERVED_AGENT_NAME = "self"


def check_agent_name(name: object, field_name: str = AGENTS_KEY) -> str:
    check_set_name(name, field_name, "agent names")
    if name == RESERVED_AGENT_NAME:
        raise InputError(field_name, "an agent name other than %r (reserved for the validator's own agent)"
                         % RESERVED_AGENT_NAME, name)
    return name


def accepted_agents(policy: Optional[Policy]) -> Dict[str, AcceptedAgent]:
    """The agents a policy document accepts ({} for a plain policy, or a document that lists none)."""
    return getattr(policy, "agents", None) or {}


def _parse_agents(data: object) -> Dict[str, AcceptedAgent]:
    if not isinstance(data, Mapping):
        raise InputError(AGENTS_KEY, "a mapping of agent name to {pcr, value, events}", type(data).__name__)
    if len(data) > MAX_AGENTS:
        raise InputError(AGENTS_KEY, "at most %d agents" % MAX_AGENTS, len(data))
    agents = {}
    for name, entry in data.items():
        check_agent_name(name)
        agents[name] = AcceptedAgent.from_dict(name, entry)
    return agents


class MeasurementsMismatch(AttestationError):
    """An enforced PCR did not match, or an SEV-SNP report did not pass the set's ``snp`` policy (``snp_error``
    names the field); carries the full table for reports (verify.yml)."""

    def __init__(self, message: str, checks: List[PCRCheck], warnings: List[str],
                 snp_error: Optional[SNPError] = None):
        super().__init__(message)
        self.checks = checks
        self.warnings = warnings
        self.snp_error = snp_error


def expected_pcr15(cluster_id: bytes) -> bytes:
    """PCR 15 after the node lock: SHA-256(0^32 || SHA-256(cluster_id)) (docs/attestation.md, "PCR 15 and the cluster ID")."""
    return extend_digest(bytes(32), hashlib.sha256(cluster_id).digest())


def extend_digest(old: bytes, digest: bytes) -> bytes:
    """What TPM2_PCR_Extend does to a SHA-256 PCR."""
    return hashlib.sha256(old + digest).digest()


def _check_index(index: int) -> None:
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < PCR_COUNT:
        raise InputError("measurements", "PCR index in 0..%d" % (PCR_COUNT - 1), index)


def _parse_index(key: object) -> int:
    if isinstance(key, int) and not isinstance(key, bool):
        index = key
    elif isinstance(key, str) and _INDEX.match(key):
        index = int(key)
    else:
        raise InputError("measurements", "PCR index in 0..%d" % (PCR_COUNT - 1), key if isinstance(key, (int, str)) else
                         type(key).__name__)
    _check_index(index)
    return index


def _parse_digest(name: str, value: object) -> bytes:
    """A SHA-256 digest or PCR value: 64 hex characters."""
    if not isinstance(value, str) or len(value) != 64:
        raise InputError(name, "64 hex characters (SHA-256)", value if isinstance(value, str) else type(value).__name__)
    try:
        return binascii.unhexlify(value)
    except (binascii.Error, ValueError):
        raise InputError(name, "64 hex characters (SHA-256)", value) from None


def _parse_hex(name: str, value: object) -> bytes:
    if not isinstance(value, str):
        raise InputError(name, "a hex string", type(value).__name__)
    try:
        raw = binascii.unhexlify(value.strip())
    except (binascii.Error, ValueError):
        raise InputError(name, "hex (only hex is accepted, not base64)", value)
    if len(raw) not in _ALLOWED_LENGTHS:
        raise InputError(name, "32 or 48 bytes of hex (64 or 96 characters)", "%d bytes" % len(raw))
    return raw
