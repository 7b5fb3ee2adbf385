# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""X.509 calls that ``cryptography`` added after the version Debian 12 ships (38.0): the node agent
runs on a Debian node's system Python (python3-cryptography). Each function uses the library's own
call where it exists, and otherwise the library's primitives (never our own crypto):

- ``not_valid_before`` / ``not_valid_after``: ``Certificate.not_valid_*_utc`` (cryptography 42).
- ``load_pem_certificates``: ``x509.load_pem_x509_certificates`` (39).
- ``verify_directly_issued_by``: ``Certificate.verify_directly_issued_by`` (40).
- ``extensions``: ``Certificate.extensions``, one thread at a time (38 refuses a concurrent first access).
"""

from __future__ import annotations

import datetime
import re
import threading
from typing import List

try:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, padding, rsa
except ImportError:  # pragma: no cover - reported by the callers' require_cryptography()
    x509 = None

_EXTENSIONS_LOCK = threading.Lock()
_PEM_CERTIFICATE = re.compile(rb"-----BEGIN CERTIFICATE-----\r?\n.+?\r?\n-----END CERTIFICATE-----", re.S)


def extensions(cert) -> "x509.Extensions":
    """``cert.extensions`` of a certificate object that several threads share (trust anchors, enrolled EK
    certificates). cryptography 38 parses them into a cache under an exclusive borrow of the certificate, and a
    second thread that reads them meanwhile gets RuntimeError("Already borrowed"): one reader at a time."""
    with _EXTENSIONS_LOCK:
        return cert.extensions


def not_valid_before(cert) -> datetime.datetime:
    if hasattr(cert, "not_valid_before_utc"):
        return cert.not_valid_before_utc
    return cert.not_valid_before.replace(tzinfo=datetime.timezone.utc)


def not_valid_after(cert) -> datetime.datetime:
    if hasattr(cert, "not_valid_after_utc"):
        return cert.not_valid_after_utc
    return cert.not_valid_after.replace(tzinfo=datetime.timezone.utc)


def load_pem_certificates(data: bytes) -> List["x509.Certificate"]:
    """Every certificate of a PEM bundle; ValueError when there is none or one does not parse."""
    if hasattr(x509, "load_pem_x509_certificates"):
        return x509.load_pem_x509_certificates(bytes(data))
    return load_pem_certificates_each(bytes(data))


def load_pem_certificates_each(data: bytes) -> List["x509.Certificate"]:
    """The fallback: each PEM block with x509.load_pem_x509_certificate."""
    blocks = _PEM_CERTIFICATE.findall(data)
    if not blocks:
        raise ValueError("no PEM certificate found")
    return [x509.load_pem_x509_certificate(block) for block in blocks]


def verify_directly_issued_by(cert, issuer) -> None:
    """Raises ValueError (issuer name), TypeError (key type) or InvalidSignature unless ``issuer``
    signed ``cert``."""
    if hasattr(cert, "verify_directly_issued_by"):
        cert.verify_directly_issued_by(issuer)
        return
    verify_signature_of(cert, issuer)


def verify_signature_of(cert, issuer) -> None:
    """The fallback: issuer name, then the signature over the TBS bytes with the issuer's key.
    RSA signatures are taken as PKCS#1 v1.5 (a PSS signature is refused, never accepted)."""
    if cert.issuer != issuer.subject:
        raise ValueError("the certificate's issuer name is not the issuer's subject")
    key = issuer.public_key()
    algorithm = cert.signature_hash_algorithm
    if isinstance(key, rsa.RSAPublicKey):
        key.verify(cert.signature, cert.tbs_certificate_bytes, padding.PKCS1v15(), algorithm)
    elif isinstance(key, ec.EllipticCurvePublicKey):
        key.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(algorithm))
    elif isinstance(key, (ed25519.Ed25519PublicKey, ed448.Ed448PublicKey)):
        key.verify(cert.signature, cert.tbs_certificate_bytes)
    else:
        raise TypeError("unsupported issuer key type %s" % type(key).__name__)
