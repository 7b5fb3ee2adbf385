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
"""

from __future__ import annotations

import binascii
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Tuple, Union

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.variant import PCRCheck
from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_write
from ansible_collections.constellation.cluster.plugins.module_utils.constants import PCR_COUNT, PCR_INDEX_CLUSTER_ID  # noqa: F401 pylint: disable=unused-import
from ansible_collections.constellation.cluster.plugins.module_utils.encoding import load_json, read_text
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError, InputError

# 32 bytes for TPM SHA-256 PCRs, 48 for TDX RTMRs (docs/attestation.md, "Measurements policy").
_ALLOWED_LENGTHS = (32, 48)
_INDEX = re.compile(r"\A[0-9]{1,2}\Z")  # ASCII digits only: "²" is a digit to str.isdigit(), not to int()
# The name a plain (single-set) policy's one set gets, and what a set's name may be (an image version).
DEFAULT_SET_NAME = "default"
ACCEPTED_KEY = "accepted"
VERSION_KEY = "version"
_SET_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._+-]{0,63}\Z")
MAX_SETS = 16


@dataclass(frozen=True)
class Measurement:
    expected: bytes
    warn_only: bool = False


@dataclass
class Measurements:
    """PCR index -> Measurement. ``compare`` is what validators call."""

    pcrs: Dict[int, Measurement] = field(default_factory=dict)

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
        for key, value in data.items():
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
        return cls(pcrs)

    def to_dict(self) -> Dict[str, Dict[str, object]]:
        return {str(index): {"expected": m.expected.hex(), "warnOnly": m.warn_only}
                for index, m in sorted(self.pcrs.items())}

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

    def compare(self, pcrs: Mapping[int, bytes]) -> Tuple[List[PCRCheck], List[str]]:
        """Checks quoted PCR values against the policy, ascending by index.

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
            ok = found is not None and found == measurement.expected
            checks.append(PCRCheck(index, measurement.expected.hex(), found_hex, measurement.warn_only, ok))
            if ok:
                continue
            message = "PCR %d: expected %s, found %s" % (
                index, measurement.expected.hex(), found_hex or "nothing (not quoted)")
            if measurement.warn_only:
                warnings.append(message + " (warn-only)")
            else:
                failures.append(message)
        if failures:
            raise MeasurementsMismatch("measurements mismatch: " + "; ".join(failures), checks, warnings)
        return checks, warnings

    # A plain policy is one accepted set named DEFAULT_SET_NAME (the MeasurementSets interface).
    @property
    def sets(self) -> Dict[str, "Measurements"]:
        return {DEFAULT_SET_NAME: self}

    def match(self, pcrs: Mapping[int, bytes]) -> Tuple[str, List[PCRCheck], List[str]]:
        """``compare`` that also names the set that matched (always DEFAULT_SET_NAME here)."""
        checks, warnings = self.compare(pcrs)
        return DEFAULT_SET_NAME, checks, warnings


class MeasurementSets:
    """Several named accepted sets (an image upgrade: the old image's and the new one's). A peer passes when
    it matches any set; ``match`` says which. Immutable: a new document is a new object (the agent swaps it)."""

    def __init__(self, sets: Mapping[str, Measurements], version: int = 0):
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

    @property
    def sets(self) -> Dict[str, Measurements]:
        return dict(self._sets)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MeasurementSets) and self._sets == other._sets and self.version == other.version

    def __repr__(self) -> str:
        return "MeasurementSets(%s, version=%d)" % (", ".join(self._sets), self.version)

    @classmethod
    def from_dict(cls, data: Mapping) -> "MeasurementSets":
        """``{"version": N, "accepted": {name: <set>}}`` (version optional, 0); the plain form becomes one set
        named DEFAULT_SET_NAME, version 0."""
        if isinstance(data, Mapping) and ACCEPTED_KEY in data and set(data) <= {ACCEPTED_KEY, VERSION_KEY}:
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
            return cls(sets, data.get(VERSION_KEY, 0))
        if isinstance(data, Mapping) and ACCEPTED_KEY in data:
            raise InputError("measurements", "only the keys accepted and version next to accepted",
                             sorted(str(k) for k in set(data) - {ACCEPTED_KEY, VERSION_KEY}))
        return cls({DEFAULT_SET_NAME: Measurements.from_dict(data)})

    def to_dict(self) -> Dict[str, object]:
        out: Dict[str, object] = {VERSION_KEY: self.version} if self.version else {}
        out[ACCEPTED_KEY] = {name: policy.to_dict() for name, policy in self._sets.items()}
        return out

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    def match(self, pcrs: Mapping[int, bytes]) -> Tuple[str, List[PCRCheck], List[str]]:
        """(name of the first set, in document order, that ``pcrs`` match; its table; its warnings). Raises
        MeasurementsMismatch naming every set's mismatches when none matches (its table: the closest set's)."""
        misses = []
        for name, policy in self._sets.items():
            try:
                checks, warnings = policy.compare(pcrs)
            except MeasurementsMismatch as err:
                misses.append((name, err))
                continue
            return name, checks, warnings
        if len(misses) == 1:
            raise misses[0][1]
        _name, closest = min(misses, key=lambda item: sum(1 for c in item[1].checks if not c.ok and not c.warn_only))
        text = "; ".join("set %s: %s" % (name, str(err)[len("measurements mismatch: "):]) for name, err in misses)
        raise MeasurementsMismatch("measurements mismatch: no accepted set matches (%s): %s"
                                   % (", ".join(self._sets), text), closest.checks, closest.warnings)

    def compare(self, pcrs: Mapping[int, bytes]) -> Tuple[List[PCRCheck], List[str]]:
        """Measurements.compare's contract: the matched set's table and warnings."""
        _name, checks, warnings = self.match(pcrs)
        return checks, warnings


Policy = Union[Measurements, MeasurementSets]


def parse_policy(data: Mapping) -> Policy:
    """A policy document: MeasurementSets for the named form (``{"accepted": ...}``), Measurements otherwise."""
    if isinstance(data, Mapping) and ACCEPTED_KEY in data:
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
        return MeasurementSets({name: transform(m) for name, m in policy.sets.items()}, policy.version)
    return transform(policy)


def check_set_name(name: object) -> str:
    if not isinstance(name, str) or not _SET_NAME.match(name):
        raise InputError("measurements.accepted", "set names of 1-64 characters [A-Za-z0-9._+-], starting with a letter "
                         "or digit", name if isinstance(name, str) else type(name).__name__)
    return name


class MeasurementsMismatch(AttestationError):
    """An enforced PCR did not match; carries the full table for reports (verify.yml)."""

    def __init__(self, message: str, checks: List[PCRCheck], warnings: List[str]):
        super().__init__(message)
        self.checks = checks
        self.warnings = warnings


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
