# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A TPM vendor's EK PKI for tests, made with ``cryptography``: a self-signed root, an intermediate that signs EK
certificates, and the PEM and DER forms of certificates."""

from __future__ import annotations

import datetime

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID


_NOW = datetime.datetime.now(datetime.timezone.utc)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_cert(subject: str, pub_key, issuer_name: str, issuer_key, ca: bool) -> x509.Certificate:
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer_name))
               .public_key(pub_key).serial_number(x509.random_serial_number())
               .not_valid_before(_NOW - datetime.timedelta(days=1)).not_valid_after(_NOW + datetime.timedelta(days=30))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    return builder.sign(issuer_key, hashes.SHA256())


class Vendor:
    """A TPM vendor's PKI: a self-signed root and an intermediate that signs EK certificates."""

    def __init__(self, name: str, ecc: bool = False):
        self.root_key = ec.generate_private_key(ec.SECP384R1()) if ecc else rsa.generate_private_key(65537, 2048)
        self.root = make_cert(name + " root", self.root_key.public_key(), name + " root", self.root_key, True)
        self.inter_key = ec.generate_private_key(ec.SECP256R1()) if ecc else rsa.generate_private_key(65537, 2048)
        self.inter = make_cert(name + " EK CA", self.inter_key.public_key(), name + " root", self.root_key, True)
        self.name = name

    def ek_cert(self, pub_key) -> x509.Certificate:
        return make_cert(self.name + " EK", pub_key, self.name + " EK CA", self.inter_key, False)


def pem(*certs) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


def der(cert) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)
