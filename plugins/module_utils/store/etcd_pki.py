# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""TLS for the Coordinators' etcd cluster, from keys derived in the chain of trust.

Every Coordinator receives the KMS URI only after it was attested, so every Coordinator derives the
same etcd CA: an Ed25519 key from ``HKDF(master key, master salt, info="constellation-etcd-ca")`` and
a self-signed certificate whose every field is fixed (Ed25519 signatures are deterministic), so the
CA certificate is byte for byte the same on each. The info has no ``key-`` prefix: ``GetDataKey``
derives only ``key-<id>``, so no Node can ask the Coordinator for it. Each member makes its own key
pair and signs its certificate (server and client use, SANs: its VPN IP and loopback) with the CA;
peers and clients must present one (``--client-cert-auth``, ``--peer-client-cert-auth``).
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
from typing import Iterable, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError:  # the agent checks its libraries at start
    pass

ETCD_CA_INFO = "constellation-etcd-ca"
_NOT_BEFORE = datetime.datetime(2024, 1, 1)
_NOT_AFTER = datetime.datetime(9999, 12, 31, 23, 59, 59)
_MEMBER_DAYS = 3650


def etcd_ca(kms) -> Tuple["Ed25519PrivateKey", bytes]:
    """The cluster's etcd CA (private key, certificate PEM) from the cluster KMS (``kms.get_dek``)."""
    key = Ed25519PrivateKey.from_private_bytes(kms.get_dek(ETCD_CA_INFO, 32))
    pub = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "constellation.cluster"),
                      x509.NameAttribute(NameOID.COMMON_NAME, "etcd CA " + hashlib.sha256(pub).hexdigest()[:16])])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(int.from_bytes(hashlib.sha256(pub).digest()[:16], "big") >> 1)
            .not_valid_before(_NOT_BEFORE).not_valid_after(_NOT_AFTER)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, None))
    return key, cert.public_bytes(serialization.Encoding.PEM)


def member_credentials(ca_key: "Ed25519PrivateKey", ca_cert_pem: bytes, name: str,
                       ips: Iterable[str]) -> Tuple[bytes, bytes]:
    """A new key pair and certificate (PEMs: cert, key) for the etcd member or client ``name``,
    valid for ``ips`` (its VPN IP; loopback is always added) as server and as client."""
    if not isinstance(name, str) or not name or len(name) > 64:
        raise InputError("name", "an etcd member name of 1 to 64 characters", name)
    addresses = {ipaddress.ip_address("127.0.0.1")}
    for ip in ips:
        try:
            addresses.add(ipaddress.ip_address(ip))
        except ValueError:
            raise InputError("ips", "IP addresses", ip) from None
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "constellation.cluster"),
                                     x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=_MEMBER_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(a) for a in sorted(addresses, key=str)]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, None))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))
