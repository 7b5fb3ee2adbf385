# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""X.509 calls that ``cryptography`` added after the version Debian 12 ships (38.0): the node agent
runs on a Debian node's system Python (python3-cryptography). Each function uses the library's own
call where it exists, and otherwise the library's primitives (never our own crypto):

- ``not_valid_before`` / ``not_valid_after``: ``Certificate.not_valid_*_utc`` (cryptography 42).
- ``load_pem_certificates``: ``x509.load_pem_x509_certificates`` (39).
- ``verify_directly_issued_by``: ``Certificate.verify_directly_issued_by`` (40).
- ``private_copy``: a thread's own copy of a certificate that threads share, to read its extensions.
"""

from __future__ import annotations

import datetime
import re
from typing import List

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, padding, rsa
except ImportError:  # pragma: no cover - reported by the callers' require_cryptography()
    x509 = None

_PEM_CERTIFICATE = re.compile(rb"-----BEGIN CERTIFICATE-----\r?\n.+?\r?\n-----END CERTIFICATE-----", re.S)


def private_copy(cert):
    """A copy of ``cert`` for the calling thread alone. cryptography 38 (Debian 12's) reads a certificate's
    extensions under an exclusive borrow of the certificate object, so a thread that reads them while another
    thread uses the same object gets RuntimeError("Already borrowed"). Where threads share certificates (the
    trust anchors every activation worker checks EK certificates against), extensions are read from copies."""
    return x509.load_der_x509_certificate(cert.public_bytes(serialization.Encoding.DER))


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
