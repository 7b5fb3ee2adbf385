# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Variant ``azure-sev-snp`` (Constellation's, OID 1.3.9900.4.1; docs/attestation.md, "Variants `azure-sev-snp` and
`aws-sev-snp`").

On Azure's SEV-SNP confidential VMs the vTPM runs in Azure's paravisor (the HCL) at VMPL 0, inside the VM's
encrypted memory. At boot the HCL asks the CPU for a report whose report_data is SHA-256 of its *runtime data* (a
JSON with the vTPM's AK as the JWK ``HCLAkPub``, its EK as ``HCLEkPub``, and the VM configuration) and writes the
whole **HCL report** into the vTPM's NV index 0x01400001:

    0x000  header (32 bytes): signature "HCLA", version, report size, request type, status, 3 reserved
    0x020  the SEV-SNP report (0x4A0 bytes)
    0x4C0  IGVM request data (20 bytes): data size, version, report type (2 = SNP), report-data hash (1 = SHA-256),
           variable data size
    0x4D4  the runtime data (variable data size bytes; the rest of the index is padding)

The issuer quotes with the AK the HCL provisioned at 0x81000003 (as Constellation, go-azguestattestation and
Microsoft's tools do); the validator trusts that AK only if the verified report binds the runtime data and the
runtime data's HCLAkPub is the quoting AK.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import struct
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import amd_certs, sev_snp
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.snp_vtpm import (
    InstanceInfo,
    SNPVTPMIssuer,
    SNPVTPMValidator,
    pem_certificate,
    spki_der,
    validator_args,
)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.tpm import TPM
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.variant import AZURE_SEV_SNP
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import AKInfo
from ansible_collections.constellation.cluster.plugins.module_utils.encoding import load_json
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError, InputError

try:
    from cryptography.hazmat.primitives.asymmetric import rsa
    HAS_CRYPTOGRAPHY = True
except ImportError:
    HAS_CRYPTOGRAPHY = False

HCL_REPORT_NV_INDEX = 0x01400001  # Azure's vTPM: the HCL report (read with owner authorization)
AZURE_AK_HANDLE = 0x81000003  # Azure's vTPM: the AK the HCL provisions at boot
HCL_SIGNATURE = 0x414C4348  # "HCLA", little-endian
HCL_HEADER_SIZE = 0x20
IGVM_REQUEST_DATA_SIZE = 20  # data size, version, report type, report-data hash type, variable data size
IGVM_REPORT_TYPE_SNP = 2  # (4 is TDX: azure-tdx, not this variant)
IGVM_HASH_SHA256 = 1
REQUEST_DATA_OFFSET = HCL_HEADER_SIZE + sev_snp.REPORT_SIZE  # 0x4C0
RUNTIME_DATA_OFFSET = REQUEST_DATA_OFFSET + IGVM_REQUEST_DATA_SIZE  # 0x4D4
MAX_RUNTIME_DATA = 16 * 1024
THIM_URL = "http://169.254.169.254/metadata/THIM/amd/certification"  # Azure's certificates, IMDS (inside the VM)
MAX_THIM_REPLY = 64 * 1024
AK_KEY_ID = "HCLAkPub"
EK_KEY_ID = "HCLEkPub"


# ----------------------------------------------------------------------------------- the HCL report


@dataclass(frozen=True)
class HCLReport:
    """An Azure HCL report, split: ``report`` (the SEV-SNP report) and ``runtime_data`` (the JSON it binds)."""

    report: bytes
    runtime_data: bytes
    version: int = 1


def _check_request_data(header: bytes, runtime_size: Optional[int], field: str) -> int:
    """The IGVM request data's variable-data size, after checking it describes SHA-256-bound SNP runtime data."""
    data_size, _version, report_type, hash_type, var_size = struct.unpack("<5I", header)
    if report_type != IGVM_REPORT_TYPE_SNP:
        raise AttestationError("%s: report type %d, wanted %d (an SEV-SNP report; 4 is TDX)"
                               % (field, report_type, IGVM_REPORT_TYPE_SNP))
    if hash_type != IGVM_HASH_SHA256:
        raise AttestationError("%s: report-data hash type %d, wanted %d (SHA-256, as Constellation checks)"
                               % (field, hash_type, IGVM_HASH_SHA256))
    if data_size != IGVM_REQUEST_DATA_SIZE + var_size or (runtime_size is not None and var_size != runtime_size):
        raise AttestationError("%s: sizes %d/%d do not describe the %s bytes of runtime data"
                               % (field, data_size, var_size, runtime_size if runtime_size is not None else var_size))
    return var_size


def parse_hcl_report(blob: bytes) -> HCLReport:
    """Splits an HCL report (NV 0x01400001) into the SNP report and the runtime data; AttestationError naming what
    is wrong (signature, report type, hash type, sizes)."""
    blob = bytes(blob)
    if len(blob) < RUNTIME_DATA_OFFSET:
        raise AttestationError("HCL report: found %d bytes, wanted at least %d" % (len(blob), RUNTIME_DATA_OFFSET))
    signature, version = struct.unpack_from("<2I", blob, 0)
    if signature != HCL_SIGNATURE:
        raise AttestationError("HCL report: signature 0x%08x, wanted 0x%08x (\"HCLA\")" % (signature, HCL_SIGNATURE))
    var_size = _check_request_data(blob[REQUEST_DATA_OFFSET:RUNTIME_DATA_OFFSET], None, "HCL report")
    if var_size > MAX_RUNTIME_DATA or RUNTIME_DATA_OFFSET + var_size > len(blob):
        raise AttestationError("HCL report: runtime data of %d bytes does not fit the %d-byte report"
                               % (var_size, len(blob)))
    return HCLReport(blob[HCL_HEADER_SIZE:REQUEST_DATA_OFFSET],
                     blob[RUNTIME_DATA_OFFSET:RUNTIME_DATA_OFFSET + var_size], version)


# ------------------------------------------------------------------------------------ runtime data


def _b64url_int(value: Any, field: str) -> int:
    if not isinstance(value, str) or not value or len(value) > 1024:
        raise AttestationError("%s: found %r, wanted base64url text" % (field, type(value).__name__))
    try:
        raw = base64.b64decode(value.replace("-", "+").replace("_", "/") + "=" * (-len(value) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise AttestationError("%s: found text that is not base64url, wanted a JWK integer" % field) from None
    return int.from_bytes(raw, "big")


def runtime_keys(runtime_data: bytes) -> Dict[str, Any]:
    """The RSA public keys of Azure's runtime data by key ID (``HCLAkPub``, ``HCLEkPub``); AttestationError naming the
    field if the JSON or a key is malformed."""
    try:
        doc = load_json(runtime_data, "InstanceInfo.Azure.RuntimeData", MAX_RUNTIME_DATA)
    except InputError as err:
        raise AttestationError(str(err)) from None
    keys = doc.get("keys") if isinstance(doc, dict) else None
    if not isinstance(keys, list):
        raise AttestationError("InstanceInfo.Azure.RuntimeData: found no \"keys\" list, wanted the HCL's JWKs")
    found: Dict[str, Any] = {}
    for key in keys:
        if not isinstance(key, dict) or key.get("kid") not in (AK_KEY_ID, EK_KEY_ID):
            continue
        field = "InstanceInfo.Azure.RuntimeData.keys[%s]" % key["kid"]
        if key["kid"] in found:
            raise AttestationError("%s: found twice, wanted once" % field)
        if key.get("kty") != "RSA":
            raise AttestationError("%s.kty: found %r, wanted 'RSA'" % (field, key.get("kty")))
        numbers = rsa.RSAPublicNumbers(_b64url_int(key.get("e"), field + ".e"), _b64url_int(key.get("n"), field + ".n"))
        try:
            found[key["kid"]] = numbers.public_key()
        except ValueError as err:
            raise AttestationError("%s: not an RSA public key (%s)" % (field, err)) from None
    return found


def jwk(public_key, kid: str) -> Dict[str, Any]:
    """An RSA public key as the HCL's runtime data carries it (kid, kty, e, n; the lab's HCL writes its keys so)."""
    numbers = public_key.public_numbers()

    def b64url(value: int) -> str:
        return base64.urlsafe_b64encode(value.to_bytes((value.bit_length() + 7) // 8, "big")).decode("ascii").rstrip("=")
    return {"kid": kid, "kty": "RSA", "e": b64url(numbers.e), "n": b64url(numbers.n)}


# ---------------------------------------------------------------------------------------- validator


class AzureSNPValidator(SNPVTPMValidator):
    """Validates ``azure-sev-snp`` documents: the vTPM quote (vtpm.py) with an AK that the HCL's runtime data
    names and the verified report binds (report_data = SHA-256(runtime data), zero-padded)."""

    oid = AZURE_SEV_SNP.oid

    def report_bytes(self, info: InstanceInfo) -> bytes:
        """The SNP report; Constellation's earlier issuers sent it with the 20-byte IGVM request data behind it, which
        must then describe exactly the runtime data sent."""
        if info.runtime_data is None:
            raise AttestationError("InstanceInfo.Azure: found null, wanted Azure's RuntimeData (the HCL's keys)")
        if len(info.report) == sev_snp.REPORT_SIZE + IGVM_REQUEST_DATA_SIZE:
            _check_request_data(info.report[sev_snp.REPORT_SIZE:], len(info.runtime_data),
                                "InstanceInfo.AttestationReport (IGVM request data)")
            return info.report[:sev_snp.REPORT_SIZE]
        return super().report_bytes(info)

    def bind_ak(self, info: InstanceInfo, report, ak_pub: bytes, ak: AKInfo) -> Optional[str]:
        runtime_data = info.runtime_data or b""
        try:
            sev_snp.check_report_data(report, hashlib.sha256(runtime_data).digest())
        except sev_snp.SNPError as err:
            raise AttestationError("AK is not bound: the report's report_data is not SHA-256 of the runtime data sent "
                                   "(runtime data swapped?): %s" % err) from None
        keys = runtime_keys(runtime_data)
        hcl_ak = keys.get(AK_KEY_ID)
        if hcl_ak is None:
            raise AttestationError("InstanceInfo.Azure.RuntimeData: found no key %s, wanted the vTPM's AK" % AK_KEY_ID)
        if not isinstance(ak.public_key, rsa.RSAPublicKey) or \
                ak.public_key.public_numbers() != hcl_ak.public_numbers():
            raise AttestationError("AK is not bound: the quoting AK is not the runtime data's %s (a key the report "
                                   "does not vouch for)" % AK_KEY_ID)
        hcl_ek = keys.get(EK_KEY_ID)
        return hashlib.sha256(spki_der(hcl_ek)).hexdigest() if hcl_ek is not None else None


# ------------------------------------------------------------------------------------------ issuer


class AzureSNPIssuer(SNPVTPMIssuer):
    """Issues ``azure-sev-snp`` documents on an Azure SEV-SNP VM (or the lab's stand-in): the HCL report from NV
    0x01400001, the AK the HCL provisioned at 0x81000003 (never created or replaced here), the VCEK and its chain
    from ``certs`` (a callable report -> (signer PEM, chain PEM); default: ``cached_certs``: the folder
    ``amd_cert_cache`` (AMD's KDS only with ``amd_kds_fetch``), else Azure's THIM at ``thim_url`` (None: not asked)).
    The instance info is built once per process."""

    oid = AZURE_SEV_SNP.oid

    def __init__(self, tcti: Optional[str] = None, ak_handle: int = AZURE_AK_HANDLE, amd_cert_cache: Optional[str] = None,
                 amd_kds_fetch: bool = False, certs=None, hcl_nv_index: int = HCL_REPORT_NV_INDEX,
                 thim_url: Optional[str] = THIM_URL, **kwargs):
        kwargs.pop("ak_alg", None)  # the HCL's AK is RSA; the agent's ak_alg does not apply
        kwargs.pop("snp_report_source", None)  # the HCL asked the CPU already
        super().__init__(tcti, ak_handle=ak_handle, **kwargs)
        self.hcl_nv_index = hcl_nv_index
        if certs is None:
            certs = functools.partial(cached_certs, amd_certs.CertCache(amd_cert_cache, amd_kds_fetch),
                                      thim=functools.partial(fetch_thim, thim_url) if thim_url else None)
        self._certs = certs
        self._instance_info: Optional[bytes] = None

    def _load_ak(self, tpm: TPM):
        """The HCL's AK as it is (go-tpm-tools LoadCachedKey): refusing, not replacing, a missing key."""
        from tpm2_pytss import TSS2_Exception  # the issuer side only: a validator needs no TPM stack

        esapi = tpm.esapi
        try:
            handle = esapi.tr_from_tpmpublic(self._ak_persistent)
            public, _name, _qname = esapi.read_public(handle)
        except TSS2_Exception as err:
            raise AttestationError("no AK at the vTPM's persistent handle 0x%08x (Azure's HCL provisions it at boot): "
                                   "%s" % (self._ak_persistent, err))
        return handle, public.publicArea.marshal()

    def instance_info(self) -> bytes:
        """Constellation's snp.InstanceInfo JSON for this VM: read once (the HCL writes its report at boot)."""
        with self._lock:
            if self._instance_info is None:
                tpm, _ak = self._open()
                hcl = parse_hcl_report(tpm.nv_read(self.hcl_nv_index, owner_auth=True))
                signer, chain = self._certs(hcl.report)
                self._instance_info = InstanceInfo(hcl.report, signer, chain, hcl.runtime_data, "").to_json()
            return self._instance_info


def cached_certs(cache, report: bytes, thim=None) -> Tuple[bytes, bytes]:
    """The VCEK (or VLEK) that signed ``report`` and AMD's chain for it, PEM: from ``cache`` (amd_certs.CertCache:
    the ``amd_cert_cache`` folder, AMD's KDS only with ``amd_kds_fetch``), else from ``thim`` (a callable returning
    Azure's THIM answer, ``fetch_thim``). Azure's HCL asks the CPU for a plain report (no certificate table); the
    product is Milan unless the report's CPUID names another (Azure's SEV-SNP VMs run on Milan and Genoa). Nothing
    here is trusted: the verifier checks whatever comes against the report and AMD's roots."""
    parsed = sev_snp.parse_report(report)
    product = "Milan"
    if parsed.cpuid_fam_id is not None:
        product = sev_snp.product_from_cpuid(parsed.cpuid_fam_id, parsed.cpuid_mod_id or 0) or product
    try:
        if parsed.signing_key == "vlek":
            der = cache.vlek(product, parsed.reported_tcb)
        else:
            der = cache.vcek(product, parsed.chip_id, parsed.reported_tcb)
        return pem_certificate(der), cache.cert_chain(product, parsed.signing_key)
    except amd_certs.CertificateMissing as missing:
        if thim is None:
            raise
        try:
            return thim()
        except AttestationError as err:
            raise AttestationError("%s; and Azure's THIM: %s" % (missing, err)) from None


def fetch_thim(url: str = THIM_URL, timeout: float = 5.0, opener=None) -> Tuple[bytes, bytes]:
    """(VCEK PEM, chain PEM) from Azure's THIM (``{"vcekCert": PEM, "certificateChain": PEM, ...}``, the request
    with the header ``Metadata: true``); AttestationError naming what went wrong."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers={"Metadata": "true"})
    try:
        # urllib's default opener: the agent runs this without ansible-core (open_url).
        with (opener or urllib.request.build_opener().open)(request, timeout=timeout) as reply:
            body = reply.read(MAX_THIM_REPLY + 1)
    except (urllib.error.URLError, OSError) as err:
        raise AttestationError("THIM at %s could not be reached (%s)" % (url, getattr(err, "reason", None) or err)) \
            from None
    try:
        doc = load_json(body, "THIM's answer", MAX_THIM_REPLY)
    except InputError as err:
        raise AttestationError(str(err)) from None
    fields = {str(key).lower(): value for key, value in doc.items()} if isinstance(doc, dict) else {}
    signer, chain = fields.get("vcekcert"), fields.get("certificatechain")
    if not isinstance(signer, str) or not isinstance(chain, str) or not signer or not chain:
        raise AttestationError("THIM's answer: found no vcekCert and certificateChain (PEM text), wanted both")
    return signer.encode("ascii", "replace"), chain.encode("ascii", "replace")


# -------------------------------------------------------------------------- the chooser's factories (choose.py)


def make_issuer(tcti: Optional[str] = None, **kwargs) -> AzureSNPIssuer:
    """The ``azure-sev-snp`` issuer on a TCTI (``None``: the default TPM device)."""
    return AzureSNPIssuer(tcti, **kwargs)


def make_validator(policy, trust, **kwargs) -> AzureSNPValidator:
    """The ``azure-sev-snp`` validator: AMD roots and chain cache from ``trust`` (choose.load_trust)."""
    return AzureSNPValidator(policy, **validator_args(trust), **kwargs)
