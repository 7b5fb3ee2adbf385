# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""AMD SEV-SNP's certificate chain: the trust anchors (``AMDRoots``: AMD's pinned ARKs with their ASKs/ASVKs, or a
configured bundle), the verification of a report's signer (ARK -> ASK/ASVK -> VCEK/VLEK, RSA-PSS SHA-384, validity,
the VCEK's hwID and TCB extensions) and of the report's ECDSA P-384 signature, and the bounded cache of verified
chains. The interface is sev_snp.py's (docs/attestation.md, "AMD SEV-SNP reports")."""

from __future__ import annotations

import datetime
import hashlib
import os
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from ansible_collections.constellation.cluster.plugins.module_utils import x509compat
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.amd_roots import AMD_ROOTS
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.sev_snp_abi import (
    PRODUCTS, SIGNED_SIZE, Report, SNPError, _layout, parse_report, product_from_cpuid)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError

try:
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
    HAS_CRYPTOGRAPHY = True
except ImportError:  # pragma: no cover - reported where a certificate is needed
    HAS_CRYPTOGRAPHY = False

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
MAX_CHAIN_CERTS = 4

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
    certs = load_certificates(bytes(data), field)
    if len(certs) != 1:
        raise SNPError(field, "%d certificates" % len(certs), "one certificate")
    return certs[0]


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
                certs = [x509.load_der_x509_certificate(bytes(data))]
            else:
                certs = list(x509compat.load_pem_certificates(bytes(data)))
            for cert in certs:
                _parse_all(cert)
        except (ValueError, TypeError, x509.InvalidVersion, x509.DuplicateExtension, UnsupportedAlgorithm) as err:
            raise SNPError(field, "not a valid certificate (%s)" % str(err)[:200], "PEM or DER X.509 certificates") \
                from None
    return certs


def _parse_all(cert: "x509.Certificate") -> None:
    """cryptography parses a certificate's parts when first read: read each now, so a malformed one fails here
    (named) and never later in a check."""
    for part in ("subject", "issuer", "extensions", "signature_algorithm_oid", "signature", "tbs_certificate_bytes"):
        getattr(cert, part)
    x509compat.not_valid_before(cert)
    x509compat.not_valid_after(cert)
    cert.public_key()


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
            certs: List[x509.Certificate] = []
            for product in AMD_ROOTS.values():
                for name in ("ark", "ask", "asvk"):
                    certs.extend(load_certificates(product[name], "amd_roots"))
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
    if first is None:
        raise SNPError("roots", "no trust anchor", "at least one AMD root")
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
        if len(extra) > MAX_CHAIN_CERTS:  # each may cost an RSA check: a peer's chain is bounded
            raise SNPError("chain", "%d certificates" % len(extra), "at most %d (ASK/ASVK and ARK)" % MAX_CHAIN_CERTS)
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
