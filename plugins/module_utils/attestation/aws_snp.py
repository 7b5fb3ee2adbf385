# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Variant ``aws-sev-snp`` (Constellation's, OID 1.3.9900.2.2; docs/attestation.md, "Variants `azure-sev-snp` and
`aws-sev-snp`").

On AWS's SEV-SNP instances the guest asks the CPU itself for a report (Linux's configfs-tsm; ``snp_report_source``)
whose report_data is SHA-512 of the AK's public key (PKIX DER), signed with AWS's VLEK; the VLEK comes in the
extended report's certificate table. The vTPM (NitroTPM) runs in AWS's hypervisor, outside the VM's encrypted
memory: the report proves the VM's launch and vouches for the AK, but the PCRs the AK quotes are kept by the
hypervisor (docs/attestation.md says what that means).
"""

from __future__ import annotations

import hashlib
from typing import Callable, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import sev_snp, snp_vtpm
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.variant import AWS_SEV_SNP
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import AKInfo, parse_ak
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError


def ak_digest(public_key) -> bytes:
    """SHA-512 of the AK's public key as PKIX DER: the report_data of an ``aws-sev-snp`` report."""
    return hashlib.sha512(snp_vtpm.spki_der(public_key)).digest()


class AWSSNPValidator(snp_vtpm.SNPVTPMValidator):
    """Validates ``aws-sev-snp`` documents: the vTPM quote (vtpm.py) with an AK whose SHA-512 (PKIX DER) is the
    report_data of a VLEK-signed report."""

    oid = AWS_SEV_SNP.oid
    signing_keys = ("vlek",)  # AWS signs with its VLEK (Constellation's AWS validator chains only through an ASVK)

    def bind_ak(self, info: snp_vtpm.InstanceInfo, report, ak_pub: bytes, ak: AKInfo) -> Optional[str]:
        if info.runtime_data is not None:
            raise AttestationError("InstanceInfo.Azure: found an object, wanted null (an aws-sev-snp document)")
        wanted = ak_digest(ak.public_key)
        if bytes(report.report_data) != wanted:
            raise AttestationError("AK is not bound: report_data: found %s, wanted %s (SHA-512 of the quoting AK's "
                                   "public key)" % (bytes(report.report_data).hex(), wanted.hex()))
        return None  # AWS names no EK of the NitroTPM


class AWSSNPIssuer(snp_vtpm.SNPVTPMIssuer):
    """Issues ``aws-sev-snp`` documents: the AK (go-tpm-tools' AK template at its handle, as Constellation's AWS
    issuer), a report over SHA-512 of the AK from ``snp_report_source`` and the VLEK from its certificate table.
    ``report_source``: a callable report_data -> (report, cert table) (default: the one ``snp_report_source``
    names)."""

    oid = AWS_SEV_SNP.oid

    def __init__(self, tcti: Optional[str] = None, snp_report_source: Optional[str] = None,
                 report_source: Optional[Callable[[bytes], Tuple[bytes, bytes]]] = None, **kwargs):
        kwargs.pop("amd_cert_cache", None)  # the VLEK comes in the extended report's certificate table
        kwargs.pop("amd_kds_fetch", None)
        super().__init__(tcti, **kwargs)
        if report_source is None:
            from ansible_collections.constellation.cluster.plugins.module_utils.attestation import snp

            report_source = snp.report_source(snp_report_source).get
        self._report_source = report_source
        self._instance_info: Optional[Tuple[bytes, bytes]] = None  # (AK public area, instance info)

    def instance_info(self) -> bytes:
        """Constellation's snp.InstanceInfo JSON: a report over the AK (the same for every document of this AK), the
        VLEK and, unlike Constellation's issuer, the ASVK and ARK the table holds (a verifier uses only what chains to
        its pinned roots)."""
        ak_pub = self.ak_pub
        with self._lock:
            if self._instance_info is None or self._instance_info[0] != ak_pub:
                report, table = self._report_source(ak_digest(parse_ak(ak_pub).public_key))
                certs = sev_snp.parse_cert_table(table) if table else {}
                if not certs.get("vlek"):
                    raise AttestationError("snp_report_source: the certificate table has no VLEK (found %s), wanted "
                                           "AWS's VLEK" % (", ".join(sorted(certs)) or "none"))
                signer = snp_vtpm.pem_certificate(certs["vlek"])
                chain = b"".join(snp_vtpm.pem_certificate(certs[name]) for name in ("ask", "ark")
                                 if name in certs)  # ASK: the ASVK here
                info = snp_vtpm.InstanceInfo(bytes(report[:sev_snp.REPORT_SIZE]), signer, chain)
                self._instance_info = (ak_pub, info.to_json())
            return self._instance_info[1]


# -------------------------------------------------------------------------- the chooser's factories (choose.py)


def make_issuer(tcti: Optional[str] = None, **kwargs) -> AWSSNPIssuer:
    """The ``aws-sev-snp`` issuer on a TCTI (``None``: the default TPM device)."""
    return AWSSNPIssuer(tcti, **kwargs)


def make_validator(policy, trust, **kwargs) -> AWSSNPValidator:
    """The ``aws-sev-snp`` validator: AMD roots and chain cache from ``trust`` (choose.load_trust)."""
    return AWSSNPValidator(policy, **snp_vtpm.validator_args(trust), **kwargs)
