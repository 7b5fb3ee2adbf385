# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Attestation variants (SPEC.md 1.6) and the interface every issuer and validator follows.

aTLS (atls.py) only knows this interface: an issuer turns (user_data, nonce) into a
document; a validator turns (document, nonce) into a Validation or raises AttestationError.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Protocol

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError


@dataclass(frozen=True)
class Variant:
    name: str
    oid: str


DUMMY = Variant("dummy", "1.3.9900.1.1")
QEMU_VTPM = Variant("qemu-vtpm", "1.3.9900.5.1")

VARIANTS: Dict[str, Variant] = {v.name: v for v in (DUMMY, QEMU_VTPM)}


def register(variant: Variant) -> Variant:
    """Adds a variant of ours; OIDs of Constellation's variants are never reused."""
    for known in VARIANTS.values():
        if known.oid == variant.oid and known.name != variant.name:
            raise ValueError("OID %s already belongs to %s" % (variant.oid, known.name))
    VARIANTS[variant.name] = variant
    return variant


# Variants of ours that live in their own module and register themselves on import.
_LAZY = {"qemu-vtpm-ek": "ek"}


def from_string(name: str) -> Variant:
    if name not in VARIANTS and name in _LAZY:
        import importlib

        importlib.import_module("ansible_collections.constellation.cluster.plugins.module_utils.attestation." + _LAZY[name])
    try:
        return VARIANTS[name]
    except KeyError:
        raise InputError("attestation_variant", "one of %s" % ", ".join(sorted(set(VARIANTS) | set(_LAZY))), name)


@dataclass
class PCRCheck:
    """One row of the per-PCR table a validation produces."""
    index: int
    expected: str  # lower-case hex
    found: str  # lower-case hex, "" if the quote did not cover it
    warn_only: bool
    ok: bool


@dataclass
class Validation:
    """What a successful validation returns."""
    user_data: bytes
    pcrs: Dict[int, bytes] = field(default_factory=dict)  # SHA-256 bank as quoted and verified
    checks: List[PCRCheck] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)


class Issuer(Protocol):
    oid: str

    def issue(self, user_data: bytes, nonce: bytes) -> bytes:
        """Returns the attestation document binding user_data and nonce."""


class Validator(Protocol):
    oid: str

    def validate(self, document: bytes, nonce: bytes) -> Validation:
        """Checks the document against nonce and policy; raises AttestationError."""
