# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What an operator reads from an SEV-SNP host to write its policy (docs/attestation.md, "Reading a host's report"):
the report inside an attestation document of any SEV-SNP variant, verified to AMD's roots, its fields, and the
measurements document's ``snp`` object that this very report passes (``policy_of``).

The three variants' documents share one part: a top-level ``InstanceInfo``, base64 of Constellation's
``snp.InstanceInfo`` JSON (``AttestationReport``, ``ReportSigner``, ``CertChain``; Azure's adds ``Azure``). Only
that part is read here; binding the report to a nonce and an AK is each variant's validator's work."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Dict, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import amd_certs, sev_snp, snp

MAX_DOCUMENT = 256 * 1024


def _b64(value: Any, what: str) -> bytes:
    if value is None:
        return b""
    if not isinstance(value, str):
        raise AttestationError("%s: expected base64 text, got %s" % (what, type(value).__name__))
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise AttestationError("%s: expected base64 text" % what) from None


def _object(data: bytes, what: str) -> Dict[str, Any]:
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise AttestationError("%s: expected a JSON object" % what) from None
    if not isinstance(value, dict):
        raise AttestationError("%s: expected a JSON object, got %s" % (what, type(value).__name__))
    return value


def instance_info(document: bytes) -> Tuple[bytes, bytes, bytes]:
    """(report, signer, chain) from a document's InstanceInfo; the report cut to its 0x4A0 bytes (Azure's HCL
    hands over the report with its padding)."""
    if not isinstance(document, (bytes, bytearray)) or len(document) > MAX_DOCUMENT:
        raise AttestationError("document: expected at most %d bytes of JSON" % MAX_DOCUMENT)
    doc = _object(bytes(document), "document")
    if "InstanceInfo" not in doc:
        raise AttestationError("document: expected an InstanceInfo (an SEV-SNP variant's document), found none")
    info = snp.decode_instance_info(_b64(doc["InstanceInfo"], "document.InstanceInfo"))
    if len(info.report) < sev_snp.REPORT_SIZE:
        raise AttestationError("InstanceInfo.AttestationReport: expected %d bytes, got %d"
                               % (sev_snp.REPORT_SIZE, len(info.report)))
    return info.report[:sev_snp.REPORT_SIZE], info.report_signer, info.cert_chain


def policy_of(verified: sev_snp.VerifiedReport) -> Dict[str, Any]:
    """The ``snp`` object (Constellation's names) that this report passes exactly: its reported TCB as the
    minimums, its launch measurement, its ID key digest and host data where set, its guest SVN and VMPL. Debug and
    the migration agent stay refused whatever the report says: a policy allowing them is the operator's choice."""
    report = verified.report
    policy: Dict[str, Any] = {
        "bootloaderVersion": report.reported_tcb.bootloader, "teeVersion": report.reported_tcb.tee,
        "snpVersion": report.reported_tcb.snp, "microcodeVersion": report.reported_tcb.microcode,
    }
    if report.reported_tcb.fmc is not None:
        policy["fmcVersion"] = report.reported_tcb.fmc
    policy["launchMeasurement"] = report.measurement.hex()
    if any(report.id_key_digest):
        policy["idKeyDigest"] = report.id_key_digest.hex()
    if any(report.host_data):
        policy["hostData"] = report.host_data.hex()
    policy.update({"guestSvn": report.guest_svn, "vmpl": report.vmpl, "allowDebug": False,
                   "allowMigrationAgent": False})
    return sev_snp.SNPPolicy.from_dict(policy).to_dict()


def inspect(document: bytes, roots: Optional[sev_snp.AMDRoots] = None, cache: Optional[amd_certs.CertCache] = None,
            now=None) -> Dict[str, Any]:
    """The verified report of ``document`` as ``Validation.snp`` has it (the report's fields by AMD's names,
    ``product``, ``signing_key``) plus ``snp_policy``: ``policy_of`` it (``policy`` is the report's guest policy). The report must verify to ``roots`` (default:
    AMD's pinned ones): an operator never copies values from a report nobody signed. A report that came without
    its certificates takes them from ``cache`` (amd_cert_cache)."""
    raw, signer, chain = instance_info(document)
    report = sev_snp.parse_report(raw)
    if not signer:
        if cache is None:
            raise AttestationError("InstanceInfo.ReportSigner is empty: the platform sent no VCEK or VLEK; give "
                                   "amd_cert_cache (docs/attestation.md, \"Certificates at hand\")")
        signer, chain = amd_certs.certs_for_report(report, cache)
    verified = sev_snp.verify_report(report, signer, chain, roots=roots, now=now)
    result = verified.to_dict()
    result["snp_policy"] = policy_of(verified)
    return result
