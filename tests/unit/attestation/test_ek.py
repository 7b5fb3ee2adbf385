# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Variant qemu-vtpm-ek: AK trust via EK certificate chain + credential activation, real swtpm."""

from __future__ import annotations

import base64

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.ek import (
    EK_CERT_NV_INDEX_RSA,
    CertifiedAK,
    QEMU_VTPM_EK,
    VTPMEKIssuer,
    VTPMEKValidator,
    begin_enrollment,
    enroll,
    finish_enrollment,
)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    Measurement,
    Measurements,
)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.tpm import TPM, read_pcrs
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import VTPMIssuer
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError

NONCE = b"n" * 32


@pytest.fixture(scope="module")
def ek_issuer(swtpm_ek):
    with VTPMEKIssuer(swtpm_ek.tcti, event_log_path=None) as iss:
        yield iss


@pytest.fixture(scope="module")
def record(ek_issuer, swtpm_ek):
    return enroll(ek_issuer, swtpm_ek.ca_cert_paths())


def _policy(tpm):
    pcrs = read_pcrs(tpm.tcti)
    return Measurements({i: Measurement(pcrs[i]) for i in (0, 4, 15)})


def test_variant_is_registered_in_the_qemu_branch_above_constellations_placeholder():
    assert choose.spec("qemu-vtpm-ek").variant == QEMU_VTPM_EK
    assert QEMU_VTPM_EK.oid == "1.3.9900.5.100"
    assert all(int(arc) < 2 ** 32 for arc in QEMU_VTPM_EK.oid.split("."))  # short arcs: every cryptography encodes it
    others = {oid for name in choose.names() if name != "qemu-vtpm-ek" for oid in choose.spec(name).variant.oids}
    assert not set(QEMU_VTPM_EK.oids) & others


def test_ek_cert_is_read_from_nv_and_chains(ek_issuer, swtpm_ek):
    der = ek_issuer.ek_cert()
    cert = x509.load_der_x509_certificate(der)
    issuer = x509.load_pem_x509_certificate(open(swtpm_ek.issuer_cert_path(), "rb").read())
    assert cert.issuer == issuer.subject
    assert cert.public_bytes(Encoding.DER) == der
    with TPM(swtpm_ek.tcti) as tpm:  # chunked reads assemble the same bytes
        assert tpm.nv_read(EK_CERT_NV_INDEX_RSA, chunk=100) == der


def test_enrolled_ak_round_trip(ek_issuer, record, swtpm_ek):
    assert record.ak_pub == ek_issuer.ak_pub
    stored = CertifiedAK.from_dict(record.to_dict())
    validator = VTPMEKValidator(_policy(swtpm_ek), swtpm_ek.ca_cert_paths(), [stored.to_dict()])
    result = validator.validate(ek_issuer.issue(b"spki", NONCE), NONCE)
    assert result.user_data == b"spki" and all(c.ok for c in result.checks)
    assert ek_issuer.oid == validator.oid == QEMU_VTPM_EK.oid


def test_ak_not_certified_is_refused(ek_issuer, record, swtpm_ek, swtpm):
    validator = VTPMEKValidator(Measurements(), swtpm_ek.ca_cert_paths(), [])
    with pytest.raises(AttestationError, match="AK is not certified"):
        validator.validate(ek_issuer.issue(b"u", NONCE), NONCE)
    # a software TPM with a perfectly valid qemu-vtpm document, but its AK was never enrolled
    validator = VTPMEKValidator(Measurements(), swtpm_ek.ca_cert_paths(), [record])
    with VTPMIssuer(swtpm.tcti, event_log_path=None) as rogue:
        with pytest.raises(AttestationError, match="AK is not certified"):
            validator.validate(rogue.issue(b"u", NONCE), NONCE)


def test_ek_cert_from_other_ca_is_refused(swtpm_ek, swtpm_other_ca):
    with VTPMEKIssuer(swtpm_other_ca.tcti, event_log_path=None) as other:
        with pytest.raises(AttestationError, match="does not chain to the trusted CAs"):
            begin_enrollment(other.enrollment_request(), swtpm_ek.ca_cert_paths())
        # enrolled by someone trusting the other CA; our validator (fleet CA) still refuses it
        foreign = enroll(other, swtpm_other_ca.ca_cert_paths())
        validator = VTPMEKValidator(Measurements(), swtpm_ek.ca_cert_paths(), [foreign])
        with pytest.raises(AttestationError, match="AK is not trusted: .*does not chain"):
            validator.validate(other.issue(b"u", NONCE), NONCE)


def test_genuine_ek_cert_with_foreign_ak_fails_activation(ek_issuer, swtpm_ek, fresh_swtpm):
    """The attacker presents the genuine TPM's EK certificate with the AK of their own TPM;
    only the genuine TPM can decrypt the credential, so activation on theirs must fail."""
    with VTPMEKIssuer(fresh_swtpm.tcti, event_log_path=None) as attacker:
        request = {"ek_cert": ek_issuer.enrollment_request()["ek_cert"], "ak_pub": base64.b64encode(
            attacker.ak_pub).decode()}
        challenge, pending = begin_enrollment(request, swtpm_ek.ca_cert_paths())
        with pytest.raises(AttestationError, match="ActivateCredential refused|credential activation failed"):
            finish_enrollment(pending, attacker.activate_credential(challenge))
    # and the genuine TPM cannot answer it either: the AK name does not match its AK
    with pytest.raises(AttestationError, match="ActivateCredential refused|credential activation failed"):
        finish_enrollment(pending, ek_issuer.activate_credential(challenge))
    assert ek_issuer.issue(b"still works", NONCE)


def test_wrong_secret_is_refused(ek_issuer, swtpm_ek):
    _challenge, pending = begin_enrollment(ek_issuer.enrollment_request(), swtpm_ek.ca_cert_paths())
    with pytest.raises(AttestationError, match="credential activation failed"):
        finish_enrollment(pending, b"\x00" * 32)


def test_tampered_ek_cert_is_refused(ek_issuer, swtpm_ek):
    request = ek_issuer.enrollment_request()
    der = bytearray(base64.b64decode(request["ek_cert"]))
    der[-5] ^= 0xFF  # inside the signature
    request["ek_cert"] = base64.b64encode(bytes(der)).decode()
    with pytest.raises(AttestationError, match="does not chain"):
        begin_enrollment(request, swtpm_ek.ca_cert_paths())


def test_root_alone_does_not_vouch_for_unknown_intermediate(ek_issuer, swtpm_ek):
    with pytest.raises(AttestationError, match="does not chain"):
        begin_enrollment(ek_issuer.enrollment_request(), [swtpm_ek.ca_cert_path()])


SYSTEM_PYTHON = "/usr/bin/python3"
# Issuer and verifier of qemu-vtpm-ek in one process of Debian 12's Python and packages (python3-tpm2-pytss 1.2,
# python3-cryptography 38): enrollment (MakeCredential, ActivateCredential), a quote, and an aTLS certificate
# with the variant's OID, verified.
_DEBIAN_PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import cryptography, tpm2_pytss
from ansible_collections.constellation.cluster.plugins.module_utils import atls
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose, ek
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    Measurement, Measurements)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.tpm import read_pcrs
tcti, ca_paths = sys.argv[2], sys.argv[3:]
pcrs = read_pcrs(tcti)
policy = Measurements({i: Measurement(pcrs[i]) for i in (0, 4, 15)})
with choose.issuer("qemu-vtpm-ek", tcti, event_log_path=None) as issuer:
    record = ek.enroll(issuer, ek.load_ca_certs(ca_paths))
    trust = choose.load_trust("qemu-vtpm-ek", ca_paths)
    trust.certified_aks.add(record)
    validator = choose.validator("qemu-vtpm-ek", policy, trust)
    server = atls.AttestedServerContext(issuer)
    try:
        _key, cert = server.certificate_for(b"n" * 32)
    finally:
        server.close()
    der = cert.public_bytes(atls.serialization.Encoding.DER)
    validation, oid = atls.verify_peer_certificate(der, [validator], b"n" * 32)
print(json.dumps({"oid": oid, "ek": validation.ek_pub_sha256, "checks": all(c.ok for c in validation.checks),
                  "files": [cryptography.__file__, tpm2_pytss.__file__]}))
"""


def test_the_ek_variant_enrolls_and_attests_on_debians_packages(tmp_path):
    """What a stock Debian 12 node runs, both sides: the issuer (a node) and the validator (its Coordinator)."""
    import json
    import os
    import subprocess
    from pathlib import Path

    from ansible_collections.constellation.cluster.tests.unit.attestation.conftest import _start

    if not os.path.exists(SYSTEM_PYTHON):
        pytest.skip("no %s (make setup installs Debian's packages)" % SYSTEM_PYTHON)
    (tmp_path / "ca").mkdir()
    tpm = _start(tmp_path / "tpm", ek_cert=True, ca_dir=str(tmp_path / "ca"))
    try:
        collections = str(Path(__file__).resolve().parents[3] / "collections")
        proc = subprocess.run([SYSTEM_PYTHON, "-I", "-c", _DEBIAN_PROBE, collections, tpm.tcti] + tpm.ca_cert_paths(),
                              capture_output=True, text=True, timeout=120, check=False,
                              env={"PATH": os.environ.get("PATH", ""), "TSS2_LOG": "all+none"})
    finally:
        tpm.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["oid"] == "1.3.9900.5.100" and result["ek"] and result["checks"]
    assert all(path.startswith("/usr/lib/python3/dist-packages/") for path in result["files"]), result["files"]
