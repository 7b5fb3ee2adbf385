# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ECC P-256 AK option (``ak_alg: ecc``) against a real swtpm: issued, validated, refused when
tampered, in Constellation's document format, and kept apart from the RSA AK."""

from __future__ import annotations

import base64
import json

import pytest
from tpm2_pytss import ESAPI, TPM2_ALG, TPM2_ECC, TPMA_OBJECT, TPMT_PUBLIC, TPMT_SIGNATURE

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    Measurement,
    Measurements,
)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.tpm import read_pcrs
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import (
    AK_ECC_PERSISTENT_HANDLE,
    AK_PERSISTENT_HANDLE,
    VTPMIssuer,
    VTPMValidator,
    ak_template,
    make_extra_data,
    make_tpm_nonce,
    parse_ak,
)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError, InputError

NONCE = bytes(range(32, 64))


@pytest.fixture(scope="module")
def ecc_issuer(swtpm):
    with VTPMIssuer(swtpm.tcti, event_log_path=None, ak_alg="ecc") as iss:
        yield iss


@pytest.fixture(scope="module")
def validator(swtpm):
    pcrs = read_pcrs(swtpm.tcti)
    return VTPMValidator(Measurements({i: Measurement(pcrs[i]) for i in (0, 4, 9, 11, 15)}))


def test_ecc_ak_is_a_restricted_p256_ecdsa_key_at_its_own_handle(swtpm, ecc_issuer):
    public, _size = TPMT_PUBLIC.unmarshal(ecc_issuer.ak_pub)
    assert int(public.type) == TPM2_ALG.ECC
    assert int(public.parameters.eccDetail.curveID) == TPM2_ECC.NIST_P256
    assert int(public.parameters.eccDetail.scheme.scheme) == TPM2_ALG.ECDSA
    assert int(public.parameters.eccDetail.scheme.details.anySig.hashAlg) == TPM2_ALG.SHA256
    attrs = int(public.objectAttributes)
    for flag in (TPMA_OBJECT.RESTRICTED, TPMA_OBJECT.SIGN_ENCRYPT, TPMA_OBJECT.FIXEDTPM, TPMA_OBJECT.FIXEDPARENT):
        assert attrs & int(flag)
    with VTPMIssuer(swtpm.tcti, event_log_path=None) as rsa:
        assert rsa.ak_alg == "rsa" and rsa.ak_pub != ecc_issuer.ak_pub
    with ESAPI(swtpm.tcti) as esapi:  # both persisted, side by side (go-tpm-tools' default handles)
        for handle, alg in ((AK_PERSISTENT_HANDLE, TPM2_ALG.RSA), (AK_ECC_PERSISTENT_HANDLE, TPM2_ALG.ECC)):
            found, _name, _qname = esapi.read_public(esapi.tr_from_tpmpublic(handle))
            assert int(found.publicArea.type) == alg
    with VTPMIssuer(swtpm.tcti, event_log_path=None, ak_alg="ecc") as again:
        assert again.ak_pub == ecc_issuer.ak_pub  # reused, not recreated


def test_ecc_document_validates_in_constellation_format(ecc_issuer, validator, swtpm):
    document = ecc_issuer.issue(b"spki-hash", NONCE)
    doc = json.loads(document)
    assert list(doc) == ["Attestation", "InstanceInfo", "UserData"]
    att = doc["Attestation"]
    assert list(att) == ["ak_pub", "quotes", "TeeAttestation"]
    assert base64.b64decode(att["ak_pub"]) == ecc_issuer.ak_pub
    for quote in att["quotes"]:
        assert list(quote) == ["quote", "raw_sig", "pcrs"]
        signature, _size = TPMT_SIGNATURE.unmarshal(base64.b64decode(quote["raw_sig"]))
        assert int(signature.sigAlg) == TPM2_ALG.ECDSA
    result = validator.validate(document, NONCE)
    assert result.user_data == b"spki-hash" and result.pcrs == read_pcrs(swtpm.tcti)
    assert make_tpm_nonce(None, make_extra_data(b"spki-hash", NONCE))  # the same binding as RSA


def test_ecc_document_with_a_flipped_signature_bit_is_refused(ecc_issuer, validator):
    doc = json.loads(ecc_issuer.issue(b"u", NONCE))
    for quote in doc["Attestation"]["quotes"]:
        raw = bytearray(base64.b64decode(quote["raw_sig"]))
        raw[-1] ^= 1  # the last byte of S
        quote["raw_sig"] = base64.b64encode(bytes(raw)).decode()
    with pytest.raises(AttestationError, match="signature does not verify"):
        validator.validate(json.dumps(doc).encode(), NONCE)


def test_ecc_document_with_an_altered_pcr_or_nonce_is_refused(ecc_issuer, validator):
    document = ecc_issuer.issue(b"u", NONCE)
    with pytest.raises(AttestationError):
        validator.validate(document, bytes(32))  # another nonce: a replay
    doc = json.loads(document)
    sha256 = [q for q in doc["Attestation"]["quotes"] if q["pcrs"]["hash"] == 11][0]
    sha256["pcrs"]["pcrs"]["9"] = base64.b64encode(b"\x99" * 32).decode()
    with pytest.raises(AttestationError, match="do not match the quoted PCR digest"):
        validator.validate(json.dumps(doc).encode(), NONCE)


def test_ecc_ak_swapped_for_another_key_is_refused(swtpm, ecc_issuer, validator):
    """A document whose ak_pub is replaced by another (RSA) AK of the same TPM: signatures do not verify."""
    with VTPMIssuer(swtpm.tcti, event_log_path=None) as rsa:
        doc = json.loads(ecc_issuer.issue(b"u", NONCE))
        doc["Attestation"]["ak_pub"] = base64.b64encode(rsa.ak_pub).decode()
    with pytest.raises(AttestationError, match="ECDSA but the AK is not an ECC key"):
        validator.validate(json.dumps(doc).encode(), NONCE)


def test_weak_curve_and_unknown_alg_are_refused():
    template = ak_template("ecc")
    template.parameters.eccDetail.curveID = TPM2_ECC.NIST_P192
    with pytest.raises(AttestationError, match="curve"):
        parse_ak(template.marshal())
    with pytest.raises(InputError, match="ak_alg"):
        ak_template("dsa")


def test_chooser_passes_the_ak_alg(swtpm, ecc_issuer):
    with choose.issuer("qemu-vtpm", swtpm.tcti, ak_alg="ecc", event_log_path=None) as issuer:
        assert issuer.ak_alg == "ecc" and issuer.ak_pub == ecc_issuer.ak_pub
