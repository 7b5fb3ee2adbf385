# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The validator's own decoders of TPMS_ATTEST and TPMT_SIGNATURE (attestation/tpm_wire.py) against
tpm2_pytss (the TSS's marshalling) on real swtpm quotes of both AKs: the same fields, and every
truncation, extension or oversized length refused where the TSS refuses it."""

from __future__ import annotations

import base64
import json

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from tpm2_pytss import TPM2_ALG, TPMS_ATTEST, TPMT_SIGNATURE, TSS2_Exception

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import tpm_wire
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    Measurement, Measurements)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.variant import QEMU_VTPM
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import (
    AK_ALGS, VTPMIssuer, VTPMValidator, encode_document, make_extra_data, make_tpm_nonce)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError
from ansible_collections.constellation.cluster.tests.unit.attestation.forged_ak import SoftwareAKIssuer

NONCE = bytes(range(64, 96))


@pytest.fixture(scope="module", params=AK_ALGS)
def quote(request, swtpm):
    with VTPMIssuer(swtpm.tcti, event_log_path=None, banks=["sha256"], ak_alg=request.param) as issuer:
        document = json.loads(issuer.issue(b"user data", NONCE))
    (first,) = document["Attestation"]["quotes"]
    return base64.b64decode(first["quote"]), base64.b64decode(first["raw_sig"]), request.param


def _tss_accepts(cls, raw: bytes) -> bool:
    try:
        _value, size = cls.unmarshal(raw)
    except (TSS2_Exception, ValueError, TypeError):
        return False
    return size == len(raw)


def test_quote_fields_equal_the_tss_decoding(quote):
    attest_raw, _raw_sig, _alg = quote
    ours = tpm_wire.parse_quote_attest(attest_raw)
    theirs, _size = TPMS_ATTEST.unmarshal(attest_raw)
    assert ours.magic == int(theirs.magic) == tpm_wire.TPM_GENERATED_VALUE
    assert ours.type == int(theirs.type) == tpm_wire.TPM_ST_ATTEST_QUOTE
    assert ours.extra_data == bytes(theirs.extraData) == make_tpm_nonce(None, make_extra_data(b"user data", NONCE))
    assert ours.pcr_select == [(int(sel.hash), bytes(sel.pcrSelect)[: sel.sizeofSelect])
                               for sel in theirs.attested.quote.pcrSelect]
    assert ours.pcr_select == [(int(TPM2_ALG.SHA256), b"\xff\xff\xff")]
    assert ours.pcr_digest == bytes(theirs.attested.quote.pcrDigest)
    assert tpm_wire.parse_attest_header(attest_raw) == (ours.magic, ours.type)


def test_signature_fields_equal_the_tss_decoding(quote):
    _attest_raw, raw_sig, alg = quote
    ours = tpm_wire.parse_signature(raw_sig)
    theirs, _size = TPMT_SIGNATURE.unmarshal(raw_sig)
    assert ours.sig_alg == int(theirs.sigAlg)
    if alg == "rsa":
        assert ours.sig_alg == tpm_wire.TPM_ALG_RSASSA and ours.hash_alg == int(theirs.signature.rsassa.hash)
        assert ours.sig == bytes(theirs.signature.rsassa.sig) and len(ours.sig) == 256
    else:
        assert ours.sig_alg == tpm_wire.TPM_ALG_ECDSA and ours.hash_alg == int(theirs.signature.ecdsa.hash)
        assert ours.ecdsa_r == bytes(theirs.signature.ecdsa.signatureR)
        assert ours.ecdsa_s == bytes(theirs.signature.ecdsa.signatureS)
    assert ours.hash_alg == int(TPM2_ALG.SHA256)


def test_every_truncation_and_extension_is_refused(quote):
    attest_raw, raw_sig, _alg = quote
    for raw, parse, cls in ((attest_raw, tpm_wire.parse_quote_attest, TPMS_ATTEST),
                            (raw_sig, tpm_wire.parse_signature, TPMT_SIGNATURE)):
        for cut in range(len(raw)):
            assert not _tss_accepts(cls, raw[:cut])
            with pytest.raises(tpm_wire.Malformed):
                parse(raw[:cut])
        assert not _tss_accepts(cls, raw + b"\x00")
        with pytest.raises(tpm_wire.Malformed, match="1 trailing bytes"):
            parse(raw + b"\x00")


def test_oversized_lengths_and_foreign_types_are_refused(quote):
    attest_raw, raw_sig, _alg = quote
    signer_size = int.from_bytes(attest_raw[6:8], "big")
    at_extra = 8 + signer_size
    huge_extra = attest_raw[:at_extra] + b"\x00\x43" + attest_raw[at_extra + 2:]  # 67 > TPM2B_DATA's 66
    with pytest.raises(tpm_wire.Malformed, match="extraData: size 67 exceeds"):
        tpm_wire.parse_quote_attest(huge_extra)
    certify = attest_raw[:4] + (0x8017).to_bytes(2, "big") + attest_raw[6:]  # TPM_ST_ATTEST_CERTIFY
    assert tpm_wire.parse_attest_header(certify) == (tpm_wire.TPM_GENERATED_VALUE, 0x8017)
    with pytest.raises(tpm_wire.Malformed, match="not a quote"):
        tpm_wire.parse_quote_attest(certify)
    hmac = (0x0005).to_bytes(2, "big") + raw_sig[2:]
    with pytest.raises(tpm_wire.Malformed, match="0x0005 is not allowed"):
        tpm_wire.parse_signature(hmac)


# ---------------------------------------------------------------------------------------------
# The validator on validly signed, malformed quotes (qemu-vtpm trusts any restricted-looking AK, so a
# software AK can sign whatever bytes it likes: only the structure checks stand between).


def _resigned(issuer: SoftwareAKIssuer, document: bytes, mangle) -> bytes:
    doc = json.loads(document)
    attestation = doc["Attestation"]
    (quote,) = attestation["quotes"]
    blob = mangle(base64.b64decode(quote["quote"]))
    r, s = decode_dss_signature(issuer.priv_key.sign(blob, ec.ECDSA(hashes.SHA256())))
    raw_sig = (tpm_wire.TPM_ALG_ECDSA.to_bytes(2, "big") + int(TPM2_ALG.SHA256).to_bytes(2, "big")
               + b"\x00\x20" + r.to_bytes(32, "big") + b"\x00\x20" + s.to_bytes(32, "big"))
    quote.update(quote=base64.b64encode(blob).decode(), raw_sig=base64.b64encode(raw_sig).decode())
    return encode_document(attestation, None, base64.b64decode(doc["UserData"]))


@pytest.mark.parametrize("mangle, reason", [
    (lambda blob: blob, None),
    (lambda blob: blob + b"\x00", "not a TPMS_ATTEST: TPMS_ATTEST has 1 trailing bytes"),
    (lambda blob: blob[:-1], "not a TPMS_ATTEST: pcrDigest"),
    (lambda blob: b"\x00" + blob[1:], "magic is 0x00544347"),
    (lambda blob: blob[:4] + b"\x80\x17" + blob[6:], "quote type is 0x8017, expected ATTEST_QUOTE"),
    (lambda blob: blob.replace(make_tpm_nonce(None, make_extra_data(b"u", NONCE)), bytes(32)), "extraData"),
], ids=["genuine-shape", "trailing-byte", "truncated", "magic", "certify-type", "extra-data"])
def test_validator_refuses_validly_signed_malformed_quotes(mangle, reason):
    issuer = SoftwareAKIssuer({}, QEMU_VTPM.oid)
    validator = VTPMValidator(Measurements({4: Measurement(bytes(32))}))
    document = _resigned(issuer, issuer.issue(b"u", NONCE), mangle)
    if reason is None:
        assert validator.validate(document, NONCE).user_data == b"u"
        return
    with pytest.raises(AttestationError, match=reason):
        validator.validate(document, NONCE)
