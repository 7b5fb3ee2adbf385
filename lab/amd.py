# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's AMD: a key hierarchy in AMD's certificate profile, standing for AMD as the lab CA stands for the TPM
vendor (docs/testing.md, "The lab as an SEV-SNP platform").

``AMDChain(folder)`` makes once, in its own folder of the lab's state:

- the ARK (AMD Root Key): RSA-4096, self-signed with RSA-PSS SHA-384 (salt 48), CN ``ARK-Milan``;
- the ASK (AMD SEV Key, CN ``SEV-Milan``) and the ASVK (CN ``SEV-VLEK-Milan``): RSA-4096, signed by the ARK the
  same way, CA with path length 0;
- ``roots.pem``: ASK, ASVK and ARK, what an operator pins (``amd_roots``), as AMD publishes its ``cert_chain``.

and issues, as AMD's key distribution service does, a VCEK per chip and TCB (ECDSA P-384, CN ``SEV-VCEK``, signed
by the ASK, with AMD's extensions: struct version, product name ``Milan-B0``, the TCB's security patch levels and the
chip's 64-byte hwID, untagged as AMD writes it) and a VLEK per cloud and TCB (CN ``SEV-VLEK``, signed by the ASVK,
product name ``Milan`` and the cloud's CSP_ID in place of the hwID). The VCEK/VLEK private keys are the platform's
(lab/snp_platform.py): AMD certifies a public key it knows from the chip.

The extensions' object identifiers and encodings are those AMD's certificates carry (go-sev-guest's kds/kds.go
reads them the same way). ``AMDChain(folder_of_another_lab)`` with another ARK is the "foreign" chain: the same
profile and names, a root nobody pinned (a report signed in software).
"""

from __future__ import annotations

import datetime
import os
import threading
from pathlib import Path
from typing import Dict, List, Tuple

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import NameOID

from ansible_collections.constellation.cluster.plugins.module_utils import fileutil

PRODUCT = "Milan"
ARK_CN, ASK_CN, ASVK_CN = "ARK-Milan", "SEV-Milan", "SEV-VLEK-Milan"
VCEK_CN, VLEK_CN = "SEV-VCEK", "SEV-VLEK"
VCEK_PRODUCT_NAME = "Milan-B0"  # a VCEK names the product and its stepping; a VLEK only the product
VLEK_PRODUCT_NAME = PRODUCT
LAB_CSP_ID = "lab.constellation.cluster"  # the lab "cloud" a VLEK is issued to
ROOT_DAYS, VCEK_DAYS = 25 * 366, 7 * 366  # AMD's roots are valid for 25 years, its VCEKs for 7
RSA_BITS = 4096
FOLDER = "amd"  # in the lab's state folder
FOREIGN_FOLDER = "amd-foreign"

# AMD's VCEK/VLEK extensions, under 1.3.6.1.4.1.3704.1 (AMD's key distribution service specification).
_AMD = "1.3.6.1.4.1.3704.1."
OID_STRUCT_VERSION = x509.ObjectIdentifier(_AMD + "1")
OID_PRODUCT_NAME = x509.ObjectIdentifier(_AMD + "2")
OID_BL_SPL = x509.ObjectIdentifier(_AMD + "3.1")
OID_TEE_SPL = x509.ObjectIdentifier(_AMD + "3.2")
OID_SNP_SPL = x509.ObjectIdentifier(_AMD + "3.3")
OID_SPL = {n: x509.ObjectIdentifier(_AMD + "3.%d" % n) for n in (4, 5, 6, 7)}  # reserved, zero
OID_UCODE_SPL = x509.ObjectIdentifier(_AMD + "3.8")
OID_HWID = x509.ObjectIdentifier(_AMD + "4")
OID_CSP_ID = x509.ObjectIdentifier(_AMD + "5")

TCB_FIELDS = ("bootloader", "tee", "snp", "microcode")

_LOCK = threading.Lock()


def pss() -> padding.PSS:
    """AMD's certificate signatures: RSA-PSS, SHA-384, MGF1 SHA-384, salt length 48."""
    return padding.PSS(mgf=padding.MGF1(hashes.SHA384()), salt_length=48)


def amd_name(common_name: str) -> x509.Name:
    """A name as AMD writes them (its order of attributes)."""
    return x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "Engineering"),
        x509.NameAttribute(NameOID.COUNTRY_NAME, "US"),
        x509.NameAttribute(NameOID.LOCALITY_NAME, "Santa Clara"),
        x509.NameAttribute(NameOID.STATE_OR_PROVINCE_NAME, "CA"),
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Advanced Micro Devices"),
        x509.NameAttribute(NameOID.COMMON_NAME, common_name),
    ])


def der_integer(value: int) -> bytes:
    """DER INTEGER of 0..255 (a security patch level)."""
    if not 0 <= value <= 255:
        raise ValueError("a security patch level is 0..255, got %r" % value)
    body = bytes([value]) if value < 0x80 else b"\x00" + bytes([value])
    return b"\x02" + bytes([len(body)]) + body


def der_ia5(text: str) -> bytes:
    data = text.encode("ascii")
    if len(data) > 127:
        raise ValueError("IA5String too long for the lab: %r" % text)
    return b"\x16" + bytes([len(data)]) + data


def check_tcb(tcb: Dict[str, int]) -> Dict[str, int]:
    """{bootloader, tee, snp, microcode} of 0..255 each (the SPLs a Milan/Genoa TCB_VERSION holds)."""
    out = {}
    for name in TCB_FIELDS:
        value = tcb.get(name) if isinstance(tcb, dict) else None
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
            raise ValueError("tcb.%s: expected an integer 0..255, got %r" % (name, value))
        out[name] = value
    return out


def _tcb_extensions(tcb: Dict[str, int]) -> List[Tuple[x509.ObjectIdentifier, bytes]]:
    tcb = check_tcb(tcb)
    # AMD's order: blSPL, teeSPL, the reserved SPLs 4-7, snpSPL, ucodeSPL.
    return ([(OID_BL_SPL, der_integer(tcb["bootloader"])), (OID_TEE_SPL, der_integer(tcb["tee"]))]
            + [(OID_SPL[n], der_integer(0)) for n in (4, 5, 6, 7)]
            + [(OID_SNP_SPL, der_integer(tcb["snp"])), (OID_UCODE_SPL, der_integer(tcb["microcode"]))])


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _now() -> datetime.datetime:
    # A day back, so that a verifier whose clock is a little behind still finds the certificate valid.
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0) - datetime.timedelta(days=1)


class AMDChain:
    """One AMD key hierarchy of the lab in ``folder`` (made once by ``ensure``; see the module's doc)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._certs: Dict[str, x509.Certificate] = {}
        self._keys: Dict[str, rsa.RSAPrivateKey] = {}

    # -- files --------------------------------------------------------------------------
    @property
    def roots_path(self) -> Path:
        """ASK, ASVK and ARK (PEM): the bundle an agent and a verifier pin as ``amd_roots``."""
        return self.folder / "roots.pem"

    @property
    def ark_path(self) -> Path:
        return self.folder / "ark.pem"

    def cert_path(self, name: str) -> Path:
        return self.folder / ("%s.pem" % name)

    def key_path(self, name: str) -> Path:
        return self.folder / ("%s.key" % name)

    def exists(self) -> bool:
        return self.roots_path.exists()

    # -- making ---------------------------------------------------------------------------
    def ensure(self) -> "AMDChain":
        """Makes the ARK, ASK and ASVK once (the roots bundle is written last: its presence means complete)."""
        with _LOCK:
            if self.exists():
                return self
            self.folder.mkdir(parents=True, exist_ok=True)
            os.chmod(str(self.folder), 0o700)
            ark_key = rsa.generate_private_key(public_exponent=65537, key_size=RSA_BITS)
            ark = self._ca_cert(ark_key, ark_key, amd_name(ARK_CN), amd_name(ARK_CN), None)
            made = {"ark": (ark_key, ark)}
            for name, cn in (("ask", ASK_CN), ("asvk", ASVK_CN)):
                key = rsa.generate_private_key(public_exponent=65537, key_size=RSA_BITS)
                made[name] = (key, self._ca_cert(key, ark_key, amd_name(cn), ark.subject, ark))
            for name, (key, cert) in made.items():
                fileutil.atomic_write(str(self.key_path(name)), _key_pem(key), 0o600)
                fileutil.atomic_write(str(self.cert_path(name)), _pem(cert), 0o644)
            fileutil.atomic_write(str(self.roots_path), _pem(made["ask"][1]) + _pem(made["asvk"][1]) + _pem(ark),
                                  0o644)
        return self

    @staticmethod
    def _ca_cert(key, issuer_key, subject: x509.Name, issuer: x509.Name, issuer_cert) -> x509.Certificate:
        start = _now()
        ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(start).not_valid_after(start + datetime.timedelta(days=ROOT_DAYS))
                   .add_extension(ski, critical=False))
        if issuer_cert is None:  # the ARK
            builder = (builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                       .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                                      critical=True))
        else:
            builder = (builder.add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                       .add_extension(x509.KeyUsage(False, False, False, False, False, True, False, False, False),
                                      critical=True)
                       .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                                      critical=False))
        return builder.sign(issuer_key, hashes.SHA384(), rsa_padding=pss())

    # -- reading --------------------------------------------------------------------------
    def cert(self, name: str) -> x509.Certificate:
        """"ark", "ask" or "asvk"."""
        if name not in self._certs:
            self.ensure()
            self._certs[name] = x509.load_pem_x509_certificate(self.cert_path(name).read_bytes())
        return self._certs[name]

    def cert_der(self, name: str) -> bytes:
        return self.cert(name).public_bytes(serialization.Encoding.DER)

    def _key(self, name: str):
        if name not in self._keys:
            self.ensure()
            self._keys[name] = serialization.load_pem_private_key(self.key_path(name).read_bytes(), None)
        return self._keys[name]

    # -- the key distribution service ------------------------------------------------------
    def issue_vcek(self, public_key: ec.EllipticCurvePublicKey, chip_id: bytes, tcb: Dict[str, int],
                   product_name: str = VCEK_PRODUCT_NAME) -> x509.Certificate:
        """The VCEK certificate of the chip ``chip_id`` (64 bytes) at ``tcb``, signed by the ASK."""
        if len(chip_id) != 64:
            raise ValueError("chip_id: expected 64 bytes, got %d" % len(chip_id))
        extensions = ([(OID_STRUCT_VERSION, der_integer(0)), (OID_PRODUCT_NAME, der_ia5(product_name))]
                      + _tcb_extensions(tcb) + [(OID_HWID, bytes(chip_id))])  # AMD writes the hwID untagged
        return self._endorsement(public_key, VCEK_CN, "ask", extensions)

    def issue_vlek(self, public_key: ec.EllipticCurvePublicKey, tcb: Dict[str, int], csp_id: str = LAB_CSP_ID,
                   product_name: str = VLEK_PRODUCT_NAME) -> x509.Certificate:
        """The VLEK certificate of the cloud ``csp_id`` at ``tcb``, signed by the ASVK."""
        extensions = ([(OID_STRUCT_VERSION, der_integer(0)), (OID_PRODUCT_NAME, der_ia5(product_name))]
                      + _tcb_extensions(tcb) + [(OID_CSP_ID, der_ia5(csp_id))])
        return self._endorsement(public_key, VLEK_CN, "asvk", extensions)

    def _endorsement(self, public_key, common_name: str, signer: str,
                     extensions: List[Tuple[x509.ObjectIdentifier, bytes]]) -> x509.Certificate:
        if not isinstance(public_key, ec.EllipticCurvePublicKey) or public_key.curve.name != "secp384r1":
            raise ValueError("a VCEK/VLEK is an ECDSA P-384 key")
        start = _now()
        builder = (x509.CertificateBuilder().subject_name(amd_name(common_name))
                   .issuer_name(self.cert(signer).subject).public_key(public_key)
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(start).not_valid_after(start + datetime.timedelta(days=VCEK_DAYS)))
        for oid, value in extensions:
            builder = builder.add_extension(x509.UnrecognizedExtension(oid, value), critical=False)
        return builder.sign(self._key(signer), hashes.SHA384(), rsa_padding=pss())


def lab_chain(state_dir: Path) -> AMDChain:
    """The lab's AMD (``<lab state>/amd``)."""
    return AMDChain(Path(state_dir) / FOLDER)


def foreign_chain(state_dir: Path) -> AMDChain:
    """Another AMD with the same profile and names (``<lab state>/amd-foreign``): nobody pins its ARK."""
    return AMDChain(Path(state_dir) / FOREIGN_FOLDER)
