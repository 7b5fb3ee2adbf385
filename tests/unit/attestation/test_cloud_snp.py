# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""azure-sev-snp and aws-sev-snp against Constellation's recorded reports (tests/unit/attestation/testdata/sev_snp):
the report, its chain and the AK binding; tampers refused naming why."""

from __future__ import annotations

import base64
import hashlib
import json
import struct
from datetime import datetime, timezone
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import AgentConfig
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import sev_snp
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.aws_snp import (
    AWSSNPValidator,
    ak_digest,
)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.azure_snp import (
    AzureSNPValidator,
    parse_hcl_report,
    runtime_keys,
)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    Measurement,
    Measurements,
)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.snp_vtpm import (
    Evidence,
    InstanceInfo,
    decode_instance_info,
    spki_der,
)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import ak_template, parse_ak
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError, InputError
from lab.amd import amd_name
from lab.snp_platform import HCL_HEADER, HCL_REQUEST

DATA = Path(__file__).resolve().parent / "testdata" / "sev_snp"  # its README names source, commit and licence
AZ_RECORDED = (DATA / "constellation-azure" / "attestation.bin").read_bytes()  # report + the HCL's IGVM request data
AZ_REPORT = AZ_RECORDED[:sev_snp.REPORT_SIZE]
RUNTIME = (DATA / "constellation-azure" / "runtimedata.bin").read_bytes()
VCEK = (DATA / "constellation-azure" / "vcek.pem").read_bytes()
CHAIN = (DATA / "constellation-azure" / "certchain.pem").read_bytes()
OTHER_VLEK = (DATA / "constellation-azure" / "vlek.pem").read_bytes()
AWS_REPORT = base64.b64decode((DATA / "constellation-aws" / "report.txt").read_text())
AWS_VLEK = (DATA / "constellation-aws" / "vlek.pem").read_bytes()
AWS_CHAIN = (DATA / "constellation-aws" / "certchain.pem").read_bytes()
# Constellation's testdata.AKDigest: SHA-512 of the AK the AWS report binds.
AWS_AK_DIGEST = bytes.fromhex("87ab7caf510e1b3520dc3cceb64ee44128e10976fb0d3fc5e274699d8aaf5061"
                              "54af4c1de0a026b49fdf861e9ac75551551b3534d1c61369a3b08f5baed0db2f")
AWS_NOW = datetime(2025, 6, 1, tzinfo=timezone.utc)  # inside the recorded VLEK's validity


def rsa_ak_pub(public_key) -> bytes:
    """A TPMT_PUBLIC of the AK template carrying ``public_key``'s modulus (the HCL's AK as the vTPM reports it)."""
    public = ak_template("rsa")
    public.unique.rsa = public_key.public_numbers().n.to_bytes(public_key.key_size // 8, "big")
    return public.marshal()


HCL_AK = runtime_keys(RUNTIME)["HCLAkPub"]
HCL_AK_PUB = rsa_ak_pub(HCL_AK)


PCRS = {0: bytes(32)}  # the recorded data has no quote: the PCR part is tested on swtpm (test_cloud_snp_swtpm.py)


def policy(report: bytes = AZ_REPORT) -> Measurements:
    """A set with one PCR and the recorded report's launch measurement (TCB minimums 0)."""
    return Measurements.from_dict({"0": "00" * 32, "snp": {"launchMeasurement": report[0x90:0xC0].hex()}})


def azure_info(report=AZ_RECORDED, runtime=RUNTIME, signer=VCEK, chain=CHAIN) -> bytes:
    return InstanceInfo(report, signer, chain, runtime).to_json()


def azure_trust(info: bytes, ak_pub: bytes = HCL_AK_PUB):
    """The instance info's part of a validation: decoded, bound to ``ak_pub``, verified and matched."""
    validator = AzureSNPValidator(policy())
    evidence = validator.trust_instance(info, ak_pub, parse_ak(ak_pub))
    validator.verify(evidence, PCRS)
    return evidence


# ------------------------------------------------------------------------------------- the document


def test_instance_info_is_constellations_json():
    raw = azure_info()
    doc = json.loads(raw)
    assert list(doc) == ["ReportSigner", "CertChain", "AttestationReport", "Azure", "GCP"]
    assert list(doc["Azure"]) == ["RuntimeData", "MAAToken"] and doc["GCP"] is None
    assert base64.b64decode(doc["ReportSigner"]) == VCEK and base64.b64decode(doc["Azure"]["RuntimeData"]) == RUNTIME
    info = decode_instance_info(raw)
    assert (info.report, info.report_signer, info.cert_chain, info.runtime_data) == (AZ_RECORDED, VCEK, CHAIN, RUNTIME)
    # AWS's issuer leaves CertChain and Azure nil: Go writes null
    aws = json.loads(InstanceInfo(AWS_REPORT, AWS_VLEK).to_json())
    assert aws["CertChain"] is None and aws["Azure"] is None


@pytest.mark.parametrize("change, field", [
    ({"Extra": 1}, "InstanceInfo"),
    ({"GCP": {"ProjectId": "p"}}, "InstanceInfo.GCP"),
    ({"AttestationReport": None}, "InstanceInfo.AttestationReport"),
    ({"AttestationReport": "not base64!"}, "InstanceInfo.AttestationReport"),
    ({"Azure": {"RuntimeData": "", "MAAToken": "", "More": 1}}, "InstanceInfo.Azure"),
    ({"Azure": {"RuntimeData": "", "MAAToken": 5}}, "InstanceInfo.Azure.MAAToken"),
])
def test_malformed_instance_info_is_refused_naming_the_field(change, field):
    doc = json.loads(azure_info())
    doc.update(change)
    with pytest.raises(AttestationError) as err:
        decode_instance_info(json.dumps(doc).encode())
    assert str(err.value).startswith(field + ":")


def test_no_instance_info_is_refused():
    with pytest.raises(AttestationError, match="InstanceInfo: found none"):
        azure_trust(b"")


# ------------------------------------------------------------------------------- the HCL report layout


def build_hcl_report(report: bytes, runtime_data: bytes, size: int) -> bytes:
    """An HCL report as the lab's platform writes one (lab/snp_platform.py), padded as the NV index is."""
    blob = HCL_HEADER.pack(0x414C4348, 2, 0x4D4 + len(runtime_data), 2, 0) + report \
        + HCL_REQUEST.pack(HCL_REQUEST.size + len(runtime_data), 1, 2, 1, len(runtime_data)) + runtime_data
    return blob + bytes(size - len(blob))


def test_hcl_layout_matches_the_recorded_report():
    """Constellation's recorded AttestationReport is the HCL report from 0x20 to the runtime data: ours splits it
    the same way, and a report we build has exactly those bytes there."""
    blob = build_hcl_report(AZ_REPORT, RUNTIME, size=4096)
    assert blob[0x20:0x4D4] == AZ_RECORDED and blob[:4] == b"HCLA" and len(blob) == 4096
    hcl = parse_hcl_report(blob)
    assert hcl.report == AZ_REPORT and hcl.runtime_data == RUNTIME


@pytest.mark.parametrize("offset, value, why", [
    (0x0, 0x41544448, "signature"),
    (0x4C8, 4, "report type 4"),
    (0x4CC, 2, "hash type 2"),
    (0x4D0, 5000, "sizes"),
])
def test_malformed_hcl_report_is_refused_naming_why(offset, value, why):
    blob = bytearray(build_hcl_report(AZ_REPORT, RUNTIME, size=4096))
    struct.pack_into("<I", blob, offset, value)
    with pytest.raises(AttestationError, match="HCL report: .*" + why):
        parse_hcl_report(bytes(blob))


# ------------------------------------------------------------------------------------ Azure, real data


def test_real_azure_report_verifies_and_binds_the_hcl_ak():
    evidence = azure_trust(azure_info())
    assert evidence.verified.signing_key == "vcek" and evidence.verified.product == "Milan"
    assert bytes(evidence.verified.report.report_data) == hashlib.sha256(RUNTIME).digest() + bytes(32)
    assert evidence.ek_pub_sha256 is None  # this recorded runtime data predates HCLEkPub


def test_real_azure_report_without_the_request_data_is_accepted_too():
    assert azure_trust(azure_info(report=AZ_REPORT)).verified.signing_key == "vcek"


def test_hcl_ek_becomes_the_peers_ek_identity():
    """A runtime data with HCLEkPub names the EK (SHA-256 of its SPKI DER) - checked on the parsing side, since the
    recorded report binds the recorded runtime data only."""
    ek = rsa.generate_private_key(65537, 2048).public_key()
    doc = json.loads(RUNTIME)
    doc["keys"].append({"kid": "HCLEkPub", "kty": "RSA", "e": "AQAB",
                        "n": base64.urlsafe_b64encode(ek.public_numbers().n.to_bytes(256, "big")).decode().rstrip("=")})
    keys = runtime_keys(json.dumps(doc).encode())
    assert hashlib.sha256(spki_der(keys["HCLEkPub"])).hexdigest() == hashlib.sha256(spki_der(ek)).hexdigest()


@pytest.mark.parametrize("keys, field", [
    ([{"kid": "HCLAkPub", "kty": "RSA", "e": "AQAB", "n": "ab!c"}], r"keys\[HCLAkPub\]\.n"),
    ([{"kid": "HCLAkPub", "kty": "EC", "e": "AQAB", "n": "AQAB"}], r"keys\[HCLAkPub\]\.kty"),
    ([json.loads(RUNTIME)["keys"][0]] * 2, r"keys\[HCLAkPub\]: found twice"),
    ("no list", r"RuntimeData: found no \"keys\" list"),
])
def test_malformed_runtime_data_is_refused_naming_the_key(keys, field):
    with pytest.raises(AttestationError, match=field):
        runtime_keys(json.dumps({"keys": keys}).encode())


def test_an_ak_the_runtime_data_does_not_name_is_refused():
    other = rsa_ak_pub(rsa.generate_private_key(65537, 2048).public_key())
    with pytest.raises(AttestationError, match="AK is not bound: the quoting AK is not the runtime data's HCLAkPub"):
        azure_trust(azure_info(), other)


def test_an_ecc_ak_is_refused_for_an_rsa_hcl_key():
    public = ak_template("ecc")
    numbers = ec.generate_private_key(ec.SECP256R1()).public_key().public_numbers()
    public.unique.ecc.x, public.unique.ecc.y = numbers.x.to_bytes(32, "big"), numbers.y.to_bytes(32, "big")
    with pytest.raises(AttestationError, match="AK is not bound"):
        azure_trust(azure_info(), public.marshal())


def test_swapped_runtime_data_is_refused():
    """Same length, same HCLAkPub, another VM's ID: the report does not bind it."""
    swapped = RUNTIME.replace(b"B6C98C3B", b"B6C98C3C")
    assert swapped != RUNTIME and len(swapped) == len(RUNTIME)
    with pytest.raises(AttestationError, match="runtime data swapped.*report_data"):
        azure_trust(azure_info(runtime=swapped))
    # a runtime data naming another AK, with the IGVM request data left out
    doc = json.loads(RUNTIME)
    doc["keys"][0]["n"] = doc["keys"][0]["n"][:-4] + "AAAA"
    with pytest.raises(AttestationError, match="runtime data swapped"):
        azure_trust(azure_info(report=AZ_REPORT, runtime=json.dumps(doc).encode()))


def test_request_data_not_describing_the_runtime_data_is_refused():
    with pytest.raises(AttestationError, match="IGVM request data.*sizes"):
        azure_trust(azure_info(runtime=RUNTIME + b" "))


def test_a_vlek_for_a_vcek_signed_report_is_refused():
    """A VCEK-signed report presented with a VLEK (another platform's key): the signer is not the report's kind."""
    with pytest.raises(AttestationError, match="vcek.hwID: found no hwID extension"):
        azure_trust(azure_info(signer=OTHER_VLEK))


def test_a_foreign_chain_is_refused():
    """A CertChain whose ARK is not one of AMD's pinned roots (another "AMD" of the same name) is refused, though
    the report would verify without it: the chain sent is never trusted on its own."""
    key = rsa.generate_private_key(65537, 2048)
    ark = (x509.CertificateBuilder().subject_name(amd_name("ARK-Milan")).issuer_name(amd_name("ARK-Milan"))
           .public_key(key.public_key()).serial_number(1).not_valid_before(datetime(2020, 1, 1))
           .not_valid_after(datetime(2045, 1, 1)).sign(key, hashes.SHA384()))
    with pytest.raises(AttestationError, match="ark: found ARK-Milan .*wanted one of the pinned AMD roots"):
        azure_trust(azure_info(chain=ark.public_bytes(serialization.Encoding.PEM)))


def test_a_changed_report_field_is_refused():
    report = bytearray(AZ_REPORT)
    report[0x90] ^= 1  # the launch measurement
    with pytest.raises(AttestationError, match="signature: found a signature that does not verify with the VCEK"):
        azure_trust(azure_info(report=bytes(report)))


@pytest.mark.parametrize("info, field", [
    (InstanceInfo(AZ_RECORDED, b"", CHAIN, RUNTIME), "InstanceInfo.ReportSigner"),
    (InstanceInfo(AZ_RECORDED, VCEK, CHAIN, None), "InstanceInfo.Azure"),
    (InstanceInfo(AZ_REPORT + bytes(8), VCEK, CHAIN, RUNTIME), "InstanceInfo.AttestationReport"),
])
def test_missing_parts_are_refused_naming_them(info, field):
    with pytest.raises(AttestationError) as err:
        azure_trust(info.to_json())
    assert str(err.value).startswith(field)


# -------------------------------------------------------------------------------------- AWS, real data


def aws_validator(now=AWS_NOW) -> AWSSNPValidator:
    return AWSSNPValidator(policy(AWS_REPORT), now=now)


def test_real_aws_report_verifies_through_its_vlek_chain():
    verified = sev_snp.verify_report(sev_snp.parse_report(AWS_REPORT), AWS_VLEK, AWS_CHAIN, now=AWS_NOW)
    assert verified.signing_key == "vlek"
    assert bytes(verified.report.report_data) == AWS_AK_DIGEST


def test_real_aws_report_verifies_and_matches_through_the_validator():
    """The verification half of the validator (the binding needs the recorded AK, which Constellation did not keep:
    it is tested on swtpm with the lab's platform)."""
    validator = aws_validator()
    evidence = Evidence(decode_instance_info(InstanceInfo(AWS_REPORT, AWS_VLEK).to_json()),
                        sev_snp.parse_report(AWS_REPORT))
    assert validator.verify(evidence, PCRS)[0] == "default"
    assert evidence.verified.signing_key == "vlek" and evidence.verified.product == "Milan"


def test_real_aws_report_binds_only_its_ak():
    """A quoting AK whose SHA-512 is not the report's report_data is refused, naming both digests."""
    other = rsa_ak_pub(rsa.generate_private_key(65537, 2048).public_key())
    with pytest.raises(AttestationError) as err:
        aws_validator().trust_instance(InstanceInfo(AWS_REPORT, AWS_VLEK).to_json(), other, parse_ak(other))
    assert "AK is not bound: report_data: found %s" % AWS_AK_DIGEST.hex() in str(err.value)
    assert ak_digest(parse_ak(other).public_key).hex() in str(err.value)


def test_aws_refuses_a_vcek_signed_report():
    with pytest.raises(AttestationError, match="signing_key: found vcek, wanted vlek"):
        aws_validator().trust_instance(azure_info(report=AZ_REPORT, runtime=None), HCL_AK_PUB, parse_ak(HCL_AK_PUB))


def test_aws_refuses_an_expired_vlek():
    evidence = Evidence(decode_instance_info(InstanceInfo(AWS_REPORT, AWS_VLEK).to_json()),
                        sev_snp.parse_report(AWS_REPORT))
    with pytest.raises(AttestationError, match="vlek.validity: found .* outside the chain's .* to 2025-12-10T22:30:16Z"):
        aws_validator(now=datetime(2026, 1, 1, tzinfo=timezone.utc)).verify(evidence, PCRS)


def test_a_report_against_a_set_without_snp_is_refused():
    """Decision: a report needs a set that says what it must show (the measurements fail closed)."""
    validator = AzureSNPValidator(Measurements({0: Measurement(bytes(32), False)}))
    evidence = validator.trust_instance(azure_info(), HCL_AK_PUB, parse_ak(HCL_AK_PUB))
    with pytest.raises(AttestationError, match="snp"):
        validator.verify(evidence, PCRS)


def test_the_recorded_launch_measurement_is_enforced():
    validator = AzureSNPValidator(policy(AWS_REPORT))  # another VM's launch measurement
    evidence = validator.trust_instance(azure_info(), HCL_AK_PUB, parse_ak(HCL_AK_PUB))
    with pytest.raises(AttestationError, match="launchMeasurement"):
        validator.verify(evidence, PCRS)


# --------------------------------------------------------------------------------------- agent configuration


def test_agent_config_takes_the_azure_issuers_certificate_keys():
    base = dict(state_dir="/tmp/x", public_endpoint="10.0.0.1:9000", measurements="/m.json",
                insecure_unsigned_measurements=True, insecure_unauthenticated_activation=True)
    config = AgentConfig.from_mapping(dict(base, variant="azure-sev-snp", amd_cert_cache="/var/lib/amd",
                                           amd_kds_fetch=False))
    assert (config.amd_cert_cache, config.amd_kds_fetch) == ("/var/lib/amd", False)
    for bad, field in ((dict(variant="azure-sev-snp", amd_kds_fetch="yes"), "amd_kds_fetch"),
                       (dict(variant="azure-sev-snp", amd_cert_cache=5), "amd_cert_cache"),
                       (dict(variant="qemu-vtpm-ek", ek_ca="/ca.pem", amd_cert_cache="/c"), "amd_cert_cache")):
        with pytest.raises(InputError) as err:
            AgentConfig.from_mapping(dict(base, **bad))
        assert err.value.field == field
