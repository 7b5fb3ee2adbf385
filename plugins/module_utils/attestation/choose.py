# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one attestation chooser (Constellation's ``internal/attestation/choose``), the one registry
of variants.

Every place that offers a variant takes it from here: the argument specs and doc fragment
(``VARIANT_NAMES``), the agent's configuration, the atls connection plugin and the lab. A variant
is one ``VariantSpec``: its record (name and OID, ``variant.Variant``), whether it needs a measurements
policy and EK CA certificates, and the module that makes its issuer and validator (``vtpm.py``,
``ek.py``, ``dummy.py``). That module is imported only when the variant is chosen, so importing this
module costs nothing (modules and task workers import it); ``all_variants.py`` imports every such
module of the collection for Ansible's module packer.

A variant's earlier OIDs (``Variant.alias_oids``) are registered with it: its validators read them
(``variant.accepts``; they declare them as ``alias_oids``), its issuers never write them.

Adding a variant (docs/extending.md): its module, one ``register(VariantSpec(...))`` here, its module in
``all_variants.py`` and its name in the literal choice lists Ansible reads without Python; the tests in
the repository's test_choose.py find those lists and fail until they agree with the registrations.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Dict, Optional, Sequence, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.variant import (
    AWS_SEV_SNP,
    AZURE_SEV_SNP,
    DUMMY,
    QEMU_VTPM,
    Variant,
)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError

# The package of the collection's variant modules (VariantSpec.module).
PACKAGE = "ansible_collections.constellation.cluster.plugins.module_utils.attestation"

# Secure by default: the AK is trusted only through the TPM's EK certificate chain.
# qemu-vtpm (Constellation's, trusts any AK) needs the acknowledgement insecure_trust_any_ak.
QEMU_VTPM_EK_NAME = "qemu-vtpm-ek"
DEFAULT_VARIANT = QEMU_VTPM_EK_NAME
# dummy (no security) is accepted only where this environment variable is 1: the test suite sets it.
TEST_SUITE_ENV = "CONSTELLATION_TEST_SUITE"
INSECURE_TRUST_ANY_AK = "insecure_trust_any_ak"
# Fixed here (not in ek.py) so that listing variants imports no TPM code; ek.py uses this record.
# Short arcs in Constellation's QEMU branch, above its placeholder .99 (qemu-tdx): every cryptography
# encodes it, Debian 12's 38 included (docs/attestation.md, "Variant `qemu-vtpm-ek` (ours)").
QEMU_VTPM_EK_OID = "1.3.9900.5.100"
# The OID of a 0.2.0 checkout (a UUID OID): validators still read it as this variant, no issuer writes
# it. cryptography before 44 cannot parse its 128-bit arc: there a certificate carrying it is refused
# as not valid X.509, and the alias is simply unused.
QEMU_VTPM_EK_OLD_OID = "2.25.48000548495140104094697751808415705683"
QEMU_VTPM_EK = Variant(QEMU_VTPM_EK_NAME, QEMU_VTPM_EK_OID, alias_oids=(QEMU_VTPM_EK_OLD_OID,))
# KVM and bare-metal AMD SEV-SNP guests without a vTPM: the CPU's report alone (docs/attestation.md, "Variant
# `sev-snp` (ours)"); the next arc after qemu-vtpm-ek's in Constellation's QEMU branch. snp.py uses this record.
SEV_SNP_OID = "1.3.9900.5.101"
SEV_SNP = Variant("sev-snp", SEV_SNP_OID)


@dataclass(frozen=True)
class Trust:
    """What a validator trusts beyond the policy: the EK CA certificates (qemu-vtpm-ek) and the
    registry of AKs certified through them (shared by every validator of one process); for SEV-SNP
    variants the AMD roots (sev_snp.AMDRoots: AMD's pinned ARKs unless a bundle was given) and the
    process's cache of verified VCEK/VLEK chains (sev_snp.ChainCache)."""

    ek_ca_certs: Tuple[Any, ...] = ()
    certified_aks: Any = None  # ek.CertifiedAKs
    insecure_trust_any_ak: bool = False  # the acknowledgement qemu-vtpm needs (check_variant_allowed)
    amd_roots: Any = None  # sev_snp.AMDRoots
    snp_cache: Any = None  # sev_snp.ChainCache


@dataclass(frozen=True)
class VariantSpec:
    """One attestation variant.

    ``module`` is the dotted name of the module that makes the variant's issuer and validator with
    ``make_issuer(tcti=None, **kwargs)`` and ``make_validator(policy, trust)`` (a ``Trust``); the
    chooser imports it when the variant is first used. ``needs_amd_roots``: its validator verifies AMD
    SEV-SNP reports (``Trust.amd_roots``); ``quotes_pcrs``: its documents carry a TPM quote of PCRs (False:
    nothing adds PCR requirements for it, docs/attestation.md, "AMD SEV-SNP reports")."""

    variant: Variant
    summary: str
    module: str
    needs_policy: bool = True
    needs_ek_ca: bool = False
    enrolls: bool = False  # the validator trusts an AK only after EnrollAK (ek.py)
    for_tests_only: bool = False  # refused unless CONSTELLATION_TEST_SUITE=1
    trusts_any_ak: bool = False  # needs the acknowledgement insecure_trust_any_ak, and warns
    needs_amd_roots: bool = False  # verifies AMD SEV-SNP reports: Trust.amd_roots (pinned unless configured)
    quotes_pcrs: bool = True  # False: no TPM quote, so no PCR requirement is added (agent PCR 13, PCR 15)

    @property
    def name(self) -> str:
        return self.variant.name

    @property
    def oid(self) -> str:
        return self.variant.oid

    def implementation(self) -> ModuleType:
        """The module with ``make_issuer`` and ``make_validator``, imported now if it was not yet."""
        return importlib.import_module(self.module)


_SPECS: Dict[str, VariantSpec] = {}


def register(spec: VariantSpec) -> VariantSpec:
    """Adds a variant to the chooser. OIDs are never reused, aliases included: ValueError if another
    variant has one of this one's OIDs (issued or alias)."""
    for known in _SPECS.values():
        taken = set(known.variant.oids) & set(spec.variant.oids) if known.name != spec.name else set()
        if taken:
            raise ValueError("OID %s already belongs to %s" % (sorted(taken)[0], known.name))
    _SPECS[spec.name] = spec
    return spec


register(VariantSpec(QEMU_VTPM, "vTPM quote; the AK is trusted as Constellation does (unconditionally)",
                     PACKAGE + ".vtpm", trusts_any_ak=True))
register(VariantSpec(QEMU_VTPM_EK,
                     "vTPM quote; the AK is trusted only after EK certificate chain + credential activation",
                     PACKAGE + ".ek", needs_ek_ca=True, enrolls=True))
register(VariantSpec(SEV_SNP, "AMD SEV-SNP report (no TPM): signed by the CPU's VCEK/VLEK, chained to AMD's roots",
                     PACKAGE + ".snp", needs_amd_roots=True, quotes_pcrs=False))
register(VariantSpec(AZURE_SEV_SNP, "vTPM quote on Azure; the AK is trusted because the SEV-SNP report (AMD's roots) "
                     "binds it through the paravisor's runtime data", PACKAGE + ".azure_snp", needs_amd_roots=True))
register(VariantSpec(AWS_SEV_SNP, "vTPM quote on AWS; the AK is trusted because the SEV-SNP report (AMD's roots) binds "
                     "its SHA-512", PACKAGE + ".aws_snp", needs_amd_roots=True))
register(VariantSpec(DUMMY, "no TPM and no security: tests only", PACKAGE + ".dummy",
                     needs_policy=False, for_tests_only=True))

# The names every argument spec, doc fragment, agent config, plugin and the lab offer.
VARIANT_NAMES: Tuple[str, ...] = tuple(_SPECS)


def names() -> Tuple[str, ...]:
    """The variants registered now (VARIANT_NAMES plus any registered later)."""
    return tuple(_SPECS)


def unregister(name: str) -> None:
    """Removes a variant registered after import (a test's toy variant); the built-in ones stay."""
    if name in VARIANT_NAMES:
        raise ValueError("variant %s is built in" % name)
    _SPECS.pop(name, None)


def spec(name: Any, field: str = "variant") -> VariantSpec:
    """The variant called ``name``; InputError naming ``field`` and the choices otherwise."""
    if isinstance(name, str) and name in _SPECS:
        return _SPECS[name]
    raise InputError(field, "one of %s" % ", ".join(_SPECS), name)


def in_test_suite() -> bool:
    """Whether this process runs under the test suite (``CONSTELLATION_TEST_SUITE=1``)."""
    return os.environ.get(TEST_SUITE_ENV) == "1"


def check_variant_allowed(name: Any, insecure_trust_any_ak: Any = False, field: str = "variant",
                          ack_field: str = INSECURE_TRUST_ANY_AK) -> VariantSpec:
    """The one rule of which variants may be used, for agent, actions, modules and the
    connection plugin alike:

    * ``dummy`` (no security) only under the test suite (``CONSTELLATION_TEST_SUITE=1``);
    * ``qemu-vtpm`` (trusts any AK: a software key that claims to be a restricted TPM key passes)
      only with the explicit acknowledgement ``insecure_trust_any_ak`` (the caller then warns, see
      ``insecure_warning``);
    * every other variant (the default ``qemu-vtpm-ek``) as it is.

    InputError naming ``field`` (the variant option) or ``ack_field`` (the acknowledgement)."""
    chosen = spec(name, field)
    if chosen.for_tests_only and not in_test_suite():
        raise InputError(field, "a variant with security (%s); %s proves nothing and is accepted only by the test "
                         "suite (%s=1)" % (DEFAULT_VARIANT, chosen.name, TEST_SUITE_ENV), chosen.name)
    if chosen.trusts_any_ak and insecure_trust_any_ak is not True:
        raise InputError(ack_field, "true to use variant %s, which trusts ANY attestation key (a software key that "
                         "declares itself a TPM key passes); use variant %s with the EK CA certificates of your "
                         "TPMs instead, or set %s: true to accept that" % (chosen.name, DEFAULT_VARIANT, ack_field),
                         insecure_trust_any_ak)
    return chosen


def insecure_warning(name: Any) -> Optional[str]:
    """The warning to give on every run/start where variant ``name`` was allowed insecurely."""
    chosen = _SPECS.get(name) if isinstance(name, str) else None
    if chosen is not None and chosen.trusts_any_ak:
        return ("variant %s trusts ANY attestation key (insecure_trust_any_ak): a software key that declares itself a "
                "TPM key passes attestation; use %s with EK CA certificates" % (chosen.name, DEFAULT_VARIANT))
    if chosen is not None and chosen.for_tests_only:
        return "variant %s proves nothing (test suite only)" % chosen.name
    return None


def issuer(name: str, tcti: Optional[str] = None, **kwargs):
    """The issuer of variant ``name`` on a TCTI (``None``: the default TPM device). ``dummy`` only
    under the test suite (an issuer trusts nothing, so qemu-vtpm needs no acknowledgement here)."""
    chosen = spec(name)
    if chosen.for_tests_only:
        check_variant_allowed(name)
    return chosen.implementation().make_issuer(tcti, **kwargs)


def validator(name: str, policy=None, trust: Optional[Trust] = None, insecure_trust_any_ak: bool = False):
    """The validator of variant ``name``; ``policy`` is required where the variant needs one.
    ``qemu-vtpm`` needs ``insecure_trust_any_ak`` (here or in ``trust``); ``dummy`` the test suite."""
    trust = trust or Trust()
    chosen = check_variant_allowed(name, bool(insecure_trust_any_ak or trust.insecure_trust_any_ak))
    if chosen.needs_policy and policy is None:
        raise InputError("measurements", "a measurements policy (variant %s checks PCRs)" % chosen.name)
    if chosen.needs_ek_ca and not trust.ek_ca_certs:
        raise InputError("ek_ca_path", "the EK CA certificate(s) that variant %s trusts TPMs through" % chosen.name)
    if chosen.needs_amd_roots and (trust.amd_roots is None or trust.snp_cache is None):
        sev_snp = importlib.import_module(PACKAGE + ".sev_snp")
        trust = dataclasses.replace(trust, amd_roots=trust.amd_roots or sev_snp.pinned_roots(),
                                    snp_cache=trust.snp_cache or sev_snp.process_cache())
    return chosen.implementation().make_validator(policy, trust)


def load_trust(name: str, ek_ca_path: Optional[Any], basedir: Optional[str] = None,
               field: str = "ek_ca_path", insecure_trust_any_ak: Any = False, amd_roots_path: Optional[Any] = None,
               amd_roots_field: str = "amd_roots") -> Trust:
    """The Trust for variant ``name`` (allowed only as ``check_variant_allowed`` says): EK CA
    certificates from ``ek_ca_path`` where the variant needs them: a PEM file (a bundle of several
    CAs is fine), a folder of PEM files, or a list of them; relative paths are relative to
    ``basedir``. Self-signed CAs are the trust anchors; other CA certificates are intermediates.
    Where the variant verifies SEV-SNP reports: AMD's pinned roots, unless ``amd_roots_path`` (the same
    forms; each self-signed certificate an ARK, the others ASK/ASVK) names another bundle (the lab's AMD)."""
    chosen = check_variant_allowed(name, insecure_trust_any_ak)
    trust = Trust(insecure_trust_any_ak=bool(chosen.trusts_any_ak))
    if chosen.needs_amd_roots:
        sev_snp = importlib.import_module(PACKAGE + ".sev_snp")
        roots = (sev_snp.load_roots(_resolve_paths(amd_roots_path, basedir, amd_roots_field), amd_roots_field)
                 if amd_roots_path else sev_snp.pinned_roots())
        trust = dataclasses.replace(trust, amd_roots=roots, snp_cache=sev_snp.process_cache())
    if not chosen.needs_ek_ca:
        return trust
    if not ek_ca_path:
        raise InputError(field, "the EK CA certificate file(s) or folder (PEM) for variant %s" % chosen.name, None)
    resolved = _resolve_paths(ek_ca_path, basedir, field)
    ek = importlib.import_module(PACKAGE + ".ek")
    certs = ek.load_ca_certs(resolved, field)
    importlib.import_module(PACKAGE + ".ek_certs").check_trust_anchors(certs, field)
    return dataclasses.replace(trust, ek_ca_certs=tuple(certs), certified_aks=ek.CertifiedAKs(certs))


def _resolve_paths(value: Any, basedir: Optional[str], field: str) -> list:
    paths: Sequence[Any] = value if isinstance(value, (list, tuple)) else [value]
    resolved = []
    for path in paths:
        if not isinstance(path, str):
            raise InputError(field, "a path to a PEM file or a folder of them", type(path).__name__)
        if basedir and not os.path.isabs(path):
            path = os.path.join(basedir, path)
        resolved.append(path)
    return resolved
