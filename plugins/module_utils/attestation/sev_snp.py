# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""AMD SEV-SNP attestation reports: parse, verify against AMD's roots, check against a policy
(docs/attestation.md, "AMD SEV-SNP reports").

- ``parse_report``: AMD's ATTESTATION_REPORT layout (0x4A0 bytes, versions 2 to 5), strictly: the size,
  the version, the signature algorithm (1, ECDSA P-384 with SHA-384) and every reserved field zero.
- ``parse_cert_table``: the certificate table of an extended report request (GUID, offset, length).
- ``verify_report``: the chain ARK -> ASK/ASVK -> VCEK/VLEK (RSA-PSS SHA-384; the ARK one of the pinned
  roots), each certificate valid at ``now``, the VCEK's hwID and TCB extensions equal to the report's
  chip_id and reported_tcb, and the report's ECDSA P-384 signature over its first 0x2A0 bytes.
- ``SNPPolicy``: what an operator requires (TCB minimums, launch measurement, ID key digest, host data,
  guest SVN, VMPL, no debug, no migration agent), the measurements document's ``snp`` object.

Only ``cryptography`` checks signatures; nothing here talks to AMD or a device.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import os
import struct
import threading
import uuid
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field as dc_field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ansible_collections.constellation.cluster.plugins.module_utils import x509compat
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError, InputError

try:
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
    HAS_CRYPTOGRAPHY = True
except ImportError:  # pragma: no cover - reported where a certificate is needed
    HAS_CRYPTOGRAPHY = False

REPORT_SIZE = 0x4A0
SIGNED_SIZE = 0x2A0
MIN_VERSION = 2
MAX_VERSION = 5
SIGNATURE_ALGO_ECDSA_P384_SHA384 = 1
_RS_SIZE = 72  # r and s, little-endian, 72 bytes each (AMD's ECDSA signature format)

PRODUCTS = ("Milan", "Genoa", "Turin")

# The certificate table's GUIDs (AMD's guest-hypervisor communication block standard), in textual byte order.
CERT_TABLE_GUIDS = {
    uuid.UUID("63da758d-e664-4564-adc5-f4b93be8accd").bytes: "vcek",
    uuid.UUID("a8074bc2-a25a-483e-aae6-39c045a0b8a1").bytes: "vlek",
    uuid.UUID("4ab7b379-bbac-4fe4-a02f-05aef327c782").bytes: "ask",  # also carries an ASVK
    uuid.UUID("c0b406a4-a803-4952-9743-3fb6014cd0ae").bytes: "ark",
}
GUID_BY_NAME = {name: guid for guid, name in CERT_TABLE_GUIDS.items()}
_CERT_TABLE_ENTRY = 24
MAX_CERT_TABLE_ENTRIES = 64
MAX_CERT_SIZE = 64 * 1024

# AMD's VCEK/VLEK certificate extensions (AMD's Key Distribution Service specification).
_KDS = "1.3.6.1.4.1.3704.1."
OID_STRUCT_VERSION = _KDS + "1"
OID_PRODUCT_NAME = _KDS + "2"
OID_BL_SPL = _KDS + "3.1"
OID_TEE_SPL = _KDS + "3.2"
OID_SNP_SPL = _KDS + "3.3"
OID_SPL4, OID_SPL5, OID_SPL6, OID_SPL7 = (_KDS + "3.4", _KDS + "3.5", _KDS + "3.6", _KDS + "3.7")
OID_UCODE_SPL = _KDS + "3.8"
OID_FMC_SPL = _KDS + "3.9"
OID_HWID = _KDS + "4"
OID_CSP_ID = _KDS + "5"
OID_RSASSA_PSS = "1.2.840.113549.1.1.10"

_SIGNING_KEYS = {0: "vcek", 1: "vlek", 7: "none"}


class SNPError(AttestationError):
    """A report, certificate or policy check refused: ``field``, what was ``found``, what was ``wanted``."""

    def __init__(self, field: str, found: Any, wanted: Any):
        self.field = field
        self.found = found
        self.wanted = wanted
        super().__init__("%s: found %s, wanted %s" % (field, _show(found), _show(wanted)))


def _show(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex() or "(empty)"
    text = str(value)
    return text if len(text) <= 300 else text[:300] + "... (%d characters)" % len(text)


# --- TCB -----------------------------------------------------------------------------------------------

def _layout(product: str) -> str:
    return "turin" if str(product).startswith("Turin") else "milan"


@dataclass(frozen=True)
class TCB:
    """A TCB_VERSION: security patch levels. Milan and Genoa: byte 0 bootloader, 1 TEE, 6 SNP, 7 microcode;
    Turin: byte 0 FMC, 1 bootloader, 2 TEE, 3 SNP, 7 microcode (``fmc`` is None for Milan/Genoa)."""

    bootloader: int
    tee: int
    snp: int
    microcode: int
    fmc: Optional[int] = None

    def to_dict(self) -> dict:
        result = {"bootloader": self.bootloader, "tee": self.tee, "snp": self.snp, "microcode": self.microcode}
        if self.fmc is not None:
            result["fmc"] = self.fmc
        return result

    @classmethod
    def from_u64(cls, raw: int, product: str = "Milan") -> "TCB":
        b = struct.pack("<Q", raw)
        if _layout(product) == "turin":
            return cls(bootloader=b[1], tee=b[2], snp=b[3], microcode=b[7], fmc=b[0])
        return cls(bootloader=b[0], tee=b[1], snp=b[6], microcode=b[7])

    def to_u64(self, product: str = "Milan") -> int:
        b = bytearray(8)
        if _layout(product) == "turin":
            b[0], b[1], b[2], b[3], b[7] = self.fmc or 0, self.bootloader, self.tee, self.snp, self.microcode
        else:
            b[0], b[1], b[6], b[7] = self.bootloader, self.tee, self.snp, self.microcode
        return struct.unpack("<Q", bytes(b))[0]


# --- the report ----------------------------------------------------------------------------------------

_POLICY_BITS = (("smt", 16), ("migrate_ma", 18), ("debug", 19), ("single_socket", 20), ("cxl_allow", 21),
                ("mem_aes_256_xts", 22), ("rapl_dis", 23), ("ciphertext_hiding", 24), ("page_swap_disable", 25))


@dataclass(frozen=True)
class GuestPolicy:
    """The guest policy the VM was launched with (bits 0-25; bit 17 is reserved and must be one)."""

    abi_minor: int
    abi_major: int
    smt: bool
    migrate_ma: bool
    debug: bool
    single_socket: bool
    cxl_allow: bool
    mem_aes_256_xts: bool
    rapl_dis: bool
    ciphertext_hiding: bool
    page_swap_disable: bool
    raw: int

    @classmethod
    def from_u64(cls, raw: int) -> "GuestPolicy":
        if not raw & (1 << 17):
            raise SNPError("policy", "0x%x (bit 17 clear)" % raw, "bit 17 set (reserved, must be one)")
        if raw >> 26:
            raise SNPError("policy", "0x%x" % raw, "bits 26-63 zero (reserved)")
        flags = {name: bool(raw & (1 << bit)) for name, bit in _POLICY_BITS}
        return cls(abi_minor=raw & 0xFF, abi_major=(raw >> 8) & 0xFF, raw=raw, **flags)

    def to_dict(self) -> dict:
        result = {"abi_major": self.abi_major, "abi_minor": self.abi_minor}
        result.update((name, getattr(self, name)) for name, _bit in _POLICY_BITS)
        result["raw"] = "0x%x" % self.raw
        return result


_PLATFORM_INFO_BITS = (("smt_en", 0), ("tsme_en", 1), ("ecc_en", 2), ("rapl_dis", 3), ("ciphertext_hiding_en", 4),
                       ("alias_check_complete", 5), ("tio_en", 7))


@dataclass(frozen=True)
class Report:
    """One parsed ATTESTATION_REPORT (AMD's field names). ``raw`` is the report as received."""

    version: int
    guest_svn: int
    policy: GuestPolicy
    family_id: bytes
    image_id: bytes
    vmpl: int
    signature_algo: int
    current_tcb: TCB
    platform_info: int
    signing_key: str
    mask_chip_key: bool
    author_key_en: bool
    report_data: bytes
    measurement: bytes
    host_data: bytes
    id_key_digest: bytes
    author_key_digest: bytes
    report_id: bytes
    report_id_ma: bytes
    reported_tcb: TCB
    cpuid_fam_id: Optional[int]
    cpuid_mod_id: Optional[int]
    cpuid_step: Optional[int]
    chip_id: bytes
    committed_tcb: TCB
    current_build: int
    current_minor: int
    current_major: int
    committed_build: int
    committed_minor: int
    committed_major: int
    launch_tcb: TCB
    launch_mit_vector: Optional[int]
    current_mit_vector: Optional[int]
    signature_r: int
    signature_s: int
    tcb_product: str = "Milan"  # the TCB layout the TCBs were read with
    raw: bytes = dc_field(default=b"", repr=False)

    @property
    def signed_bytes(self) -> bytes:
        return self.raw[:SIGNED_SIZE]

    def to_dict(self) -> dict:
        result: Dict[str, Any] = {}
        for name in ("version", "guest_svn"):
            result[name] = getattr(self, name)
        result["policy"] = self.policy.to_dict()
        for name in ("family_id", "image_id"):
            result[name] = getattr(self, name).hex()
        result["vmpl"] = self.vmpl
        result["signature_algo"] = self.signature_algo
        result["current_tcb"] = self.current_tcb.to_dict()
        result["platform_info"] = dict({name: bool(self.platform_info & (1 << bit)) for name, bit in _PLATFORM_INFO_BITS},
                                       raw="0x%x" % self.platform_info)
        result["signing_key"] = self.signing_key
        result["mask_chip_key"] = self.mask_chip_key
        result["author_key_en"] = self.author_key_en
        for name in ("report_data", "measurement", "host_data", "id_key_digest", "author_key_digest", "report_id",
                     "report_id_ma"):
            result[name] = getattr(self, name).hex()
        result["reported_tcb"] = self.reported_tcb.to_dict()
        for name in ("cpuid_fam_id", "cpuid_mod_id", "cpuid_step"):
            if getattr(self, name) is not None:
                result[name] = getattr(self, name)
        result["chip_id"] = self.chip_id.hex()
        result["committed_tcb"] = self.committed_tcb.to_dict()
        for name in ("current_build", "current_minor", "current_major", "committed_build", "committed_minor",
                     "committed_major"):
            result[name] = getattr(self, name)
        result["launch_tcb"] = self.launch_tcb.to_dict()
        for name in ("launch_mit_vector", "current_mit_vector"):
            if getattr(self, name) is not None:
                result[name] = getattr(self, name)
        result["signature_r"] = "%0144x" % self.signature_r
        result["signature_s"] = "%0144x" % self.signature_s
        return result


def _mbz(data: bytes, lo: int, hi: int, name: str) -> None:
    if any(data[lo:hi]):
        raise SNPError(name, data[lo:hi], "all zero (reserved bytes 0x%x-0x%x)" % (lo, hi - 1))


def product_from_cpuid(family: int, model: int) -> Optional[str]:
    """The product line a version 3+ report's CPUID family/model names (None: unknown or not given)."""
    if family == 0x19 and model == 0x01:
        return "Milan"
    if family == 0x19 and model == 0x11:
        return "Genoa"
    if family == 0x1A and model in (0x02, 0x11):
        return "Turin"
    return None


def parse_report(data: bytes, product: Optional[str] = None) -> Report:
    """Parse an ATTESTATION_REPORT strictly (SNPError naming the field). ``product`` picks the TCB layout
    (Turin's differs); without it, a version 3+ report's CPUID family/model picks it, else Milan's."""
    if not isinstance(data, (bytes, bytearray)):
        raise SNPError("report", type(data).__name__, "bytes")
    data = bytes(data)
    if len(data) != REPORT_SIZE:
        raise SNPError("report", "%d bytes" % len(data), "%d bytes" % REPORT_SIZE)

    def u32(off: int) -> int:
        return struct.unpack_from("<I", data, off)[0]

    def u64(off: int) -> int:
        return struct.unpack_from("<Q", data, off)[0]

    version = u32(0x00)
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise SNPError("version", version, "%d to %d" % (MIN_VERSION, MAX_VERSION))
    algo = u32(0x34)
    if algo != SIGNATURE_ALGO_ECDSA_P384_SHA384:
        raise SNPError("signature_algo", algo, "%d (ECDSA P-384 with SHA-384)" % SIGNATURE_ALGO_ECDSA_P384_SHA384)
    policy = GuestPolicy.from_u64(u64(0x08))
    vmpl = u32(0x30)
    if vmpl > 3:
        raise SNPError("vmpl", vmpl, "0 to 3")
    signer_info = u32(0x48)
    if signer_info >> 5:
        raise SNPError("signer_info", "0x%x" % signer_info, "bits 5-31 zero (reserved)")
    key = (signer_info >> 2) & 7
    if key not in _SIGNING_KEYS:
        raise SNPError("signing_key", key, "0 (VCEK), 1 (VLEK) or 7 (none)")
    _mbz(data, 0x4C, 0x50, "reserved")
    if version >= 3:
        family, model, step = data[0x188], data[0x189], data[0x18A]
        _mbz(data, 0x18B, 0x1A0, "reserved")
    else:
        family = model = step = None
        _mbz(data, 0x188, 0x1A0, "reserved")
    _mbz(data, 0x1EB, 0x1EC, "reserved")
    _mbz(data, 0x1EF, 0x1F0, "reserved")
    if version >= 5:
        launch_mit, current_mit = u64(0x1F8), u64(0x200)
        _mbz(data, 0x208, SIGNED_SIZE, "reserved")
    else:
        launch_mit = current_mit = None
        _mbz(data, 0x1F8, SIGNED_SIZE, "reserved")
    _mbz(data, SIGNED_SIZE + 2 * _RS_SIZE, REPORT_SIZE, "signature")
    if product is None:
        product = (product_from_cpuid(family, model) if family is not None else None) or "Milan"

    def tcb(off: int) -> TCB:
        return TCB.from_u64(u64(off), product)

    sig = data[SIGNED_SIZE:SIGNED_SIZE + 2 * _RS_SIZE]
    return Report(
        version=version, guest_svn=u32(0x04), policy=policy, family_id=data[0x10:0x20], image_id=data[0x20:0x30],
        vmpl=vmpl, signature_algo=algo, current_tcb=tcb(0x38), platform_info=u64(0x40),
        signing_key=_SIGNING_KEYS[key], mask_chip_key=bool(signer_info & 2), author_key_en=bool(signer_info & 1),
        report_data=data[0x50:0x90], measurement=data[0x90:0xC0], host_data=data[0xC0:0xE0],
        id_key_digest=data[0xE0:0x110], author_key_digest=data[0x110:0x140], report_id=data[0x140:0x160],
        report_id_ma=data[0x160:0x180], reported_tcb=tcb(0x180), cpuid_fam_id=family, cpuid_mod_id=model,
        cpuid_step=step, chip_id=data[0x1A0:0x1E0], committed_tcb=tcb(0x1E0), current_build=data[0x1E8],
        current_minor=data[0x1E9], current_major=data[0x1EA], committed_build=data[0x1EC],
        committed_minor=data[0x1ED], committed_major=data[0x1EE], launch_tcb=tcb(0x1F0),
        launch_mit_vector=launch_mit, current_mit_vector=current_mit,
        signature_r=int.from_bytes(sig[:_RS_SIZE], "little"), signature_s=int.from_bytes(sig[_RS_SIZE:], "little"),
        tcb_product=_layout_product(product), raw=data)


def _layout_product(product: str) -> str:
    return "Turin" if _layout(product) == "turin" else "Milan"


def parse_cert_table(blob: bytes) -> Dict[str, bytes]:
    """The extended report's certificate table -> ``{"vcek"|"vlek"|"ask"|"ark": DER}`` (entries of 24 bytes:
    GUID, offset, length, ended by an all-zero entry; unknown GUIDs are skipped). The ASK entry carries the
    ASVK where the signer is a VLEK. Empty input is an empty table."""
    if not isinstance(blob, (bytes, bytearray)):
        raise SNPError("certs", type(blob).__name__, "bytes")
    blob = bytes(blob)
    if not blob:
        return {}
    entries: List[Tuple[bytes, int, int]] = []
    pos = 0
    while True:
        if pos + _CERT_TABLE_ENTRY > len(blob):
            raise SNPError("certs", "a table of %d bytes without its all-zero last entry" % len(blob),
                           "entries of %d bytes ending with an all-zero entry" % _CERT_TABLE_ENTRY)
        guid, offset, length = struct.unpack_from("<16sII", blob, pos)
        pos += _CERT_TABLE_ENTRY
        if not any(guid) and offset == 0 and length == 0:
            break
        if len(entries) >= MAX_CERT_TABLE_ENTRIES:
            raise SNPError("certs", "more than %d entries" % MAX_CERT_TABLE_ENTRIES,
                           "at most %d entries" % MAX_CERT_TABLE_ENTRIES)
        entries.append((guid, offset, length))
    result: Dict[str, bytes] = {}
    for guid, offset, length in entries:
        name = CERT_TABLE_GUIDS.get(guid)
        where = "certs.%s" % (name or str(uuid.UUID(bytes=guid)))
        if offset < pos or offset + length > len(blob) or length == 0:
            raise SNPError(where, "offset %d length %d" % (offset, length),
                           "a non-empty range after the table (%d bytes) within %d bytes" % (pos, len(blob)))
        if length > MAX_CERT_SIZE:
            raise SNPError(where, "%d bytes" % length, "at most %d bytes" % MAX_CERT_SIZE)
        if name is None:
            continue
        if name in result:
            raise SNPError(where, "a second entry", "one entry per GUID")
        result[name] = blob[offset:offset + length]
    return result


def build_cert_table(certs: Mapping[str, bytes]) -> bytes:
    """The inverse of parse_cert_table (for issuers and tests): ``{"vcek": DER, ...}`` -> table bytes."""
    items = [(GUID_BY_NAME[name], bytes(der)) for name, der in certs.items()]
    header = (len(items) + 1) * _CERT_TABLE_ENTRY
    table, body, offset = b"", b"", header
    for guid, der in items:
        table += struct.pack("<16sII", guid, offset, len(der))
        body += der
        offset += len(der)
    return table + bytes(_CERT_TABLE_ENTRY) + body


# --- certificates ----------------------------------------------------------------------------------------

_ZERO_SERIAL_LOCK = threading.Lock()
_ZERO_SERIAL_MESSAGE = r"Parsed a serial number which wasn't positive"


def load_certificate(data: Union[bytes, str], field: str) -> "x509.Certificate":
    """One certificate, PEM or DER. AMD's VCEKs and VLEKs carry serial number zero, which RFC 5280 forbids and
    cryptography accepts with a deprecation warning: accepted on purpose here (their issuer's signature
    is what counts), the warning kept from leaking. The serial number is never read."""
    _require_cryptography(field)
    if isinstance(data, str):
        data = data.encode()
    if not isinstance(data, (bytes, bytearray)) or not data:
        raise SNPError(field, type(data).__name__ if not isinstance(data, (bytes, bytearray)) else "nothing",
                       "a PEM or DER certificate")
    data = bytes(data)
    with _ZERO_SERIAL_LOCK, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_ZERO_SERIAL_MESSAGE)
        try:
            if b"-----BEGIN" in data:
                certs = x509compat.load_pem_certificates(data)
                if len(certs) != 1:
                    raise SNPError(field, "%d certificates" % len(certs), "one certificate")
                cert = certs[0]
            else:
                cert = x509.load_der_x509_certificate(data)
            cert.extensions  # noqa: B018  # parse them now, under the filter
        except ValueError as err:
            raise SNPError(field, "not a certificate (%s)" % err, "a PEM or DER certificate") from None
    return cert


def load_certificates(data: Union[bytes, str], field: str) -> List["x509.Certificate"]:
    """Every certificate of a PEM bundle (may be empty input: no certificate)."""
    _require_cryptography(field)
    if isinstance(data, str):
        data = data.encode()
    if not data:
        return []
    if not isinstance(data, (bytes, bytearray)):
        raise SNPError(field, type(data).__name__, "PEM certificates")
    with _ZERO_SERIAL_LOCK, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_ZERO_SERIAL_MESSAGE)
        try:
            if b"-----BEGIN" not in data:
                return [x509.load_der_x509_certificate(bytes(data))]
            return list(x509compat.load_pem_certificates(bytes(data)))
        except ValueError as err:
            raise SNPError(field, "not PEM certificates (%s)" % err, "PEM certificates") from None


def _require_cryptography(field: str) -> None:
    if not HAS_CRYPTOGRAPHY:
        raise InputError(field, "certificates, which need the Python package cryptography")


def _cn(name: "x509.Name") -> str:
    try:
        return name.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value
    except (IndexError, ValueError):
        return name.rfc4514_string()


def _der(cert: "x509.Certificate") -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def _fingerprint(cert: "x509.Certificate") -> str:
    return hashlib.sha256(_der(cert)).hexdigest()


def _verify_pss(cert: "x509.Certificate", issuer: "x509.Certificate", field: str) -> None:
    """``issuer`` signed ``cert`` the way AMD signs: RSASSA-PSS, SHA-384, MGF1 SHA-384, 48-byte salt."""
    if cert.issuer != issuer.subject:
        raise SNPError(field + ".issuer", _cn(cert.issuer), _cn(issuer.subject))
    if cert.signature_algorithm_oid.dotted_string != OID_RSASSA_PSS:
        raise SNPError(field + ".signature_algorithm", cert.signature_algorithm_oid.dotted_string,
                       "%s (RSASSA-PSS)" % OID_RSASSA_PSS)
    key = issuer.public_key()
    if not isinstance(key, rsa.RSAPublicKey):
        raise SNPError(field + ".issuer_key", type(key).__name__, "an RSA key")
    try:
        key.verify(cert.signature, cert.tbs_certificate_bytes,
                   padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=48), hashes.SHA384())
    except InvalidSignature:
        raise SNPError(field + ".signature", "a signature that does not verify with %s's key" % _cn(issuer.subject),
                       "signed by %s" % _cn(issuer.subject)) from None


def _check_validity(cert: "x509.Certificate", now: datetime.datetime, field: str) -> None:
    before, after = x509compat.not_valid_before(cert), x509compat.not_valid_after(cert)
    if not before <= now <= after:
        raise SNPError(field + ".validity", "%s outside %s to %s" % (_iso(now), _iso(before), _iso(after)),
                       "a certificate valid at %s" % _iso(now))


def _iso(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- roots ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AMDRoot:
    """One product line's ARK and the ASK/ASVK it signed (from the trust bundle, not from a peer)."""

    product: str
    ark: "x509.Certificate"
    intermediates: Tuple["x509.Certificate", ...] = ()


class AMDRoots:
    """Trust anchors per product line. An ARK must be self-signed (RSA-PSS SHA-384); an intermediate must be
    signed by one of the ARKs. ``fingerprint`` names this set (the chain cache keys on it)."""

    def __init__(self, roots: Sequence[AMDRoot]):
        if not roots:
            raise SNPError("amd_roots", "no ARK", "at least one self-signed AMD root key (ARK)")
        self.roots: Tuple[AMDRoot, ...] = tuple(roots)
        digest = hashlib.sha256()
        for root in self.roots:
            digest.update(_der(root.ark))
            for cert in root.intermediates:
                digest.update(_der(cert))
        self.fingerprint = digest.hexdigest()

    @property
    def products(self) -> List[str]:
        return [root.product for root in self.roots]

    def __repr__(self) -> str:
        return "AMDRoots(%s)" % ", ".join(self.products)

    @classmethod
    def from_certificates(cls, certs: Iterable["x509.Certificate"], field: str = "amd_roots") -> "AMDRoots":
        certs = list(certs)
        arks = [cert for cert in certs if cert.subject == cert.issuer]
        others = [cert for cert in certs if cert.subject != cert.issuer]
        roots: List[AMDRoot] = []
        seen = set()
        for ark in arks:
            if _fingerprint(ark) in seen:
                continue
            seen.add(_fingerprint(ark))
            _verify_pss(ark, ark, field + "." + _cn(ark.subject))
            mine = []
            for cert in others:
                if cert.issuer == ark.subject:
                    _verify_pss(cert, ark, field + "." + _cn(cert.subject))
                    if _fingerprint(cert) not in {_fingerprint(c) for c in mine}:
                        mine.append(cert)
            name = _cn(ark.subject)
            roots.append(AMDRoot(name[4:] if name.startswith("ARK-") else name, ark, tuple(mine)))
        orphans = [cert for cert in others if not any(cert.issuer == ark.subject for ark in arks)]
        if orphans:
            raise SNPError(field, "%s without its ARK" % _cn(orphans[0].subject), "ASK/ASVK beside the ARK that signed it")
        return cls(roots)

    def find(self, ark: "x509.Certificate") -> Optional[AMDRoot]:
        der = _der(ark)
        for root in self.roots:
            if _der(root.ark) == der:
                return root
        return None


_PINNED: Optional[AMDRoots] = None
_PINNED_LOCK = threading.Lock()


def pinned_roots() -> AMDRoots:
    """AMD's real ARKs (Milan, Genoa, Turin) with their ASKs and ASVKs (amd_roots.py), read once."""
    global _PINNED  # pylint: disable=global-statement
    with _PINNED_LOCK:
        if _PINNED is None:
            from ansible_collections.constellation.cluster.plugins.module_utils.attestation.amd_roots import AMD_CHAINS
            certs: List[x509.Certificate] = []
            for vcek_chain, vlek_chain in AMD_CHAINS.values():
                certs.extend(load_certificates(vcek_chain, "amd_roots"))
                certs.extend(load_certificates(vlek_chain, "amd_roots"))
            _PINNED = AMDRoots.from_certificates(certs, "amd_roots")
        return _PINNED


ROOT_FILE_SUFFIXES = (".pem", ".crt", ".cer")


def load_roots(paths: Union[str, bytes, Sequence[Union[str, bytes]]], field: str = "amd_roots") -> AMDRoots:
    """AMD roots from PEM file(s), folder(s) of them or PEM bytes: each self-signed certificate is an ARK,
    each other one an ASK/ASVK that one of these ARKs signed."""
    sources = [paths] if isinstance(paths, (str, bytes, bytearray)) else list(paths or [])
    if not sources:
        raise InputError(field, "PEM file(s) or folder(s) of AMD root certificates", paths)
    certs: List[x509.Certificate] = []
    for source in sources:
        if isinstance(source, (bytes, bytearray)):
            certs.extend(load_certificates(bytes(source), field))
            continue
        if not isinstance(source, str):
            raise InputError(field, "a path or PEM bytes", type(source).__name__)
        files = [source]
        if os.path.isdir(source):
            files = sorted(os.path.join(source, name) for name in os.listdir(source)
                           if name.lower().endswith(ROOT_FILE_SUFFIXES))
            if not files:
                raise InputError(field, "a folder holding PEM certificates", "%s (none found)" % source)
        for path in files:
            try:
                with open(path, "rb") as handle:
                    data = handle.read()
            except OSError as err:
                raise InputError(field, "a readable PEM file", "%s (%s)" % (path, err.strerror)) from None
            certs.extend(load_certificates(data, "%s (%s)" % (field, path)))
    return AMDRoots.from_certificates(certs, field)


# --- verification ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Signer:
    """What a verified VCEK/VLEK chain yields: cached per signer and roots."""

    product: str
    kind: str  # vcek | vlek
    public_key: Any
    hwid: Optional[bytes]
    spl: Dict[str, Optional[int]]
    not_before: datetime.datetime  # the intersection of the chain's validity periods
    not_after: datetime.datetime
    subject: str


class ChainCache:
    """Verified signer chains, so a signer's chain is verified once per process: bounded (least recently
    used goes first) and thread-safe. The key is the signer certificate, the chain offered with it and the
    roots; validity at ``now`` and the report's own checks still run every time."""

    def __init__(self, size: int = 256):
        self.size = max(1, int(size))
        self._entries: "OrderedDict[Tuple[str, str, str], _Signer]" = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Tuple[str, str, str]) -> Optional[_Signer]:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry

    def put(self, key: Tuple[str, str, str], entry: _Signer) -> None:
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


_PROCESS_CACHE = ChainCache()


def process_cache() -> ChainCache:
    """The process's one chain cache (the chooser's Trust.snp_cache)."""
    return _PROCESS_CACHE


@dataclass(frozen=True)
class VerifiedReport:
    report: Report
    product: str
    signing_key: str
    signer_subject: str = ""

    def to_dict(self) -> dict:
        result = self.report.to_dict()
        result["product"] = self.product
        result["signing_key"] = self.signing_key
        return result


def _ext_int(cert: "x509.Certificate", oid: str, field: str) -> Optional[int]:
    try:
        value = cert.extensions.get_extension_for_oid(x509.ObjectIdentifier(oid)).value.value
    except x509.ExtensionNotFound:
        return None
    # DER INTEGER, 0..255
    if len(value) < 3 or value[0] != 0x02 or value[1] != len(value) - 2 or value[1] > 2:
        raise SNPError(field, value, "a DER INTEGER from 0 to 255")
    number = int.from_bytes(value[2:], "big", signed=True)
    if not 0 <= number <= 255:
        raise SNPError(field, number, "0 to 255")
    return number


def _ext_bytes(cert: "x509.Certificate", oid: str) -> Optional[bytes]:
    try:
        return cert.extensions.get_extension_for_oid(x509.ObjectIdentifier(oid)).value.value
    except x509.ExtensionNotFound:
        return None


_SPL_OIDS = (("bootloader", OID_BL_SPL), ("tee", OID_TEE_SPL), ("snp", OID_SNP_SPL), ("microcode", OID_UCODE_SPL),
             ("fmc", OID_FMC_SPL), ("spl4", OID_SPL4), ("spl5", OID_SPL5), ("spl6", OID_SPL6), ("spl7", OID_SPL7))


def _verify_chain(signer: "x509.Certificate", kind: str, extra: List["x509.Certificate"], roots: AMDRoots) -> _Signer:
    name = kind  # vcek | vlek
    # A chain's ARK must be one of the pinned roots; the ASK/ASVK may come from the chain or the roots.
    candidates: List[Tuple[x509.Certificate, AMDRoot]] = []
    for cert in extra:
        if cert.subject == cert.issuer:
            if roots.find(cert) is None:
                raise SNPError("ark", "%s (sha256 %s)" % (_cn(cert.subject), _fingerprint(cert)),
                               "one of the pinned AMD roots (%s)" % ", ".join(roots.products))
    for cert in extra:
        if cert.subject != cert.issuer:
            for root in roots.roots:
                if cert.issuer == root.ark.subject:
                    candidates.append((cert, root))
    for root in roots.roots:
        candidates.extend((cert, root) for cert in root.intermediates)
    issuers = [(cert, root) for cert, root in candidates if cert.subject == signer.issuer]
    if not issuers:
        raise SNPError(name + ".issuer", _cn(signer.issuer),
                       "an ASK/ASVK under the pinned AMD roots (%s)" % ", ".join(roots.products))
    first: Optional[SNPError] = None
    for inter, root in issuers:
        try:
            _verify_pss(inter, root.ark, "ask" if kind == "vcek" else "asvk")
            _verify_pss(signer, inter, name)
        except SNPError as err:
            first = first or err  # the offered chain's own failure first
            continue
        key = signer.public_key()
        if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp384r1":
            raise SNPError(name + ".key", getattr(getattr(key, "curve", None), "name", type(key).__name__),
                           "an ECDSA P-384 key")
        hwid = _ext_bytes(signer, OID_HWID)
        csp = _ext_bytes(signer, OID_CSP_ID)
        if kind == "vcek" and (hwid is None or csp is not None):
            raise SNPError("vcek.hwID", "no hwID extension" if hwid is None else "a VLEK's CSP ID",
                           "a VCEK with hwID (%s)" % OID_HWID)
        if kind == "vlek" and (hwid is not None or csp is None):
            raise SNPError("vlek.cspID", "a VCEK's hwID" if hwid is not None else "no CSP ID extension",
                           "a VLEK with a CSP ID (%s)" % OID_CSP_ID)
        if hwid is not None and len(hwid) == 66 and hwid[:2] == b"\x04\x40":  # an OCTET STRING tag, should AMD add it
            hwid = hwid[2:]
        spl = {part: _ext_int(signer, oid, "%s.%s" % (name, part)) for part, oid in _SPL_OIDS}
        chain = (signer, inter, root.ark)
        return _Signer(product=root.product, kind=kind, public_key=key, hwid=hwid, spl=spl,
                       not_before=max(x509compat.not_valid_before(c) for c in chain),
                       not_after=min(x509compat.not_valid_after(c) for c in chain),
                       subject=_cn(signer.subject))
    assert first is not None
    raise first


def verify_report(report: Report, signer: Union[bytes, str], chain: Union[bytes, str] = b"",
                  roots: Optional[AMDRoots] = None, now: Optional[datetime.datetime] = None,
                  cache: Optional[ChainCache] = None) -> VerifiedReport:
    """Verify ``report``'s signature and its signer's chain to ``roots`` (default: pinned_roots()).
    Raises SNPError naming the field; returns the report (its TCBs read in the product's layout)."""
    if not isinstance(report, Report):
        raise SNPError("report", type(report).__name__, "a parsed Report")
    if report.signing_key == "none":
        raise SNPError("signing_key", "none (an unsigned report)", "vcek or vlek")
    roots = roots if roots is not None else pinned_roots()
    now = now or datetime.datetime.now(datetime.timezone.utc)
    if now.tzinfo is None:
        now = now.replace(tzinfo=datetime.timezone.utc)
    kind = report.signing_key
    signer_bytes = signer.encode() if isinstance(signer, str) else bytes(signer or b"")
    chain_bytes = chain.encode() if isinstance(chain, str) else bytes(chain or b"")
    key = (hashlib.sha256(signer_bytes).hexdigest(), hashlib.sha256(chain_bytes).hexdigest() + kind, roots.fingerprint)
    info = cache.get(key) if cache is not None else None
    if info is None:
        signer_cert = load_certificate(signer_bytes, kind)
        extra = load_certificates(chain_bytes, "chain")
        info = _verify_chain(signer_cert, kind, extra, roots)
        if cache is not None:
            cache.put(key, info)
    if not info.not_before <= now <= info.not_after:
        raise SNPError("%s.validity" % kind, "%s outside the chain's %s to %s"
                       % (_iso(now), _iso(info.not_before), _iso(info.not_after)),
                       "every certificate of the chain valid at %s" % _iso(now))
    if _layout(info.product) != _layout(report.tcb_product):
        report = parse_report(report.raw, info.product)
    if report.cpuid_fam_id is not None:
        named = product_from_cpuid(report.cpuid_fam_id, report.cpuid_mod_id or 0)
        if named is not None and named != info.product and info.product in PRODUCTS:
            found = "%s (family 0x%x model 0x%x)" % (named, report.cpuid_fam_id, report.cpuid_mod_id or 0)
            raise SNPError("cpuid_fam_id", found, "%s (the signer's product line)" % info.product)
    if kind == "vcek":
        if report.mask_chip_key:
            if any(report.chip_id):
                raise SNPError("chip_id", report.chip_id, "all zero (mask_chip_key is set)")
        elif info.hwid != report.chip_id:
            raise SNPError("vcek.hwID", info.hwid or b"", "the report's chip_id %s" % report.chip_id.hex())
    _check_tcb_extensions(report, info)
    signature = encode_dss_signature(report.signature_r, report.signature_s)
    try:
        info.public_key.verify(signature, report.raw[:SIGNED_SIZE], ec.ECDSA(hashes.SHA384()))
    except InvalidSignature:
        raise SNPError("signature", "a signature that does not verify with the %s %s" % (kind.upper(), info.subject),
                       "the report signed by its %s" % kind.upper()) from None
    return VerifiedReport(report=report, product=info.product, signing_key=kind, signer_subject=info.subject)


def _check_tcb_extensions(report: Report, info: _Signer) -> None:
    tcb = report.reported_tcb
    raw = report.raw[0x180:0x188]
    wanted = dict(tcb.to_dict())
    if _layout(info.product) != "turin":
        wanted.update(spl4=raw[2], spl5=raw[3], spl6=raw[4], spl7=raw[5])
    for part, value in info.spl.items():
        if part in ("bootloader", "tee", "snp", "microcode") and value is None:
            raise SNPError("%s.%s" % (info.kind, part), "no TCB extension", "the reported_tcb's %s" % part)
        if part == "fmc" and _layout(info.product) == "turin" and value is None:
            raise SNPError("%s.fmc" % info.kind, "no TCB extension", "the reported_tcb's fmc")
        if value is None or part not in wanted:
            continue
        if value != wanted[part]:
            raise SNPError("%s.%s" % (info.kind, part), value, "%d (the report's reported_tcb)" % wanted[part])


def check_report_data(report: Report, expected: bytes) -> None:
    """The report binds ``expected`` (at most 64 bytes, zero-padded to 64)."""
    expected = bytes(expected)
    if len(expected) > 64:
        raise SNPError("report_data", "%d bytes expected" % len(expected), "at most 64 bytes")
    padded = expected.ljust(64, b"\0")
    if not _consteq(report.report_data, padded):
        raise SNPError("report_data", report.report_data, padded)


def _consteq(a: bytes, b: bytes) -> bool:
    return hmac.compare_digest(a, b)


# --- policy ------------------------------------------------------------------------------------------------------

_TCB_KEYS = (("bootloaderVersion", "bootloader"), ("teeVersion", "tee"), ("snpVersion", "snp"),
             ("microcodeVersion", "microcode"), ("fmcVersion", "fmc"))
_POLICY_KEYS = {key for key, _part in _TCB_KEYS}
_POLICY_KEYS |= {"launchMeasurement", "idKeyDigest", "hostData", "guestSvn", "vmpl", "allowDebug", "allowMigrationAgent",
                 "amdRootKey"}


def _hex_bytes(value: Any, size: int, name: str) -> bytes:
    if not isinstance(value, str):
        raise InputError(name, "a hex string of %d bytes" % size, value)
    try:
        data = bytes.fromhex(value)
    except ValueError:
        raise InputError(name, "a hex string of %d bytes" % size, value) from None
    if len(data) != size:
        raise InputError(name, "a hex string of %d bytes" % size, "%d bytes" % len(data))
    return data


def _hex_list(value: Any, size: int, name: str) -> Tuple[bytes, ...]:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise InputError(name, "a hex string of %d bytes or a non-empty list of them" % size, value)
    return tuple(_hex_bytes(item, size, "%s[%d]" % (name, i) if isinstance(value, list) else name)
                 for i, item in enumerate(items))


def _int(value: Any, name: str, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= hi:
        raise InputError(name, "an integer from 0 to %d" % hi, value)
    return value


@dataclass(frozen=True)
class SNPPolicy:
    """What a report must show (the measurements document's ``snp`` object; Constellation's key names).
    TCB minimums apply to reported_tcb; ``launch_measurement``/``id_key_digest``: accepted values."""

    launch_measurement: Tuple[bytes, ...]
    bootloader_version: int = 0
    tee_version: int = 0
    snp_version: int = 0
    microcode_version: int = 0
    fmc_version: Optional[int] = None
    id_key_digest: Optional[Tuple[bytes, ...]] = None
    host_data: Optional[bytes] = None
    guest_svn: int = 0
    vmpl: Optional[int] = None
    allow_debug: bool = False
    allow_migration_agent: bool = False
    amd_root_key: Optional[str] = None
    field: str = dc_field(default="snp", compare=False)

    @classmethod
    def from_dict(cls, data: Any, field: str = "snp") -> "SNPPolicy":
        if not isinstance(data, Mapping):
            raise InputError(field, "a mapping (launchMeasurement, bootloaderVersion, ...)", data)
        unknown = sorted(str(key) for key in data if key not in _POLICY_KEYS)
        if unknown:
            raise InputError(field, "only the keys %s" % ", ".join(sorted(_POLICY_KEYS)), unknown)
        if "launchMeasurement" not in data:
            raise InputError(field + ".launchMeasurement", "the launch measurement (48 bytes hex, or a list)")
        kwargs: Dict[str, Any] = {"field": field}
        kwargs["launch_measurement"] = _hex_list(data["launchMeasurement"], 48, field + ".launchMeasurement")
        for key, part in _TCB_KEYS:
            if key in data:
                kwargs[part + "_version"] = _int(data[key], field + "." + key, 255)
        if "idKeyDigest" in data:
            kwargs["id_key_digest"] = _hex_list(data["idKeyDigest"], 48, field + ".idKeyDigest")
        if "hostData" in data:
            kwargs["host_data"] = _hex_bytes(data["hostData"], 32, field + ".hostData")
        if "guestSvn" in data:
            kwargs["guest_svn"] = _int(data["guestSvn"], field + ".guestSvn", 0xFFFFFFFF)
        if "vmpl" in data:
            kwargs["vmpl"] = _int(data["vmpl"], field + ".vmpl", 3)
        for key, name in (("allowDebug", "allow_debug"), ("allowMigrationAgent", "allow_migration_agent")):
            if key in data:
                if not isinstance(data[key], bool):
                    raise InputError(field + "." + key, "a boolean", data[key])
                kwargs[name] = data[key]
        if "amdRootKey" in data:
            pem = data["amdRootKey"]
            if not isinstance(pem, str) or "-----BEGIN CERTIFICATE-----" not in pem:
                raise InputError(field + ".amdRootKey", "the PEM of an AMD root key (ARK) certificate", pem)
            try:
                load_roots(pem.encode(), field + ".amdRootKey")
            except SNPError as err:
                raise InputError(field + ".amdRootKey", "a self-signed AMD root key (ARK) in AMD's profile",
                                 str(err)) from None
            kwargs["amd_root_key"] = pem
        return cls(**kwargs)

    def to_dict(self) -> dict:
        result: Dict[str, Any] = {}
        for key, part in _TCB_KEYS:
            value = getattr(self, part + "_version")
            if value is not None:
                result[key] = value
        result["launchMeasurement"] = ([m.hex() for m in self.launch_measurement] if len(self.launch_measurement) > 1
                                       else self.launch_measurement[0].hex())
        if self.id_key_digest is not None:
            result["idKeyDigest"] = ([d.hex() for d in self.id_key_digest] if len(self.id_key_digest) > 1
                                     else self.id_key_digest[0].hex())
        if self.host_data is not None:
            result["hostData"] = self.host_data.hex()
        result["guestSvn"] = self.guest_svn
        if self.vmpl is not None:
            result["vmpl"] = self.vmpl
        result["allowDebug"] = self.allow_debug
        result["allowMigrationAgent"] = self.allow_migration_agent
        if self.amd_root_key is not None:
            result["amdRootKey"] = self.amd_root_key
        return result

    def roots(self, default: Optional[AMDRoots] = None) -> AMDRoots:
        """The roots this policy trusts: its own ``amdRootKey`` if set, else ``default`` (else the pinned ones)."""
        if self.amd_root_key is not None:
            return load_roots(self.amd_root_key.encode(), self.field + ".amdRootKey")
        return default if default is not None else pinned_roots()

    def check(self, report: Report) -> None:
        """SNPError naming the first requirement ``report`` fails (``snp.<key>``), found and wanted."""
        f = self.field
        if report.policy.debug and not self.allow_debug:
            raise SNPError(f + ".allowDebug", "the guest policy's debug bit set (the host may read the guest)",
                           "debug off (allowDebug false)")
        if report.policy.migrate_ma and not self.allow_migration_agent:
            raise SNPError(f + ".allowMigrationAgent", "the guest policy's migrate_ma bit set",
                           "no migration agent (allowMigrationAgent false)")
        tcb = report.reported_tcb
        for key, part in _TCB_KEYS:
            minimum = getattr(self, part + "_version")
            if minimum is None:
                continue
            value = getattr(tcb, part)
            if value is None:  # fmc asked of a Milan/Genoa report
                raise SNPError(f + "." + key, "no %s in the reported TCB (%s layout)" % (part, report.tcb_product),
                               ">= %d" % minimum)
            if value < minimum:
                raise SNPError(f + "." + key, "%d (reported_tcb)" % value, ">= %d" % minimum)
        if report.guest_svn < self.guest_svn:
            raise SNPError(f + ".guestSvn", report.guest_svn, ">= %d" % self.guest_svn)
        if self.vmpl is not None and report.vmpl != self.vmpl:
            raise SNPError(f + ".vmpl", report.vmpl, self.vmpl)
        if report.measurement not in self.launch_measurement:
            raise SNPError(f + ".launchMeasurement", report.measurement,
                           " or ".join(m.hex() for m in self.launch_measurement))
        if self.id_key_digest is not None and report.id_key_digest not in self.id_key_digest:
            raise SNPError(f + ".idKeyDigest", report.id_key_digest, " or ".join(d.hex() for d in self.id_key_digest))
        if self.host_data is not None and report.host_data != self.host_data:
            raise SNPError(f + ".hostData", report.host_data, self.host_data)
