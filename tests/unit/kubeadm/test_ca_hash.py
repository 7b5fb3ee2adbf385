"""The discovery CA hash equals what openssl computes over the CA's SubjectPublicKeyInfo."""

from __future__ import annotations

import base64
import datetime
import hashlib
import subprocess

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from ansible_collections.constellation.cluster.plugins.filter.kubeadm import FilterModule
from ansible_collections.constellation.cluster.plugins.module_utils import kubeadm


def _ca_pem(key) -> bytes:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


def _openssl_hash(pem: bytes) -> str:
    """openssl x509 -pubkey | openssl pkey -pubin -outform der | sha256sum, run for real."""
    pub = subprocess.run(["openssl", "x509", "-noout", "-pubkey"], input=pem, capture_output=True, check=True).stdout
    der = subprocess.run(["openssl", "pkey", "-pubin", "-outform", "der"], input=pub, capture_output=True,
                         check=True).stdout
    digest = subprocess.run(["sha256sum"], input=der, capture_output=True, check=True).stdout.split()[0].decode()
    return "sha256:" + digest


@pytest.fixture(scope="module", params=["rsa", "ecdsa"])
def ca_pem(request):
    key = rsa.generate_private_key(65537, 2048) if request.param == "rsa" else ec.generate_private_key(ec.SECP256R1())
    return _ca_pem(key)


def test_hash_matches_openssl(ca_pem):
    assert kubeadm.ca_cert_hash(ca_pem) == _openssl_hash(ca_pem)


def test_hash_accepts_text_and_differs_per_key(ca_pem):
    other = _ca_pem(ec.generate_private_key(ec.SECP256R1()))
    assert kubeadm.ca_cert_hash(ca_pem.decode()) == kubeadm.ca_cert_hash(ca_pem)
    assert kubeadm.ca_cert_hash(other) != kubeadm.ca_cert_hash(ca_pem)


def test_hash_is_over_the_public_key_not_the_certificate():
    """Re-issuing a CA certificate for the same key keeps the pin (kubeadm's pubkeypin semantics)."""
    key = ec.generate_private_key(ec.SECP256R1())
    first, second = _ca_pem(key), _ca_pem(key)
    assert first != second
    assert kubeadm.ca_cert_hash(first) == kubeadm.ca_cert_hash(second)
    assert kubeadm.ca_cert_hash(first) != "sha256:" + hashlib.sha256(first).hexdigest()


def test_filter_returns_the_same_hash(ca_pem):
    ca_cert_hash = FilterModule().filters()["ca_cert_hash"]
    assert ca_cert_hash(ca_pem.decode()) == _openssl_hash(ca_pem)


@pytest.mark.parametrize("bad", ["not a certificate", b"", 42])
def test_bad_pem_is_an_input_error(bad):
    with pytest.raises(kubeadm.InputError) as err:
        kubeadm.ca_cert_hash(bad)
    assert err.value.field == "ca_pem"


def test_kubeconfig_ca_pems(ca_pem):
    kubeconfig = (
        "apiVersion: v1\nkind: Config\nclusters:\n- name: k\n  cluster:\n    server: https://10.118.0.1:6443\n"
        "    certificate-authority-data: %s\n" % base64.b64encode(ca_pem).decode())
    assert kubeadm.kubeconfig_ca_pems(kubeconfig) == [ca_pem]
