# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What Constellation's cloud SEV-SNP variants share (``azure-sev-snp``: azure_snp.py, ``aws-sev-snp``: aws_snp.py;
docs/attestation.md, "Variants `azure-sev-snp` and `aws-sev-snp`").

Their document is the vTPM document (vtpm.py) whose ``InstanceInfo`` is Constellation's ``snp.InstanceInfo`` JSON:
the CPU's signed report, the certificate of the key that signed it (VCEK or VLEK) and, on Azure, the runtime data
of Azure's paravisor. The TPM nonce is SHA-256(InstanceInfo || extraData), so the quote binds the instance info;
the AK is trusted only because the verified report binds it (each variant's ``bind_ak``), never through a TPM
vendor's or cloud's CA. The measurements' ``snp`` object is checked against the report together with the PCRs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import sev_snp, snp
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.snp import (  # noqa: F401 pylint: disable=unused-import
    InstanceInfo,
    decode_instance_info,
    pem_certificate,
)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import Measurements
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.variant import Validation
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import (
    ALL_PCRS,
    AKInfo,
    VTPMIssuer,
    VTPMValidator,
    encode_document,
    make_extra_data,
    make_tpm_nonce,
)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError, InputError

try:
    from cryptography.hazmat.primitives import serialization
    HAS_CRYPTOGRAPHY = True
except ImportError:
    HAS_CRYPTOGRAPHY = False


@dataclass
class Evidence:
    """One validation's SEV-SNP evidence: the instance info, its parsed report, who the TPM is (``ek_pub_sha256``:
    Azure's HCLEkPub; None where the platform names no EK) and, once verified, the ``sev_snp.VerifiedReport``."""

    info: InstanceInfo
    report: Any  # sev_snp.Report
    ek_pub_sha256: Optional[str] = None
    verified: Any = None


def spki_der(public_key) -> bytes:
    """The SubjectPublicKeyInfo DER of a key (Go's x509.MarshalPKIXPublicKey)."""
    return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


class SNPVTPMValidator(VTPMValidator):
    """The vTPM validation (vtpm.py) whose AK is trusted through a verified SEV-SNP report.

    ``roots``: the AMD roots (sev_snp.AMDRoots; None: the pinned ones), ``cache``: the verified-chain cache
    shared by the validators of one process. Subclasses set ``oid`` and implement ``report_bytes`` and
    ``bind_ak``. Order: the document, the report parsed and its binding of the AK (refusals only), the quote
    (vtpm.py), then the report's signature chain and the sets (PCRs and ``snp``) together: the AK is trusted, and
    the PCRs it quoted believed, only when all of them hold."""

    # Verifying a report is computation on data in memory (a chain is verified once per process): inline.
    validate_inline = True
    # The signing keys this platform uses ("vcek", "vlek"); a report signed otherwise is refused.
    signing_keys: Tuple[str, ...] = ("vcek", "vlek")

    def __init__(self, measurements: Measurements, roots=None, cache=None, pcr_selection: Sequence[int] = ALL_PCRS,
                 check_event_log: bool = True, now=None):
        super().__init__(measurements, pcr_selection, check_event_log)
        self.roots = roots
        self.cache = cache
        self.now = now  # the time certificates are checked at (None: now); tests of recorded data set it
        self._pinned: Dict[str, Any] = {}  # the sets' own amdRootKey roots, parsed once (snp.verify_and_match)

    def report_bytes(self, info: InstanceInfo) -> bytes:
        """The SNP report from the instance info (exactly sev_snp.REPORT_SIZE bytes)."""
        if len(info.report) != sev_snp.REPORT_SIZE:
            raise AttestationError("InstanceInfo.AttestationReport: found %d bytes, wanted %d (one SEV-SNP report)"
                                   % (len(info.report), sev_snp.REPORT_SIZE))
        return info.report

    def bind_ak(self, info: InstanceInfo, report, ak_pub: bytes, ak: AKInfo) -> Optional[str]:
        """Raises AttestationError unless the verified report binds this AK; returns the EK's SHA-256 (or None)."""
        raise NotImplementedError

    def trust_instance(self, instance_info: Optional[bytes], ak_pub: bytes, ak: AKInfo) -> Evidence:
        """The instance info decoded, its report parsed and bound to this AK: refusals only, nothing is trusted before
        ``verify`` (a binding checked on a report that then fails its signature refuses nothing more)."""
        info = decode_instance_info(instance_info)
        try:
            report = sev_snp.parse_report(self.report_bytes(info))
        except InputError as err:
            raise AttestationError("InstanceInfo.AttestationReport: %s" % err) from None
        if not info.report_signer:
            raise AttestationError("InstanceInfo.ReportSigner: found none, wanted the PEM certificate of the key that "
                                   "signed the report (VCEK or VLEK)")
        if report.signing_key not in self.signing_keys:
            raise sev_snp.SNPError("signing_key", report.signing_key, " or ".join(self.signing_keys))
        if report.vmpl != 0:  # as Constellation: the report comes from VMPL 0 (the paravisor or the guest itself)
            raise sev_snp.SNPError("vmpl", report.vmpl, 0)
        return Evidence(info, report, self.bind_ak(info, report, ak_pub, ak))

    def verify(self, evidence: Evidence, pcrs: Dict[int, bytes]) -> Tuple[str, list, list]:
        """The report's chain verified to the AMD roots (a set's own ``amdRootKey`` where it pins one) and the quoted
        PCRs with the report matched against the sets (snp.py ``verify_and_match``); ``evidence.verified`` set."""
        evidence.verified, matched = snp.verify_and_match(
            self.measurements, evidence.report, evidence.info.report_signer, evidence.info.cert_chain, self.roots,
            self.cache, self._pinned, pcrs, now=self.now)
        return matched

    def match_measurements(self, pcrs: Dict[int, bytes], evidence: Evidence) -> Tuple[str, list, list]:
        return self.verify(evidence, pcrs)

    def complete(self, validation: Validation, evidence: Evidence) -> Validation:
        return dataclasses.replace(validation, snp=evidence.verified.to_dict(), ek_pub_sha256=evidence.ek_pub_sha256)


class SNPVTPMIssuer(VTPMIssuer):
    """The vTPM issuer (vtpm.py) whose documents carry the instance info ``instance_info()`` returns (the
    subclass's), bound into the TPM nonce."""

    def instance_info(self) -> bytes:
        raise NotImplementedError

    def issue(self, user_data: bytes, nonce: bytes) -> bytes:
        if not isinstance(user_data, (bytes, bytearray)) or not isinstance(nonce, (bytes, bytearray)):
            raise InputError("user_data/nonce", "bytes", type(user_data).__name__)
        instance_info = self.instance_info()
        tpm_nonce = make_tpm_nonce(instance_info, make_extra_data(bytes(user_data), bytes(nonce)))
        return encode_document(self.attest(tpm_nonce), instance_info, bytes(user_data))


def validator_args(trust) -> Dict[str, Any]:
    """The AMD roots and chain cache of a chooser Trust (choose.py) as SNPVTPMValidator's keyword arguments."""
    return {"roots": getattr(trust, "amd_roots", None), "cache": getattr(trust, "snp_cache", None)}
