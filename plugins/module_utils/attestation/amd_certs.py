# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""AMD's certificates at hand for an SEV-SNP report whose platform did not send them (docs/attestation.md,
"Certificates at hand"): a cache folder (``amd_cert_cache``) of VCEKs, VLEKs and AMD's product chains, named by
product, chip_id and TCB with the names of AMD's Key Distribution Service (KDS), and fetching a missing VCEK or
chain from the KDS only when the operator says so (``amd_kds_fetch: true``), into the cache.

Nothing here is trusted: what the cache or the KDS returns is verified like a certificate the platform sent (the
chain to the pinned ARK, the VCEK's hwID and TCB extensions against the report). A poisoned cache can only make a
report fail, never pass.

Layout of the folder (``<tcb>`` is ``blSPL<n>-teeSPL<n>-snpSPL<n>-ucodeSPL<n>``, Turin's starts ``fmcSPL<n>-``;
``<hwid>`` is the report's chip_id in lower-case hex, its first 8 bytes on Turin as the KDS names it)::

    <folder>/<Product>/vcek-<hwid>-<tcb>.der      KDS: /vcek/v1/<Product>/<hwid>?blSPL=..&teeSPL=..&...
    <folder>/<Product>/vlek-<tcb>.der             a VLEK (the cloud's; the KDS hands these out to clouds only)
    <folder>/<Product>/cert_chain.pem             KDS: /vcek/v1/<Product>/cert_chain (ASK, then ARK)
    <folder>/<Product>/vlek_cert_chain.pem        KDS: /vlek/v1/<Product>/cert_chain (ASVK, then ARK)

``.pem`` stands in for ``.der`` (a certificate in either encoding)."""

from __future__ import annotations

import ipaddress
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable, Optional, Tuple

try:
    from cryptography.hazmat.primitives import serialization
except ImportError:  # the Core's loaders (sev_snp) name the missing package when a certificate is read
    serialization = None

from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError, InputError
from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_write
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.sev_snp import (
    PRODUCTS,
    Report,
    SNPError,
    load_certificate,
    load_certificates,
    product_from_cpuid,
)

KDS_URL = "https://kdsintf.amd.com"
CHIP_ID_SIZE = 64
TURIN_HWID_SIZE = 8  # the KDS names a Turin chip by the first 8 bytes of its chip_id
MAX_CERT = 64 * 1024  # a VCEK is about 1.3 KiB, a product chain about 4 KiB
DEFAULT_TIMEOUT = 10.0
_FIELDS = ("bootloader", "tee", "snp", "microcode")


class CertificateMissing(AttestationError):
    """No certificate for this chip and TCB: not in the report, not in the cache, and not fetched."""


def _tcb_parts(tcb, product: str):
    """(name, value) in the KDS's order from a TCB (sev_snp.TCB or anything with its fields, or a mapping)."""
    get = tcb.get if isinstance(tcb, dict) else (lambda name: getattr(tcb, name, None))
    parts = []
    if product == "Turin":
        fmc = get("fmc")
        if fmc is None:
            raise InputError("tcb.fmc", "Turin's FMC security patch level", None)
        parts.append(("fmcSPL", fmc))
    for kds_name, field in zip(("blSPL", "teeSPL", "snpSPL", "ucodeSPL"), _FIELDS):
        parts.append((kds_name, get(field)))
    for name, value in parts:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
            raise InputError("tcb." + name, "a security patch level 0..255", value)
    return parts


def tcb_name(tcb, product: str) -> str:
    """``blSPL3-teeSPL0-snpSPL8-ucodeSPL115`` (Turin: ``fmcSPL1-...``): a TCB as the cache names it."""
    return "-".join("%s%d" % part for part in _tcb_parts(tcb, product))


def _product(product: str) -> str:
    if product not in PRODUCTS:
        raise InputError("product", "one of %s" % ", ".join(PRODUCTS), product)
    return product


def hwid(chip_id: bytes, product: str) -> str:
    """The chip's name at the KDS: its chip_id in lower-case hex (Turin: the first 8 bytes)."""
    if not isinstance(chip_id, (bytes, bytearray)) or len(chip_id) != CHIP_ID_SIZE:
        raise InputError("chip_id", "%d bytes" % CHIP_ID_SIZE, chip_id)
    if not any(chip_id):
        raise InputError("chip_id", "a chip_id (the report masks it: MASK_CHIP_ID; use a VLEK or send the VCEK)",
                         "all zero")
    return bytes(chip_id[:TURIN_HWID_SIZE] if _product(product) == "Turin" else chip_id).hex()


def _load_cert(data: bytes, what: str) -> bytes:
    """The certificate's DER (PEM or DER in; AMD's zero serial numbers parse, as sev_snp reads them)."""
    try:
        cert = load_certificate(data, what)
    except SNPError as err:
        raise AttestationError("%s: expected an X.509 certificate (DER or PEM), got %d bytes that do not parse (%s)"
                               % (what, len(data), err.found)) from None
    return cert.public_bytes(serialization.Encoding.DER)


def _check_chain(data: bytes, what: str) -> bytes:
    """A product chain: two PEM certificates (AS(V)K, then ARK)."""
    try:
        certs = load_certificates(data, what) if b"-----BEGIN" in data else None
    except SNPError as err:
        raise AttestationError("%s: expected AMD's product chain (PEM: ASK or ASVK, then ARK), got %d bytes that do "
                               "not parse (%s)" % (what, len(data), err.found)) from None
    if certs is None:
        raise AttestationError("%s: expected AMD's product chain (PEM: ASK or ASVK, then ARK), got %d bytes of no PEM"
                               % (what, len(data)))
    if len(certs) != 2:
        raise AttestationError("%s: expected AMD's product chain of 2 certificates (ASK or ASVK, then ARK), got %d"
                               % (what, len(certs)))
    return data


def _check_kds_url(url: str) -> str:
    """HTTPS, or plain HTTP to a loopback address (the tests' stand-in for the KDS)."""
    parsed = urllib.parse.urlsplit(url)
    host = parsed.hostname or ""
    loopback = host == "localhost"
    try:
        loopback = loopback or ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    if parsed.scheme != "https" and not (parsed.scheme == "http" and loopback):
        raise InputError("kds_url", "an https:// URL", url)
    return url.rstrip("/")


class CertCache:
    """The ``amd_cert_cache`` folder, and the KDS behind it when ``kds_fetch`` is set.

    ``kds_url`` and ``opener`` exist for the tests (a loopback server standing for the KDS); operators get AMD's.
    """

    def __init__(self, folder: Optional[str], kds_fetch: bool = False, kds_url: str = KDS_URL,
                 timeout: float = DEFAULT_TIMEOUT, opener: Optional[Callable] = None):
        if folder is not None and (not isinstance(folder, str) or not folder):
            raise InputError("amd_cert_cache", "the path of a folder", folder)
        if folder is not None and os.path.exists(folder) and not os.path.isdir(folder):
            raise InputError("amd_cert_cache", "a folder", folder)
        if not isinstance(kds_fetch, bool):
            raise InputError("amd_kds_fetch", "true or false", kds_fetch)
        if kds_fetch and folder is None:
            raise InputError("amd_cert_cache", "a folder to keep what amd_kds_fetch fetches", None)
        self.folder = folder
        self.kds_fetch = kds_fetch
        self.kds_url = _check_kds_url(kds_url)
        self.timeout = timeout
        # urllib's default opener: this Core module runs in the agent too, which has no ansible-core (open_url).
        self._open = opener or urllib.request.build_opener().open

    # --- names -----------------------------------------------------------------------------------------------

    def _path(self, product: str, name: str) -> str:
        return os.path.join(self.folder, product, name)

    def _read(self, product: str, stem: str, suffixes=(".der", ".pem")) -> Optional[bytes]:
        if self.folder is None:
            return None
        for suffix in suffixes:
            path = self._path(product, stem + suffix)
            try:
                with open(path, "rb") as handle:
                    data = handle.read(MAX_CERT + 1)
            except FileNotFoundError:
                continue
            except OSError as err:
                raise InputError("amd_cert_cache", "a readable file", "%s: %s" % (path, err.strerror)) from None
            if len(data) > MAX_CERT:
                raise AttestationError("amd_cert_cache: %s: expected a certificate of at most %d bytes, got more"
                                       % (path, MAX_CERT))
            return data
        return None

    def _keep(self, product: str, name: str, data: bytes) -> None:
        os.makedirs(os.path.join(self.folder, product), mode=0o755, exist_ok=True)
        atomic_write(self._path(product, name), data, mode=0o644)

    # --- the KDS ---------------------------------------------------------------------------------------------

    def _fetch(self, path: str, what: str) -> bytes:
        url = self.kds_url + path
        try:
            with self._open(urllib.request.Request(url, headers={"Accept": "*/*"}), timeout=self.timeout) as reply:
                data = reply.read(MAX_CERT + 1)
        except urllib.error.HTTPError as err:
            hint = " (the KDS limits how often it answers: try again later)" if err.code == 429 else ""
            raise CertificateMissing("amd_kds_fetch: %s: AMD's KDS answered HTTP %d for %s%s"
                                     % (what, err.code, url, hint)) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", None) or err
            raise CertificateMissing("amd_kds_fetch: %s: AMD's KDS at %s could not be reached (%s)"
                                     % (what, url, reason)) from None
        if len(data) > MAX_CERT:
            raise AttestationError("amd_kds_fetch: %s: expected at most %d bytes from %s, got more"
                                   % (what, MAX_CERT, url))
        return data

    # --- what the verifier asks for --------------------------------------------------------------------------

    def vcek(self, product: str, chip_id: bytes, tcb) -> bytes:
        """The VCEK (DER) of this chip at this TCB: from the cache, else from the KDS if allowed (then cached)."""
        name = hwid(chip_id, product)
        tcb_text = tcb_name(tcb, product)
        stem = "vcek-%s-%s" % (name, tcb_text)
        what = "VCEK of chip_id %s at TCB %s (%s)" % (name, tcb_text, product)
        data = self._read(product, stem)
        if data is not None:
            return _load_cert(data, "amd_cert_cache: " + what)
        if not self.kds_fetch:
            raise CertificateMissing("%s: not in the report's certificates%s; put %s there or set amd_kds_fetch: true"
                                     % (what, self._looked(product, stem + ".der"), stem + ".der"))
        query = "&".join("%s=%d" % part for part in _tcb_parts(tcb, product))
        der = _load_cert(self._fetch("/vcek/v1/%s/%s?%s" % (product, name, query), what), "amd_kds_fetch: " + what)
        self._keep(product, stem + ".der", der)
        return der

    def vlek(self, product: str, tcb) -> bytes:
        """A VLEK (DER) at this TCB from the cache: the KDS gives VLEKs to clouds only, so nothing is fetched."""
        _product(product)
        tcb_text = tcb_name(tcb, product)
        stem = "vlek-%s" % tcb_text
        data = self._read(product, stem)
        if data is None:
            raise CertificateMissing("VLEK at TCB %s (%s): not in the report's certificates%s; the cloud provides "
                                     "VLEKs (AMD's KDS hands them to clouds only): put %s there"
                                     % (tcb_text, product, self._looked(product, stem + ".der"), stem + ".der"))
        return _load_cert(data, "amd_cert_cache: VLEK at TCB %s (%s)" % (tcb_text, product))

    def cert_chain(self, product: str, signing_key: str = "vcek") -> bytes:
        """AMD's product chain (PEM: ASK or ASVK, then ARK) for VCEKs or VLEKs."""
        _product(product)
        if signing_key not in ("vcek", "vlek"):
            raise InputError("signing_key", "vcek or vlek", signing_key)
        stem = "cert_chain" if signing_key == "vcek" else "vlek_cert_chain"
        what = "AMD's %s chain for %s" % ("ASK" if signing_key == "vcek" else "ASVK", product)
        data = self._read(product, stem, (".pem",))
        if data is not None:
            return _check_chain(data, "amd_cert_cache: " + what)
        if not self.kds_fetch:
            raise CertificateMissing("%s: not in the report's certificates%s; put %s there or set amd_kds_fetch: true"
                                     % (what, self._looked(product, stem + ".pem"), stem + ".pem"))
        pem = _check_chain(self._fetch("/%s/v1/%s/cert_chain" % (signing_key, product), what),
                           "amd_kds_fetch: " + what)
        self._keep(product, stem + ".pem", pem)
        return pem

    def _looked(self, product: str, name: str) -> str:
        if self.folder is None:
            return " and no amd_cert_cache is set"
        return " nor in amd_cert_cache (%s)" % self._path(product, name)


def certs_for_report(report: Report, cache: CertCache, product: Optional[str] = None) -> Tuple[bytes, bytes]:
    """(signer DER, chain PEM) for a report whose platform sent no certificates: its VCEK (by chip_id and
    reported_tcb) or VLEK (by reported_tcb) and AMD's product chain, from ``cache``. The product line is ``product``,
    else the one a version 3+ report's CPUID names; a version 2 report is looked up as Milan, then Genoa."""
    if not isinstance(report, Report):
        raise InputError("report", "a parsed SEV-SNP report", type(report).__name__)
    if report.signing_key not in ("vcek", "vlek"):
        raise InputError("report.signing_key", "vcek or vlek", report.signing_key)
    named = product or (product_from_cpuid(report.cpuid_fam_id, report.cpuid_mod_id or 0)
                        if report.cpuid_fam_id is not None else None)
    candidates = [named] if named else ["Milan", "Genoa"]  # Turin reports are version 3 or later
    missing: Optional[CertificateMissing] = None
    for line in candidates:
        try:
            if report.signing_key == "vcek":
                signer = cache.vcek(line, report.chip_id, report.reported_tcb)
            else:
                signer = cache.vlek(line, report.reported_tcb)
        except CertificateMissing as err:
            missing = missing or err
            continue
        return signer, cache.cert_chain(line, report.signing_key)
    raise missing  # type: ignore[misc]  # candidates is never empty
