# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The EK trust anchor of variant ``qemu-vtpm-ek`` (ek.py): CA certificates from a PEM file (a bundle
of several CAs, as TPM vendors and cloud vTPMs publish them) or a folder of PEM files, and the check
that an EK certificate (RSA-2048+ or ECC P-256/P-384, an end-entity certificate fit for an EK under the
TCG EK credential profile) chains to a self-signed root of that bundle,
through intermediates given beside the roots or offered by the TPM's NV (untrusted links). A CA
certificate that is not self-signed is never a trust anchor. No TPM code here."""

from __future__ import annotations

import datetime
import os
from typing import Iterable, List, Sequence

from ansible_collections.constellation.cluster.plugins.module_utils import x509compat
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError, InputError

try:
    from cryptography import x509
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    HAS_CRYPTOGRAPHY = True
except ImportError:
    HAS_CRYPTOGRAPHY = False

_MAX_CHAIN = 5
if HAS_CRYPTOGRAPHY:
    # TCG EK Credential Profile: the extended key usage of an EK certificate.
    TCG_KP_EK_CERTIFICATE = x509.ObjectIdentifier("2.23.133.8.1")
_MAX_NV_CHAIN_CERTS = 8


CA_FILE_SUFFIXES = (".pem", ".crt", ".cer")


def _expand_folders(sources: Iterable, field: str) -> List:
    """A folder stands for its certificate files (``*.pem``, ``*.crt``, ``*.cer``, sorted), as TPM
    vendors and cloud vTPMs publish their EK CAs one file each; other files are ignored."""
    expanded: List = []
    for source in sources:
        if isinstance(source, str) and os.path.isdir(source):
            files = sorted(os.path.join(source, name) for name in os.listdir(source)
                           if name.lower().endswith(CA_FILE_SUFFIXES) and os.path.isfile(os.path.join(source, name)))
            if not files:
                raise InputError(field, "a folder holding CA certificates (%s)" % ", ".join(CA_FILE_SUFFIXES),
                                 "%s (none found)" % source)
            expanded.extend(files)
        else:
            expanded.append(source)
    return expanded


def load_ca_certs(sources: Iterable, field: str = "ca_certs") -> List["x509.Certificate"]:
    """CA certificates from PEM paths, folders of PEM files, PEM/DER bytes or Certificate objects
    (bundles of several CAs allowed)."""
    if not HAS_CRYPTOGRAPHY:
        raise InputError(field, "CA certificates, which need the Python package cryptography")
    certs: List[x509.Certificate] = []
    for source in _expand_folders(sources, field):
        if isinstance(source, x509.Certificate):
            certs.append(source)
            continue
        data = source
        if isinstance(source, str):
            try:
                with open(source, "rb") as handle:
                    data = handle.read()
            except OSError as err:
                raise InputError(field, "a readable PEM file", "%s (%s)" % (source, err.strerror)) from None
        if not isinstance(data, (bytes, bytearray)):
            raise InputError(field, "PEM or DER X.509 certificates", type(data).__name__)
        try:
            if b"-----BEGIN" in data:
                certs.extend(x509compat.load_pem_certificates(bytes(data)))
            else:
                certs.append(x509.load_der_x509_certificate(bytes(data)))
        except ValueError as err:
            raise InputError(field, "PEM or DER X.509 certificates", str(err)) from None
    if not certs:
        raise InputError(field, "at least one CA certificate", "none")
    return certs


def is_self_signed(cert: "x509.Certificate") -> bool:
    """Names itself as issuer and its signature verifies with its own key: a root."""
    if cert.subject != cert.issuer:
        return False
    try:
        x509compat.verify_directly_issued_by(cert, cert)
    except Exception:  # pylint: disable=broad-except  # InvalidSignature or an unsupported algorithm
        return False
    return True


def check_trust_anchors(certs: Sequence["x509.Certificate"], field: str = "ek_ca") -> None:
    """An EK trust bundle must hold at least one self-signed CA (a root): the other CA
    certificates in it are intermediates, links of a chain that must end at such a root, never
    trust anchors themselves (verify_ek_cert)."""
    if not any(_is_ca(cert) and is_self_signed(cert) for cert in certs):
        raise InputError(field, "at least one self-signed CA certificate (the root the EK certificates chain to; "
                         "intermediates alone are no trust anchor)",
                         ", ".join(cert.subject.rfc4514_string() for cert in certs) or "none")


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _check_validity(cert: "x509.Certificate", what: str) -> None:
    now = _now()
    if not x509compat.not_valid_before(cert) <= now <= x509compat.not_valid_after(cert):
        raise AttestationError("%s %s is outside its validity period" % (what, cert.subject.rfc4514_string()))


def _is_ca(cert: "x509.Certificate") -> bool:
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


def _untrusted_intermediates(chain: Sequence[bytes]) -> List["x509.Certificate"]:
    """CA certificates the node offers (from its TPM's NV, TCG's EK certificate chain): links only."""
    certs = []
    for der in list(chain)[:_MAX_NV_CHAIN_CERTS]:
        try:
            cert = x509.load_der_x509_certificate(bytes(der))
        except (ValueError, TypeError) as err:
            raise AttestationError("EK certificate chain (from the TPM's NV) cannot be parsed: %s" % err) from None
        if _is_ca(cert):
            certs.append(cert)
    return certs


def _extension(cert: "x509.Certificate", kind):
    try:
        return cert.extensions.get_extension_for_class(kind).value
    except x509.ExtensionNotFound:
        return None


def check_ek_profile(cert: "x509.Certificate", key) -> None:
    """The certificate is one fit for an EK (TCG EK Credential Profile): an end-entity certificate (basic
    constraints absent or cA false); its key usage, where present, allows keyEncipherment (RSA EK) or
    keyAgreement (ECC EK) and never keyCertSign; its extended key usage, where present, holds tcg-kp-EKCertificate
    (2.23.133.8.1), so a TLS server or client certificate is refused. A CA's own certificate, or a certificate
    for some other key that a bundled CA signed, would otherwise get the credential challenge encrypted to a key
    that is no TPM's. AttestationError naming the certificate and the rule broken."""

    def refuse(rule: str) -> None:
        raise AttestationError("EK certificate %s is not fit for an EK (TCG EK credential profile): %s"
                               % (cert.subject.rfc4514_string() or "(empty subject)", rule))

    constraints = _extension(cert, x509.BasicConstraints)
    if constraints is not None and constraints.ca:
        refuse("it is a CA certificate (basic constraints cA true); an EK certificate is an end-entity certificate")
    usage = _extension(cert, x509.KeyUsage)
    if usage is not None:
        if usage.key_cert_sign:
            refuse("its key usage allows keyCertSign")
        if isinstance(key, rsa.RSAPublicKey) and not usage.key_encipherment:
            refuse("its key usage does not allow keyEncipherment, which an RSA EK's certificate must")
        if isinstance(key, ec.EllipticCurvePublicKey) and not usage.key_agreement:
            refuse("its key usage does not allow keyAgreement, which an ECC EK's certificate must")
    purposes = _extension(cert, x509.ExtendedKeyUsage)
    if purposes is not None and TCG_KP_EK_CERTIFICATE not in list(purposes):
        refuse("its extended key usage (%s) does not hold tcg-kp-EKCertificate (%s)"
               % (", ".join(getattr(oid, "_name", None) or oid.dotted_string for oid in purposes) or "empty",
                  TCG_KP_EK_CERTIFICATE.dotted_string))


def verify_ek_cert(ek_cert_der: bytes, ca_certs: Sequence["x509.Certificate"],
                   chain: Sequence[bytes] = ()) -> "x509.Certificate":
    """The EK certificate (RSA-2048 or ECC P-256/P-384 key, fit for an EK: ``check_ek_profile``) must chain, link by link (issuer name +
    signature + validity), to a self-signed root among ``ca_certs``. Intermediates may be among
    ``ca_certs`` (given beside the roots) or in ``chain`` (DER, what the TPM's NV holds, untrusted);
    a CA certificate that is not self-signed is never a trust anchor, and nothing from ``chain`` is."""
    try:
        cert = x509.load_der_x509_certificate(ek_cert_der)
    except ValueError as err:
        raise AttestationError("EK certificate cannot be parsed: %s" % err)
    _check_validity(cert, "EK certificate")
    try:
        key = cert.public_key()
    except (ValueError, UnsupportedAlgorithm) as err:  # the client sends this certificate (IssueJoinTicket)
        raise AttestationError("EK certificate key cannot be decoded: %s" % err) from None
    if not (isinstance(key, rsa.RSAPublicKey) and key.key_size >= 2048
            or isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, (ec.SECP256R1, ec.SECP384R1))):
        raise AttestationError("EK certificate does not hold an RSA (2048 bits or more) or ECC P-256/P-384 key")
    check_ek_profile(cert, key)
    ca_certs = [x509compat.private_copy(ca) for ca in ca_certs]  # shared by threads: their extensions are read
    offered = _untrusted_intermediates(chain)
    current = cert
    for _attempt in range(_MAX_CHAIN):
        issuer = None
        for candidate in list(ca_certs) + offered:
            if candidate.subject != current.issuer or not _is_ca(candidate):
                continue
            try:
                x509compat.verify_directly_issued_by(current, candidate)
            except (ValueError, TypeError, Exception):  # InvalidSignature or unsupported algorithm
                continue
            issuer = candidate
            break
        if issuer is None:
            raise AttestationError("EK certificate does not chain to the trusted CAs: no trusted issuer %s "
                                   "for %s" % (current.issuer.rfc4514_string(), current.subject.rfc4514_string()))
        _check_validity(issuer, "CA certificate")
        if is_self_signed(issuer):  # only a root of the bundle is a trust anchor; other CAs are links
            if any(issuer == trusted for trusted in ca_certs):
                return cert
            raise AttestationError("EK certificate chains to the root %s, which is not among the trusted CAs"
                                   % issuer.subject.rfc4514_string())
        current = issuer
    raise AttestationError("EK certificate chain is longer than %d" % _MAX_CHAIN)


def _split_der(data: bytes) -> List[bytes]:
    """DER certificates stored back to back (an NV index may hold several; zero padding ends it)."""
    certs = []
    offset = 0
    while offset + 4 <= len(data) and data[offset] == 0x30:
        first = data[offset + 1]
        if first < 0x80:
            length, header = first, 2
        else:
            count = first & 0x7F
            if count == 0 or count > 3 or offset + 2 + count > len(data):
                break
            length, header = int.from_bytes(data[offset + 2:offset + 2 + count], "big"), 2 + count
        end = offset + header + length
        if end > len(data):
            break
        certs.append(bytes(data[offset:end]))
        offset = end
    return certs
