# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""AMD SEV-SNP's binary formats: the ATTESTATION_REPORT (0x4A0 bytes, versions 2 to 5), its TCB versions (Milan/Genoa
and Turin layouts) and guest policy, and the extended report's certificate table; ``SNPError``. Read strictly:
an error names the field, what was found and what was wanted. The interface is sev_snp.py's
(docs/attestation.md, "AMD SEV-SNP reports")."""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass, field as dc_field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError

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
