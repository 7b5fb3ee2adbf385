# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Real SEV-SNP reports (testdata/sev_snp/README.md names their sources) and a software chain in AMD's
certificate profile (ARK -> ASK -> VCEK, RSA-PSS SHA-384, VCEK ECDSA P-384 with hwID and TCB extensions) for
reports we sign ourselves: the attacker's kit in the attack tests."""

from __future__ import annotations

import base64
import datetime
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import sev_snp

DATA = Path(__file__).parents[1] / "unit" / "attestation" / "testdata" / "sev_snp"
UTC = datetime.timezone.utc


def read(name: str) -> bytes:
    return (DATA / name).read_bytes()


@dataclass(frozen=True)
class Vector:
    name: str
    report: bytes
    signer: bytes
    chain: bytes
    now: datetime.datetime
    kind: str


def vectors():
    """Every real report whose signature verifies, with its signer, chain and a moment inside its validity."""
    return [
        Vector("go-sev-guest", read("go-sev-guest/attestation.bin"), read("go-sev-guest/vcek.testcer"),
               read("go-sev-guest/milan.testcer"), datetime.datetime(2024, 6, 1, tzinfo=UTC), "vcek"),
        Vector("azure", read("constellation-azure/attestation.bin")[:sev_snp.REPORT_SIZE],
               read("constellation-azure/vcek.pem"), read("constellation-azure/certchain.pem"),
               datetime.datetime(2024, 6, 1, tzinfo=UTC), "vcek"),
        Vector("azure-kds-vcek", read("constellation-azure/attestation.bin")[:sev_snp.REPORT_SIZE],
               read("constellation-azure/vcek.cert"), b"", datetime.datetime(2024, 6, 1, tzinfo=UTC), "vcek"),
        Vector("aws", base64.b64decode(read("constellation-aws/report.txt")), read("constellation-aws/vlek.pem"),
               read("constellation-aws/certchain.pem"), datetime.datetime(2025, 6, 1, tzinfo=UTC), "vlek"),
    ]


def vector(name: str) -> Vector:
    return next(v for v in vectors() if v.name == name)


def matching_policy(report: sev_snp.Report, **overrides) -> dict:
    """The ``snp`` object a report passes exactly (its TCB as minimums, its measurement, digest, host data)."""
    policy = {
        "bootloaderVersion": report.reported_tcb.bootloader, "teeVersion": report.reported_tcb.tee,
        "snpVersion": report.reported_tcb.snp, "microcodeVersion": report.reported_tcb.microcode,
        "launchMeasurement": report.measurement.hex(), "idKeyDigest": report.id_key_digest.hex(),
        "hostData": report.host_data.hex(), "guestSvn": report.guest_svn, "vmpl": report.vmpl,
        "allowDebug": report.policy.debug, "allowMigrationAgent": report.policy.migrate_ma,
    }
    policy.update(overrides)
    return policy


# --- an AMD-profile chain of our own --------------------------------------------------------------------------

_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=48)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "Engineering"),
                      x509.NameAttribute(NameOID.COUNTRY_NAME, "US"),
                      x509.NameAttribute(NameOID.LOCALITY_NAME, "Santa Clara"),
                      x509.NameAttribute(NameOID.STATE_OR_PROVINCE_NAME, "CA"),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Advanced Micro Devices"),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _u8(value: int) -> bytes:
    body = value.to_bytes(2, "big").lstrip(b"\0") or b"\0"
    if body[0] & 0x80:
        body = b"\0" + body
    return bytes([0x02, len(body)]) + body


def _ext(builder, oid: str, value: bytes):
    return builder.add_extension(x509.UnrecognizedExtension(x509.ObjectIdentifier(oid), value), critical=False)


@dataclass
class Chain:
    """A chain in AMD's profile under our own ARK ("ARK-<product>")."""

    product: str
    ark_key: rsa.RSAPrivateKey
    ark: x509.Certificate
    ask_key: rsa.RSAPrivateKey
    ask: x509.Certificate
    not_before: datetime.datetime
    not_after: datetime.datetime

    @property
    def roots_pem(self) -> bytes:
        return pem(self.ark) + pem(self.ask)

    @property
    def chain_pem(self) -> bytes:
        return pem(self.ask) + pem(self.ark)

    def roots(self) -> sev_snp.AMDRoots:
        return sev_snp.load_roots(self.roots_pem)

    def vcek(self, chip_id: bytes, tcb: sev_snp.TCB, key: Optional[ec.EllipticCurvePrivateKey] = None,
             not_after: Optional[datetime.datetime] = None, hwid: bool = True,
             vlek: bool = False):
        """A VCEK for ``chip_id`` at ``tcb``; returns (key, PEM)."""
        key = key or ec.generate_private_key(ec.SECP384R1())
        builder = (x509.CertificateBuilder().subject_name(_name("SEV-VLEK" if vlek else "SEV-VCEK"))
                   .issuer_name(self.ask.subject).public_key(key.public_key()).serial_number(1)
                   .not_valid_before(self.not_before).not_valid_after(not_after or self.not_after))
        builder = _ext(builder, sev_snp.OID_STRUCT_VERSION, _u8(0))
        builder = _ext(builder, sev_snp.OID_PRODUCT_NAME, b"\x16" + bytes([len(self.product)]) + self.product.encode())
        builder = _ext(builder, sev_snp.OID_BL_SPL, _u8(tcb.bootloader))
        builder = _ext(builder, sev_snp.OID_TEE_SPL, _u8(tcb.tee))
        builder = _ext(builder, sev_snp.OID_SNP_SPL, _u8(tcb.snp))
        builder = _ext(builder, sev_snp.OID_UCODE_SPL, _u8(tcb.microcode))
        if tcb.fmc is not None:
            builder = _ext(builder, sev_snp.OID_FMC_SPL, _u8(tcb.fmc))
        if vlek:
            builder = _ext(builder, sev_snp.OID_CSP_ID, b"\x16\x0bCN=lab.test")
        elif hwid:
            builder = _ext(builder, sev_snp.OID_HWID, chip_id)
        cert = builder.sign(self.ask_key, hashes.SHA384(), rsa_padding=_PSS)
        return key, pem(cert)


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def make_chain(product: str = "Milan", bits: int = 2048, not_before: Optional[datetime.datetime] = None,
               not_after: Optional[datetime.datetime] = None) -> Chain:
    not_before = not_before or datetime.datetime(2020, 1, 1, tzinfo=UTC)
    not_after = not_after or datetime.datetime(2045, 1, 1, tzinfo=UTC)
    ark_key = rsa.generate_private_key(65537, bits)
    ask_key = rsa.generate_private_key(65537, bits)
    ark_name, ask_name = _name("ARK-" + product), _name("SEV-" + product)
    ca = x509.BasicConstraints(ca=True, path_length=None)
    ark = (x509.CertificateBuilder().subject_name(ark_name).issuer_name(ark_name).public_key(ark_key.public_key())
           .serial_number(0x10000).not_valid_before(not_before).not_valid_after(not_after)
           .add_extension(ca, critical=True).sign(ark_key, hashes.SHA384(), rsa_padding=_PSS))
    ask = (x509.CertificateBuilder().subject_name(ask_name).issuer_name(ark_name).public_key(ask_key.public_key())
           .serial_number(0x10001).not_valid_before(not_before).not_valid_after(not_after)
           .add_extension(ca, critical=True).sign(ark_key, hashes.SHA384(), rsa_padding=_PSS))
    return Chain(product, ark_key, ark, ask_key, ask, not_before, not_after)


def sign(report: bytes, key: ec.EllipticCurvePrivateKey) -> bytes:
    """``report`` with a fresh signature by ``key`` (r, s little-endian, 72 bytes each)."""
    der = key.sign(report[:sev_snp.SIGNED_SIZE], ec.ECDSA(hashes.SHA384()))
    r, s = decode_dss_signature(der)
    sig = r.to_bytes(72, "little") + s.to_bytes(72, "little")
    return report[:sev_snp.SIGNED_SIZE] + sig + bytes(sev_snp.REPORT_SIZE - sev_snp.SIGNED_SIZE - len(sig))


def put(report: bytes, offset: int, value: bytes) -> bytes:
    return report[:offset] + value + report[offset + len(value):]


def put_u32(report: bytes, offset: int, value: int) -> bytes:
    return put(report, offset, struct.pack("<I", value))


def put_u64(report: bytes, offset: int, value: int) -> bytes:
    return put(report, offset, struct.pack("<Q", value))
