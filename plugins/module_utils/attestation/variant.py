# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The record of an attestation variant (name and OID, docs/attestation.md, "Variants and their OIDs") and the interface every issuer
and validator follows.

aTLS (atls.py) only knows this interface: an issuer turns (user_data, nonce) into a
document; a validator turns (document, nonce) into a Validation or raises AttestationError.
Which variants exist, and looking one up by name, is the chooser's (choose.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Protocol, Tuple


@dataclass(frozen=True)
class Variant:
    """A variant's name, the OID its issuers write, and ``alias_oids``: earlier OIDs of the same variant
    that a verifier still reads as this variant and no issuer writes (docs/attestation.md, "Variants and
    their OIDs")."""

    name: str
    oid: str
    alias_oids: Tuple[str, ...] = ()

    @property
    def oids(self) -> Tuple[str, ...]:
        """Every OID a verifier takes for this variant: the issued one first, then the aliases."""
        return (self.oid,) + tuple(self.alias_oids)


# Constellation's variants (docs/attestation.md, "Variants and their OIDs"): their names and OIDs are fixed by Constellation. Ours, and
# which variants exist at all, are the chooser's registrations (choose.py), the one registry.
DUMMY = Variant("dummy", "1.3.9900.1.1")
QEMU_VTPM = Variant("qemu-vtpm", "1.3.9900.5.1")
AWS_SEV_SNP = Variant("aws-sev-snp", "1.3.9900.2.2")
AZURE_SEV_SNP = Variant("azure-sev-snp", "1.3.9900.4.1")


@dataclass
class PCRCheck:
    """One row of the per-PCR table a validation produces."""
    index: int
    expected: str  # lower-case hex
    found: str  # lower-case hex, "" if the quote did not cover it
    warn_only: bool
    ok: bool
    # A PCR with named alternatives (the agents a document accepts on PCR 13): the one that matched ("" when none
    # did), and every accepted value by name; ``expected`` is then the matched value, or "one of name=hex, ...".
    matched: str = ""
    accepted: Dict[str, str] = field(default_factory=dict)


@dataclass
class Validation:
    """What a successful validation returns."""
    user_data: bytes
    pcrs: Dict[int, bytes] = field(default_factory=dict)  # SHA-256 bank as quoted and verified
    checks: List[PCRCheck] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    # The name of the accepted measurements set the peer matched (measurements.py; "default" for a plain policy).
    measurement_set: Optional[str] = None
    # The AK that signed the quote (TPM variants), and the SHA-256 of the public key of the EK it was certified
    # through (hex of the SubjectPublicKeyInfo DER; qemu-vtpm-ek only): who the TPM is, for the join's admission.
    ak_pub: Optional[bytes] = None
    ek_pub_sha256: Optional[str] = None
    # SEV-SNP variants: the verified report (sev_snp.VerifiedReport.to_dict(): the report's fields by AMD's names,
    # bytes as hex, plus ``product`` and ``signing_key``), for verify.yml and attestation_info.
    snp: Optional[Dict[str, Any]] = None


class Issuer(Protocol):
    oid: str

    def issue(self, user_data: bytes, nonce: bytes) -> bytes:
        """Returns the attestation document binding user_data and nonce."""


class Validator(Protocol):
    """``validate_inline`` (optional, default False): True declares that ``validate`` does no I/O and
    takes time bounded by the document's size limit, so aTLS runs it in the calling thread; any
    other validator runs under the attestation deadline, in a worker thread (atls.py).
    ``alias_oids`` (optional, default none): the variant's earlier OIDs it also validates (``accepts``)."""

    oid: str

    def validate(self, document: bytes, nonce: bytes) -> Validation:
        """Checks the document against nonce and policy; raises AttestationError."""


def accepts(validator: Validator, oid: str) -> bool:
    """Whether ``validator`` validates documents that carry ``oid``: its variant's OID or one of the
    variant's aliases (``Variant.alias_oids``)."""
    return oid == validator.oid or oid in tuple(getattr(validator, "alias_oids", ()))
