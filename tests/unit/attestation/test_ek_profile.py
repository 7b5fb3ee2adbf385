# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Only a certificate fit for an EK counts as an EK certificate (attestation/ek_certs.py ``check_ek_profile``,
the TCG EK credential profile). The bundle is the lab's real swtpm-localca PKI (root and intermediate), the
AK a real swtpm's. The attacker submits to the enrollment (attestation/ek.py ``begin_enrollment``, the
credential challenge) a certificate that chains to the bundle but is no EK's: the intermediate CA's own
certificate, and a TLS server certificate for a software key that the bundle's intermediate signed. Had the
challenge been made, it would be encrypted to a key that no TPM holds; both are refused before any challenge,
naming the certificate and the rule. A real swtpm EK certificate still enrolls."""

from __future__ import annotations

import base64
import datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.ek import (
    VTPMEKIssuer,
    begin_enrollment,
    enroll,
)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError

_NOW = datetime.datetime.now(datetime.timezone.utc)
TCG_KP_EK_CERTIFICATE = x509.ObjectIdentifier("2.23.133.8.1")  # tcg-kp-EKCertificate


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _der(cert) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


@pytest.fixture(scope="module")
def lab_ca(swtpm_ek):
    """The swtpm-localca intermediate (certificate and signing key) that signed the real swtpm's EK
    certificate, as the bundle's paths."""
    ca_dir = Path(swtpm_ek.issuer_cert_path()).parent
    text = (ca_dir / "signkey.pem").read_bytes()
    key = serialization.load_pem_private_key(text[text.index(b"-----BEGIN"):], password=None)
    issuer = x509.load_pem_x509_certificate(Path(swtpm_ek.issuer_cert_path()).read_bytes())
    return issuer, key, swtpm_ek.ca_cert_paths()


@pytest.fixture(scope="module")
def ak_pub(swtpm_ek):
    with VTPMEKIssuer(swtpm_ek.tcti, event_log_path=None) as issuer:
        return issuer.ak_pub


def leaf(issuer, issuer_key, pub_key, cn: str, usage=None, purposes=None) -> x509.Certificate:
    builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
               .issuer_name(issuer.subject).public_key(pub_key).serial_number(x509.random_serial_number())
               .not_valid_before(_NOW - datetime.timedelta(days=1)).not_valid_after(_NOW + datetime.timedelta(days=30))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True))
    if usage is not None:
        flags = dict.fromkeys(("digital_signature", "content_commitment", "key_encipherment", "data_encipherment",
                               "key_agreement", "key_cert_sign", "crl_sign", "encipher_only", "decipher_only"), False)
        flags.update(usage)
        builder = builder.add_extension(x509.KeyUsage(**flags), critical=True)
    if purposes is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage(purposes), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def attempt(cert_der: bytes, ak_pub: bytes, bundle):
    return begin_enrollment({"ek_cert": _b64(cert_der), "ak_pub": _b64(ak_pub)}, bundle)


def ca_cert(cn: str, pub_key, issuer_name: x509.Name, issuer_key) -> x509.Certificate:
    return (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(issuer_name).public_key(pub_key).serial_number(x509.random_serial_number())
            .not_valid_before(_NOW - datetime.timedelta(days=1)).not_valid_after(_NOW + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(issuer_key, hashes.SHA256()))


def test_the_intermediate_cas_own_certificate_is_no_ek_certificate(lab_ca, ak_pub, tmp_path):
    # A vendor's bundle whose intermediate has an RSA-2048 key, the size of an EK's.
    root_key, inter_key = rsa.generate_private_key(65537, 2048), rsa.generate_private_key(65537, 2048)
    root_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Vendor root")])
    root = ca_cert("Vendor root", root_key.public_key(), root_name, root_key)
    inter = ca_cert("Vendor EK CA", inter_key.public_key(), root_name, root_key)
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(b"".join(c.public_bytes(serialization.Encoding.PEM) for c in (root, inter)))
    with pytest.raises(AttestationError) as refused:
        attempt(_der(inter), ak_pub, [str(bundle)])  # it chains to the bundle's root
    message = str(refused.value)
    assert "EK certificate CN=Vendor EK CA is not fit for an EK (TCG EK credential profile)" in message
    assert "CA certificate (basic constraints cA true)" in message
    # The lab's own intermediate (swtpm-localca) is refused alike.
    issuer, _key, lab_bundle = lab_ca
    with pytest.raises(AttestationError, match="EK certificate CN=swtpm-localca is not fit for an EK"):
        attempt(_der(issuer), ak_pub, lab_bundle)


def test_a_tls_server_certificate_for_a_software_key_is_no_ek_certificate(lab_ca, ak_pub):
    issuer, key, bundle = lab_ca
    software_key = rsa.generate_private_key(65537, 2048)  # the attacker holds it: no TPM
    tls = leaf(issuer, key, software_key.public_key(), "attacker.example",
               usage={"digital_signature": True, "key_encipherment": True}, purposes=[ExtendedKeyUsageOID.SERVER_AUTH])
    with pytest.raises(AttestationError) as refused:
        attempt(_der(tls), ak_pub, bundle)
    message = str(refused.value)
    assert "EK certificate CN=attacker.example is not fit for an EK" in message
    assert "does not hold tcg-kp-EKCertificate (2.23.133.8.1)" in message and "serverAuth" in message
    # Without an extended key usage, a key usage that signs certificates or lacks keyEncipherment is refused too.
    for usage, rule in (({"key_encipherment": True, "key_cert_sign": True}, "allows keyCertSign"),
                        ({"digital_signature": True}, "does not allow keyEncipherment")):
        cert = leaf(issuer, key, software_key.public_key(), "attacker.example", usage=usage)
        with pytest.raises(AttestationError, match=rule):
            attempt(_der(cert), ak_pub, bundle)
    ecc = leaf(issuer, key, ec.generate_private_key(ec.SECP256R1()).public_key(), "attacker.example",
               usage={"digital_signature": True})
    with pytest.raises(AttestationError, match="does not allow keyAgreement, which an ECC EK's certificate must"):
        attempt(_der(ecc), ak_pub, bundle)


def test_a_real_swtpm_ek_certificate_and_one_following_the_profile_still_pass(lab_ca, ak_pub, swtpm_ek):
    issuer, key, bundle = lab_ca
    with VTPMEKIssuer(swtpm_ek.tcti, event_log_path=None) as tpm:
        ek_cert = x509.load_der_x509_certificate(tpm.ek_cert())
        # What swtpm writes: end entity, key usage keyEncipherment, extended key usage tcg-kp-EKCertificate.
        assert list(ek_cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [TCG_KP_EK_CERTIFICATE]
        record = enroll(tpm, bundle)  # the real credential challenge, activated by the TPM
        assert record.ek_cert == tpm.ek_cert()
    # A certificate following the profile for an ECC EK (keyAgreement) passes the profile and gets a challenge.
    ecc = leaf(issuer, key, ec.generate_private_key(ec.SECP256R1()).public_key(), "ecc ek",
               usage={"key_agreement": True}, purposes=[TCG_KP_EK_CERTIFICATE])
    challenge, _pending = attempt(_der(ecc), ak_pub, bundle)
    assert challenge["credential_blob"] and challenge["secret"]


def test_a_wrong_credential_challenge_leaves_the_tpm_quoting(swtpm_ek, swtpm_other_ca):
    """docs/attestation.md: a challenge for another TPM's EK, or a damaged one, is refused by swtpm (libtpms 0.9
    answers TPM_RC_FAILURE for the first), but the TPM does not stay in failure mode: it quotes and activates a
    genuine challenge afterwards."""
    with VTPMEKIssuer(swtpm_other_ca.tcti, event_log_path=None) as other:
        foreign, _pending = begin_enrollment(other.enrollment_request(), swtpm_other_ca.ca_cert_paths())
    with VTPMEKIssuer(swtpm_ek.tcti, event_log_path=None) as tpm:
        genuine, pending = begin_enrollment(tpm.enrollment_request(), swtpm_ek.ca_cert_paths())
        blob = bytearray(base64.b64decode(genuine["credential_blob"]))
        blob[10] ^= 0xFF
        damaged = dict(genuine, credential_blob=_b64(bytes(blob)))
        for challenge in (foreign, damaged, foreign):
            with pytest.raises(AttestationError, match="TPM2_ActivateCredential refused the challenge"):
                tpm.activate_credential(challenge)
            assert tpm.issue(b"still quoting", b"n" * 32)
        assert tpm.activate_credential(genuine) == pending.secret
