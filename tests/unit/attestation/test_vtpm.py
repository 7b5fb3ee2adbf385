# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""qemu-vtpm issuer and validator against a real swtpm, including real attacks."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding
from cryptography.hazmat.primitives.serialization import load_der_public_key
from tpm2_pytss import ESAPI, ESYS_TR, TPM2_ALG, TPM2B_PUBLIC, TPMA_OBJECT, TPMS_ATTEST, TPMT_PUBLIC
from tpm2_pytss import TPMT_SIG_SCHEME, TPMT_TK_HASHCHECK, TPM2_ST, TPM2_RH

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import eventlog
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    Measurement,
    Measurements,
)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.tpm import TPM, read_pcrs
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import (
    AK_PERSISTENT_HANDLE,
    VTPMIssuer,
    VTPMValidator,
    encode_document,
    make_extra_data,
    make_tpm_nonce,
)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError

NONCE = bytes(range(32))


def policy_of(pcrs, indices=(0, 4, 9, 11, 15), warn_only=()):
    return Measurements({i: Measurement(pcrs[i], i in warn_only) for i in indices})


@pytest.fixture(scope="module")
def issuer(swtpm):
    with VTPMIssuer(swtpm.tcti, event_log_path=None) as iss:
        yield iss


@pytest.fixture(scope="module")
def validator(swtpm):
    return VTPMValidator(policy_of(read_pcrs(swtpm.tcti)))


def test_nonce_binding_matches_spec_vector():
    extra = make_extra_data(b"Constellation", bytes.fromhex("01020304"))
    assert extra.hex() == "cfc52e55ebecb9c8d5da5f58c838eef30bee7575d1cde5559336e3b90234cbd2"
    assert make_tpm_nonce(None, extra).hex() == "6196c50382d9b05e7b25710bfb4503cb97e881a1227f00477494e99761744a6a"


def test_round_trip_returns_user_data_and_pcrs(swtpm, issuer, validator):
    document = issuer.issue(b"spki-hash", NONCE)
    result = validator.validate(document, NONCE)
    assert result.user_data == b"spki-hash"
    assert result.pcrs == read_pcrs(swtpm.tcti)
    assert [c.index for c in result.checks] == [0, 4, 9, 11, 15]
    assert all(c.ok for c in result.checks) and result.warnings == []
    assert issuer.oid == validator.oid == "1.3.9900.5.1"


def test_document_shape_follows_go_encoding(issuer):
    doc = json.loads(issuer.issue(b"VerifyService", NONCE))
    assert list(doc) == ["Attestation", "InstanceInfo", "UserData"]
    assert doc["InstanceInfo"] is None
    assert base64.b64decode(doc["UserData"]) == b"VerifyService"
    att = doc["Attestation"]
    assert list(att) == ["ak_pub", "quotes", "TeeAttestation"]  # no event log on swtpm: omitted
    assert att["TeeAttestation"] is None
    banks = [q["pcrs"]["hash"] for q in att["quotes"]]
    assert banks == [4, 11, 12, 13]  # every allocated bank of a plain swtpm
    for quote in att["quotes"]:
        assert list(quote) == ["quote", "raw_sig", "pcrs"]
        assert sorted(quote["pcrs"]["pcrs"], key=int) == [str(i) for i in range(24)]
        assert list(quote["pcrs"]["pcrs"]) == sorted(str(i) for i in range(24))  # Go sorts keys as strings
    attest, _unused1 = TPMS_ATTEST.unmarshal(base64.b64decode(att["quotes"][1]["quote"]))
    expected = make_tpm_nonce(None, make_extra_data(b"VerifyService", NONCE))
    assert bytes(attest.extraData) == expected


def test_ak_is_persisted_and_reused(swtpm, issuer):
    ak_pub = issuer.ak_pub
    with VTPMIssuer(swtpm.tcti, event_log_path=None) as second:
        assert second.ak_pub == ak_pub
    with ESAPI(swtpm.tcti) as esapi:
        handle = esapi.tr_from_tpmpublic(AK_PERSISTENT_HANDLE)
        public, _unused1, _unused2 = esapi.read_public(handle)
        assert public.publicArea.marshal() == ak_pub
        attrs = public.publicArea.objectAttributes
        assert attrs & TPMA_OBJECT.RESTRICTED and attrs & TPMA_OBJECT.SIGN_ENCRYPT
        assert public.publicArea.parameters.rsaDetail.keyBits == 2048


def test_wrong_enforced_pcr_is_refused_naming_it(swtpm, issuer):
    pcrs = read_pcrs(swtpm.tcti)
    policy = policy_of(pcrs)
    policy.pcrs[9] = Measurement(b"\x42" * 32, False)
    with pytest.raises(AttestationError) as err:
        VTPMValidator(policy).validate(issuer.issue(b"u", NONCE), NONCE)
    assert "PCR 9" in str(err.value) and "42" * 32 in str(err.value) and pcrs[9].hex() in str(err.value)
    assert [c.index for c in err.value.checks if not c.ok] == [9]


def test_warn_only_mismatch_only_warns(swtpm, issuer):
    policy = policy_of(read_pcrs(swtpm.tcti))
    policy.pcrs[14] = Measurement(b"\x13" * 32, True)
    result = VTPMValidator(policy).validate(issuer.issue(b"u", NONCE), NONCE)
    assert result.user_data == b"u"
    assert len(result.warnings) == 1 and "PCR 14" in result.warnings[0]
    assert [c.index for c in result.checks if not c.ok] == [14]


def test_replayed_document_is_refused(issuer, validator):
    old = issuer.issue(b"u", b"old-nonce-" + bytes(22))
    validator.validate(old, b"old-nonce-" + bytes(22))
    with pytest.raises(AttestationError, match="extraData .* does not match the nonce binding"):
        validator.validate(old, NONCE)


def test_swapped_user_data_is_refused(issuer, validator):
    doc_a = json.loads(issuer.issue(b"user data A", NONCE))
    doc_b = json.loads(issuer.issue(b"user data B", NONCE))
    doc_a["UserData"] = doc_b["UserData"]
    with pytest.raises(AttestationError, match="swapped user data"):
        validator.validate(json.dumps(doc_a).encode(), NONCE)
    # and the other way round: B's quote with A's user data
    doc_b["Attestation"], doc_b["UserData"] = json.loads(issuer.issue(b"user data A", NONCE))["Attestation"], \
        doc_b["UserData"]
    with pytest.raises(AttestationError, match="nonce binding"):
        validator.validate(json.dumps(doc_b).encode(), NONCE)


def test_altered_pcr_value_is_refused(issuer, validator):
    doc = json.loads(issuer.issue(b"u", NONCE))
    sha256 = [q for q in doc["Attestation"]["quotes"] if q["pcrs"]["hash"] == 11][0]
    sha256["pcrs"]["pcrs"]["9"] = base64.b64encode(b"\x99" * 32).decode()
    with pytest.raises(AttestationError, match="do not match the quoted PCR digest"):
        validator.validate(json.dumps(doc).encode(), NONCE)


def _tpm_nonce(user_data):
    return make_tpm_nonce(None, make_extra_data(user_data, NONCE))


def test_quote_over_other_pcrs_relabelled_is_refused(swtpm, issuer):
    """A quote signed over PCRs 0-1, presented as PCRs 2-3 (the Keylime flaw)."""
    quote = issuer.quote(_tpm_nonce(b"u"), 0x000B, (0, 1))
    values = quote["pcrs"]["pcrs"]
    quote["pcrs"]["pcrs"] = {"2": values["0"], "3": values["1"]}
    document = encode_document({"ak_pub": base64.b64encode(issuer.ak_pub).decode(), "quotes": [quote]},
                               None, b"u")
    pcrs = read_pcrs(swtpm.tcti)
    validator = VTPMValidator(Measurements({2: Measurement(pcrs[0]), 3: Measurement(pcrs[1])}),
                              pcr_selection=(2, 3))
    with pytest.raises(AttestationError, match=r"signed PCR selection is sha256:0-1, expected sha256:2-3"):
        validator.validate(document, NONCE)
    # the default validator wants all 24 PCRs signed
    with pytest.raises(AttestationError, match="signed PCR selection"):
        VTPMValidator(Measurements()).validate(document, NONCE)


def test_sha1_only_quote_is_refused(swtpm):
    with VTPMIssuer(swtpm.tcti, event_log_path=None, banks=["sha1"]) as sha1_issuer:
        document = sha1_issuer.issue(b"u", NONCE)
    with pytest.raises(AttestationError, match="no SHA-256 quote .*found: sha1; SHA-1 is not accepted"):
        VTPMValidator(Measurements()).validate(document, NONCE)


def test_sha256_quote_only_document_is_accepted(swtpm, validator):
    with VTPMIssuer(swtpm.tcti, event_log_path=None, banks=["sha256"]) as iss:
        assert validator.validate(iss.issue(b"u", NONCE), NONCE).user_data == b"u"


def test_unrestricted_ak_forging_a_quote_is_refused(swtpm, issuer, validator):
    """The attack: an unrestricted signing key signs any digest, so it can sign a hand-made
    TPMS_ATTEST claiming any PCR values. Here it claims the policy's values for a host whose
    PCR 9 is different. Only the AK's 'restricted' attribute stops it."""
    genuine = json.loads(issuer.issue(b"u", NONCE))
    quote = [q for q in genuine["Attestation"]["quotes"] if q["pcrs"]["hash"] == 11][0]
    attest, _unused1 = TPMS_ATTEST.unmarshal(base64.b64decode(quote["quote"]))
    claimed = {int(k): base64.b64decode(v) for k, v in quote["pcrs"]["pcrs"].items()}
    forged_blob = attest.marshal()
    attrs = TPMA_OBJECT.SIGN_ENCRYPT | TPMA_OBJECT.FIXEDTPM | TPMA_OBJECT.FIXEDPARENT | \
        TPMA_OBJECT.SENSITIVEDATAORIGIN | TPMA_OBJECT.USERWITHAUTH
    template = TPMT_PUBLIC.parse("rsa2048:rsassa-sha256:null", objectAttributes=attrs)
    with ESAPI(swtpm.tcti) as esapi:
        key, public, _unused1, _unused2, _unused3 = esapi.create_primary(None, TPM2B_PUBLIC(publicArea=template), ESYS_TR.OWNER)
        try:
            ticket = TPMT_TK_HASHCHECK(tag=TPM2_ST.HASHCHECK, hierarchy=TPM2_RH.NULL)
            scheme = TPMT_SIG_SCHEME(scheme=TPM2_ALG.NULL)
            signature = esapi.sign(key, hashlib.sha256(forged_blob).digest(), scheme, ticket)
        finally:
            esapi.flush_context(key)
    # the forgery is cryptographically sound: the signature verifies with the key it names
    load_der_public_key(public.publicArea.to_der()).verify(
        bytes(signature.signature.rsassa.sig), forged_blob, padding.PKCS1v15(), hashes.SHA256())
    forged = encode_document({"ak_pub": base64.b64encode(public.publicArea.marshal()).decode(),
                              "quotes": [{"quote": base64.b64encode(forged_blob).decode(),
                                          "raw_sig": base64.b64encode(signature.marshal()).decode(),
                                          "pcrs": quote["pcrs"]}]}, None, b"u")
    assert claimed
    with pytest.raises(AttestationError, match="not a restricted signing key.*restricted"):
        validator.validate(forged, NONCE)


@pytest.mark.parametrize("garbage", [
    b"", b"{", b"null", b"[]", b'{"Attestation": null}', b'{"Attestation": {}}',
    b'{"Attestation": {"ak_pub": "!!!"}}', b'{"Attestation": {"ak_pub": "AAEC"}, "UserData": "dQ=="}',
    b"\xff\xfe", b"x" * (2 << 20),
])
def test_garbage_documents_are_refused(validator, garbage):
    with pytest.raises(AttestationError):
        validator.validate(garbage, NONCE)


def test_truncated_documents_are_refused(issuer, validator):
    document = issuer.issue(b"u", NONCE)
    for cut in (1, 10, len(document) // 3, len(document) // 2, len(document) - 1):
        with pytest.raises(AttestationError):
            validator.validate(document[:cut], NONCE)
    doc = json.loads(document)
    for quote in doc["Attestation"]["quotes"]:
        raw = base64.b64decode(quote["quote"])
        quote["quote"] = base64.b64encode(raw[:-7]).decode()
    with pytest.raises(AttestationError):
        validator.validate(json.dumps(doc).encode(), NONCE)
    doc = json.loads(document)
    doc["Attestation"]["ak_pub"] = base64.b64encode(base64.b64decode(doc["Attestation"]["ak_pub"])[:100]).decode()
    with pytest.raises(AttestationError, match="ak_pub"):
        validator.validate(json.dumps(doc).encode(), NONCE)


def test_tampered_signature_is_refused(issuer, validator):
    doc = json.loads(issuer.issue(b"u", NONCE))
    for quote in doc["Attestation"]["quotes"]:
        raw = bytearray(base64.b64decode(quote["raw_sig"]))
        raw[-1] ^= 1
        quote["raw_sig"] = base64.b64encode(bytes(raw)).decode()
    with pytest.raises(AttestationError, match="signature does not verify"):
        validator.validate(json.dumps(doc).encode(), NONCE)


def test_event_log_replays_against_quote(fresh_swtpm, tmp_path):
    """The lab's measured boot: extend PCRs 4, 9, 11 and write the matching event log."""
    events = [(4, eventlog.EV_EFI_BOOT_SERVICES_APPLICATION, b"lab-image/uki", None),
              (9, eventlog.EV_IPL, b"lab-image/initrd", None),
              (11, eventlog.EV_IPL, b"lab-image/uki-sections", None)]
    with TPM(fresh_swtpm.tcti) as tpm:
        for pcr, _type, data, _digest in events:
            tpm.pcr_extend(pcr, hashlib.sha256(data).digest())
    log = tmp_path / "binary_bios_measurements"
    log.write_bytes(eventlog.build(events))
    pcrs = read_pcrs(fresh_swtpm.tcti)
    with VTPMIssuer(fresh_swtpm.tcti, event_log_path=str(log)) as iss:
        document = iss.issue(b"u", NONCE)
        assert "event_log" in json.loads(document)["Attestation"]
        result = VTPMValidator(policy_of(pcrs)).validate(document, NONCE)
        assert result.pcrs[4] == pcrs[4]
        # a log that claims a different boot chain than the TPM measured
        log.write_bytes(eventlog.build(events[:2] + [(11, eventlog.EV_IPL, b"other", None)]))
        with pytest.raises(AttestationError, match="event log replay: PCR 11"):
            VTPMValidator(policy_of(pcrs)).validate(iss.issue(b"u", NONCE), NONCE)
        log.write_bytes(b"\x00" * 40)
        with pytest.raises(AttestationError, match="crypto-agile"):
            VTPMValidator(policy_of(pcrs)).validate(iss.issue(b"u", NONCE), NONCE)


def test_missing_event_log_is_omitted(swtpm, tmp_path):
    with VTPMIssuer(swtpm.tcti, event_log_path=str(tmp_path / "nope")) as iss:
        assert "event_log" not in json.loads(iss.issue(b"u", NONCE))["Attestation"]


def test_issuer_survives_tpm_restart(fresh_swtpm):
    with VTPMIssuer(fresh_swtpm.tcti, event_log_path=None, banks=["sha256"]) as iss:
        first = iss.ak_pub
        fresh_swtpm.stop()
        with pytest.raises(AttestationError, match="TPM quote failed|cannot open TPM"):
            iss.issue(b"u", NONCE)
        fresh_swtpm.start()
        document = iss.issue(b"u", NONCE)  # reconnected; the AK persisted in the TPM state
        assert json.loads(document)["Attestation"]["ak_pub"] == base64.b64encode(first).decode()
