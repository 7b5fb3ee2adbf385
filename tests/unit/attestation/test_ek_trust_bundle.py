# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The EK trust anchor of qemu-vtpm-ek as real hosts need it: a bundle of several
vendors' CAs in one PEM file or a folder of PEM files, RSA and ECC EK certificates, intermediates
given beside the roots or stored in the TPM's NV (TCG EK Credential Profile 2.5). Only a self-signed
CA of the bundle is a trust anchor; an intermediate is a link, never an anchor. Certificates are made
with ``cryptography``; the end-to-end case manufactures an ECC EK certificate and its intermediate
into a real swtpm's NV."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from tpm2_pytss import ESAPI, ESYS_TR, TPM2_ALG, TPM2B_NV_PUBLIC, TPMA_NV, TPMS_NV_PUBLIC
from tpm2_pytss.internal.templates import ek_template

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.ek_certs import check_trust_anchors
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.ek import (
    EK_CERT_NV_INDEX_ECC,
    EK_CHAIN_NV_FIRST,
    CertifiedAK,
    VTPMEKIssuer,
    VTPMEKValidator,
    ek_public_from_cert,
    enroll,
    load_ca_certs,
    verify_ek_cert,
)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    Measurement,
    Measurements,
)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.tpm import read_pcrs
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError, InputError
from ansible_collections.constellation.cluster.tests.support.ek_vendor import Vendor, der, pem

NONCE = b"b" * 32


@pytest.fixture(scope="module")
def vendors():
    return Vendor("Vendor A"), Vendor("Vendor B", ecc=True)


def test_a_bundle_of_several_vendors_trusts_rsa_and_ecc_ek_certificates(vendors, tmp_path):
    a, b = vendors
    bundle = tmp_path / "ek-roots.pem"
    bundle.write_bytes(pem(a.root, a.inter, b.root, b.inter))
    certs = load_ca_certs([str(bundle)], "ek_ca")
    check_trust_anchors(certs)
    rsa_ek = a.ek_cert(rsa.generate_private_key(65537, 2048).public_key())
    ecc_ek = b.ek_cert(ec.generate_private_key(ec.SECP256R1()).public_key())
    assert verify_ek_cert(der(rsa_ek), certs) == rsa_ek
    assert verify_ek_cert(der(ecc_ek), certs) == ecc_ek
    public = ek_public_from_cert(ecc_ek)  # what MakeCredential encrypts to: the TCG EK-ECC256 template
    assert int(public.type) == TPM2_ALG.ECC and bytes(public.unique.ecc.x) == ecc_ek.public_key().public_numbers(
    ).x.to_bytes(32, "big")


def test_a_folder_of_pem_files_is_a_bundle(vendors, tmp_path):
    a, b = vendors
    folder = tmp_path / "ek-cas"
    folder.mkdir()
    for i, cert in enumerate((a.root, a.inter, b.root, b.inter)):
        (folder / ("%d.pem" % i)).write_bytes(pem(cert))
    (folder / "README.txt").write_text("not a certificate")  # other files are ignored
    trust = choose.load_trust("qemu-vtpm-ek", str(folder))
    assert len(trust.ek_ca_certs) == 4
    ek = b.ek_cert(ec.generate_private_key(ec.SECP256R1()).public_key())
    assert verify_ek_cert(der(ek), trust.ek_ca_certs) == ek
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="^ek_ca_path: expected a folder holding CA certificates"):
        choose.load_trust("qemu-vtpm-ek", str(empty))


def test_an_intermediate_is_never_a_trust_anchor(vendors, tmp_path):
    """Only the intermediate pinned: refused at load (no root), and an EK chaining to it alone is not
    trusted; its chain must end at a self-signed root of the bundle."""
    a, _b = vendors
    only_inter = tmp_path / "inter.pem"
    only_inter.write_bytes(pem(a.inter))
    with pytest.raises(InputError, match="^ek_ca_path: expected at least one self-signed CA"):
        choose.load_trust("qemu-vtpm-ek", str(only_inter))
    ek = a.ek_cert(rsa.generate_private_key(65537, 2048).public_key())
    with pytest.raises(AttestationError, match="does not chain to the trusted CAs"):
        verify_ek_cert(der(ek), [a.inter])


def test_intermediates_from_the_tpm_nv_are_links_only(vendors):
    a, b = vendors
    ek = a.ek_cert(rsa.generate_private_key(65537, 2048).public_key())
    # The root pinned, the intermediate offered by the TPM (NV): trusted.
    assert verify_ek_cert(der(ek), [a.root], [der(a.inter)]) == ek
    # An attacker's own PKI offered whole (its root in the "NV chain"): refused, whatever it offers.
    mallory = Vendor("Vendor A")  # same names, other keys
    forged = mallory.ek_cert(rsa.generate_private_key(65537, 2048).public_key())
    with pytest.raises(AttestationError, match="not among the trusted CAs|does not chain"):
        verify_ek_cert(der(forged), [a.root, b.root], [der(mallory.inter), der(mallory.root)])
    # A record keeps the offered chain, so that the trust check at every attestation can walk it again.
    record = CertifiedAK(b"ak", der(ek), (der(a.inter),))
    assert CertifiedAK.from_dict(record.to_dict()) == record


# ------------------------------------------------------------------ a real TPM with an ECC EK and its chain in NV


def _nv_write(esapi: ESAPI, index: int, data: bytes) -> None:
    public = TPM2B_NV_PUBLIC(nvPublic=TPMS_NV_PUBLIC(
        nvIndex=index, nameAlg=TPM2_ALG.SHA256, dataSize=len(data),
        attributes=TPMA_NV.OWNERWRITE | TPMA_NV.OWNERREAD | TPMA_NV.AUTHREAD | TPMA_NV.AUTHWRITE | TPMA_NV.NO_DA))
    handle = esapi.nv_define_space(b"", public, ESYS_TR.OWNER)
    for offset in range(0, len(data), 512):
        esapi.nv_write(handle, data[offset:offset + 512], offset)


def test_a_tpm_with_an_ecc_ek_and_its_intermediate_in_nv_enrolls_and_attests(vendors, fresh_swtpm):
    """Manufactured like a vendor's TPM: the EK-ECC256 key's certificate at 0x01c0000a, the vendor's
    intermediate at 0x01c00100; the verifier pins the vendor's root only."""
    _a, b = vendors
    with ESAPI(fresh_swtpm.tcti) as esapi:
        template = ek_template.lookup("EK-ECC256").template  # the TCG default, as the issuer recreates it
        ek, public, _cd, _ch, _ct = esapi.create_primary(None, template, ESYS_TR.ENDORSEMENT)
        esapi.flush_context(ek)
        point = public.publicArea.unique.ecc
        ek_pub = ec.EllipticCurvePublicNumbers(int.from_bytes(bytes(point.x), "big"),
                                               int.from_bytes(bytes(point.y), "big"), ec.SECP256R1()).public_key()
        _nv_write(esapi, EK_CERT_NV_INDEX_ECC, der(b.ek_cert(ek_pub)))
        _nv_write(esapi, EK_CHAIN_NV_FIRST, der(b.inter))
    with VTPMEKIssuer(fresh_swtpm.tcti, event_log_path=None) as issuer:
        request = issuer.enrollment_request()
        assert len(request["ek_chain"]) == 1
        record = enroll(issuer, [b.root])  # credential activation with the ECC EK
        assert record.ek_chain == (der(b.inter),)
        pcrs = read_pcrs(fresh_swtpm.tcti)
        validator = VTPMEKValidator(Measurements({i: Measurement(pcrs[i]) for i in (0, 4)}), [b.root], [record])
        assert validator.validate(issuer.issue(b"u", NONCE), NONCE).user_data == b"u"
        # Without the enrollment the same TPM is not trusted; with another vendor's root pinned it never enrolls.
        with pytest.raises(AttestationError, match="AK is not certified"):
            validator = VTPMEKValidator(Measurements({0: Measurement(pcrs[0])}), [b.root])
            validator.validate(issuer.issue(b"u", NONCE), NONCE)
        with pytest.raises(AttestationError, match="does not chain|not among the trusted CAs"):
            enroll(issuer, [vendors[0].root])


def test_the_lab_bundle_of_swtpm_root_and_intermediate_still_works(swtpm_ek, tmp_path):
    path = tmp_path / "ek_ca.pem"
    path.write_bytes(b"".join(Path(p).read_bytes() for p in swtpm_ek.ca_cert_paths()))
    trust = choose.load_trust(choose.DEFAULT_VARIANT, str(path))
    with VTPMEKIssuer(swtpm_ek.tcti, event_log_path=None) as issuer:
        trust.certified_aks.add(enroll(issuer, [str(path)]))
        assert len(trust.certified_aks) == 1


SYSTEM_PYTHON = "/usr/bin/python3"
_THREADS_PROBE = """
import sys, threading
sys.path.insert(0, sys.argv[1])
sys.setswitchinterval(1e-6)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.ek_certs import (
    load_ca_certs, verify_ek_cert)
certs = load_ca_certs([sys.argv[2]])
eks = [open(path, "rb").read() for path in sys.argv[3:]]
errors = []
def check(index):
    for _round in range(60):
        try:
            verify_ek_cert(eks[index % len(eks)], certs)
        except Exception as err:
            errors.append(repr(err))
threads = [threading.Thread(target=check, args=(i,)) for i in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
print(len(errors), errors[:1])
"""


def test_threads_share_the_trust_anchors_on_debians_cryptography(vendors, tmp_path):
    """A Coordinator's activation workers check EK certificates against the same trust anchor objects at
    once. cryptography 38 (Debian 12's) refuses a thread that reads a certificate's extensions while another
    thread uses that object (RuntimeError "Already borrowed", which failed activations there): every check
    passes on /usr/bin/python3 with Debian's packages."""
    import os
    import subprocess

    if not os.path.exists(SYSTEM_PYTHON):
        pytest.skip("no %s (make setup installs Debian's packages)" % SYSTEM_PYTHON)
    a, b = vendors
    (tmp_path / "bundle.pem").write_bytes(pem(a.root, a.inter, b.root, b.inter))
    paths = []
    for index, (vendor, key) in enumerate([(a, rsa.generate_private_key(65537, 2048)),
                                           (b, ec.generate_private_key(ec.SECP256R1()))]):
        paths.append(str(tmp_path / ("ek%d.der" % index)))
        Path(paths[-1]).write_bytes(der(vendor.ek_cert(key.public_key())))
    collections = str(Path(__file__).resolve().parents[3] / "collections")
    proc = subprocess.run([SYSTEM_PYTHON, "-I", "-c", _THREADS_PROBE, collections, str(tmp_path / "bundle.pem")] + paths,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "0 []"
