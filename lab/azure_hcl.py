# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab as Azure's paravisor (HCL) for ``--variant azure-sev-snp`` (docs/testing.md, "The lab as an SEV-SNP
platform"): at a host's start, what Azure's HCL does at a confidential VM's boot, in the host's swtpm.

1. The AK at Azure's persistent handle 0x81000003 (an RSA-2048 restricted signing key, created once).
2. The runtime data: the JWKs ``HCLAkPub`` (that AK) and ``HCLEkPub`` (the EK of the swtpm's EK certificate).
3. The HCL report binding it (the host's platform signs a report with report_data = SHA-256(runtime data),
   lab/snp_platform.py) written into NV 0x01400001.
4. The VCEK and its chain (ASK + ARK) into the host's certificate folder, as Azure's THIM serves them.

The swtpm's NV indices hold at most 2048 bytes: the lab's runtime data carries the two keys only (Azure's also
names the VM's configuration), which keeps the HCL report within one index.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from ansible_collections.constellation.cluster.plugins.module_utils import fileutil
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import amd_certs
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.azure_snp import (
    AK_KEY_ID,
    AZURE_AK_HANDLE,
    EK_KEY_ID,
    HCL_REPORT_NV_INDEX,
    jwk,
)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.ek import EK_CERT_NV_INDEX_RSA
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.tpm import TPM
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import VTPMIssuer, parse_ak
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError
from lab.amd import PRODUCT
from lab.snp_platform import SNPPlatform

CERT_FOLDER = "amd-certs"  # in the host's folder: what the agent's amd_cert_cache names


def runtime_data(ak_public_key, ek_public_key=None) -> bytes:
    """The HCL's runtime data (compact JSON) naming the AK and, if given, the EK."""
    keys = [jwk(ak_public_key, AK_KEY_ID)]
    if ek_public_key is not None:
        keys.append(jwk(ek_public_key, EK_KEY_ID))
    return json.dumps({"keys": keys}, separators=(",", ":")).encode("ascii")


def _ek_public_key(tpm: TPM):
    try:
        return x509.load_der_x509_certificate(tpm.nv_read(EK_CERT_NV_INDEX_RSA)).public_key()
    except AttestationError:
        return None  # a TPM without an EK certificate: the runtime data names no EK


def write_nv(tpm: TPM, index: int, data: bytes, chunk: int = 1024) -> None:
    """(Re)defines NV ``index`` (owner authorization) with exactly ``data``."""
    from tpm2_pytss import ESYS_TR, TPM2_ALG, TPM2B_NV_PUBLIC, TPMA_NV, TPMS_NV_PUBLIC, TSS2_Exception

    esapi = tpm.esapi
    try:
        handle = esapi.tr_from_tpmpublic(index)
        esapi.nv_undefine_space(handle, ESYS_TR.OWNER)
    except TSS2_Exception:
        pass  # not defined yet
    attributes = TPMA_NV.OWNERWRITE | TPMA_NV.OWNERREAD | TPMA_NV.AUTHREAD | TPMA_NV.AUTHWRITE | TPMA_NV.NO_DA
    public = TPM2B_NV_PUBLIC(nvPublic=TPMS_NV_PUBLIC(nvIndex=index, nameAlg=TPM2_ALG.SHA256, attributes=attributes,
                                                     dataSize=len(data)))
    handle = esapi.nv_define_space(b"", public, ESYS_TR.OWNER)
    for offset in range(0, len(data), chunk):
        esapi.nv_write(handle, data[offset:offset + chunk], offset, auth_handle=ESYS_TR.OWNER)


def provision(tcti: str, platform: SNPPlatform, cert_dir: Optional[Path] = None, ak_pub: Optional[bytes] = None) \
        -> bytes:
    """Steps 1-4 on the swtpm at ``tcti`` with ``platform`` (the host's); returns the HCL report written.
    ``ak_pub``: bind this AK public area instead of the one at the handle (an attack: an HCL report naming another
    AK)."""
    with VTPMIssuer(tcti, event_log_path=None, ak_handle=AZURE_AK_HANDLE, ak_alg="rsa") as issuer:
        held = issuer.ak_pub  # created and persisted at 0x81000003 once, reused after
    ak_pub = held if ak_pub is None else ak_pub
    with TPM(tcti) as tpm:
        hcl = platform.hcl_report(runtime_data(parse_ak(ak_pub).public_key, _ek_public_key(tpm)))
        write_nv(tpm, HCL_REPORT_NV_INDEX, hcl)
    if cert_dir is not None:
        write_cert_cache(platform, cert_dir)
    return hcl


def write_cert_cache(platform: SNPPlatform, cert_dir: Path) -> None:
    """The platform's VCEK and AMD chain in ``amd_cert_cache``'s layout (amd_certs.py), as an Azure VM caches what
    THIM serves."""
    state = platform.state()
    chain = platform.chain(state)
    tcb = amd_certs.tcb_name(state.reported_tcb, PRODUCT)
    folder = cert_dir / PRODUCT
    folder.mkdir(parents=True, exist_ok=True)
    fileutil.atomic_write(str(folder / ("vcek-%s-%s.pem" % (amd_certs.hwid(bytes.fromhex(state.chip_id), PRODUCT),
                                                            tcb))),
                          platform.signer_cert(state).public_bytes(serialization.Encoding.PEM), 0o644)
    fileutil.atomic_write(str(folder / "cert_chain.pem"), b"".join(
        chain.cert(name).public_bytes(serialization.Encoding.PEM) for name in ("ask", "ark")), 0o644)
