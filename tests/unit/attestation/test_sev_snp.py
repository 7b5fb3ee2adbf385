# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""AMD SEV-SNP reports (sev_snp.py) with real reports from go-sev-guest and Constellation (Azure, AWS VLEK):
they parse, verify against AMD's pinned roots and pass a matching policy; the layout, the certificate table,
the roots, the cache and the policy document behave as documented (docs/attestation.md, "AMD SEV-SNP reports")."""

from __future__ import annotations

import datetime
import struct
import warnings

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import sev_snp
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.sev_snp import SNPError, SNPPolicy
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError, InputError
from ansible_collections.constellation.cluster.tests.support import sev_snp_vectors as sv

UTC = datetime.timezone.utc


@pytest.mark.parametrize("vec", sv.vectors(), ids=lambda v: v.name)
def test_real_reports_verify_and_pass_their_policy(vec):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the zero-serial VCEK/VLEK must not leak a warning
        report = sev_snp.parse_report(vec.report)
        verified = sev_snp.verify_report(report, vec.signer, vec.chain, now=vec.now)
    assert verified.product == "Milan"
    assert verified.signing_key == vec.kind == report.signing_key
    policy = SNPPolicy.from_dict(sv.matching_policy(report))
    policy.check(verified.report)
    assert SNPPolicy.from_dict(policy.to_dict()) == policy


def test_real_reports_fields():
    gsg = sev_snp.parse_report(sv.vector("go-sev-guest").report)
    assert (gsg.version, gsg.signing_key, gsg.policy.debug, gsg.vmpl) == (2, "vcek", True, 0)
    assert gsg.reported_tcb == sev_snp.TCB(bootloader=2, tee=0, snp=5, microcode=68)
    assert gsg.report_data[:5] == bytes([1, 2, 3, 4, 5])
    azure = sev_snp.parse_report(sv.vector("azure").report)
    assert azure.measurement.hex().startswith("5677f1de87289e7a")
    assert azure.id_key_digest.hex().startswith("57e229e0ffe5fa92")
    assert azure.reported_tcb.to_dict() == {"bootloader": 2, "tee": 0, "snp": 6, "microcode": 93}
    aws = sev_snp.parse_report(sv.vector("aws").report)
    assert (aws.version, aws.signing_key, aws.cpuid_fam_id, aws.cpuid_mod_id) == (3, "vlek", 0x19, 0x01)
    # AWS binds the vTPM AK: report_data is the SHA-512 of its public key (Constellation's AKDigest).
    assert aws.report_data.hex().startswith("87ab7caf510e1b3520dc3cceb64ee441")


def test_to_dict_uses_amds_names_and_hex():
    report = sev_snp.parse_report(sv.vector("aws").report)
    data = report.to_dict()
    assert data["reported_tcb"] == {"bootloader": 4, "tee": 0, "snp": 24, "microcode": 217}
    assert data["policy"]["debug"] is False and data["policy"]["smt"] is True
    assert data["measurement"] == report.measurement.hex() and len(data["chip_id"]) == 128
    assert data["signing_key"] == "vlek" and data["version"] == 3 and data["cpuid_fam_id"] == 0x19
    verified = sev_snp.verify_report(report, sv.vector("aws").signer, sv.vector("aws").chain, now=sv.vector("aws").now)
    assert verified.to_dict()["product"] == "Milan"


def test_tcb_layouts():
    milan = sev_snp.TCB.from_u64(0x4400000000000502, "Milan")
    assert milan.bootloader == 2 and milan.tee == 5 and milan.fmc is None
    raw = struct.unpack("<Q", bytes([2, 0, 0, 0, 0, 0, 6, 93]))[0]
    assert sev_snp.TCB.from_u64(raw) == sev_snp.TCB(2, 0, 6, 93)
    assert sev_snp.TCB(2, 0, 6, 93).to_u64() == raw
    turin_raw = struct.unpack("<Q", bytes([1, 2, 3, 4, 0, 0, 0, 9]))[0]
    turin = sev_snp.TCB.from_u64(turin_raw, "Turin")
    assert turin == sev_snp.TCB(bootloader=2, tee=3, snp=4, microcode=9, fmc=1)
    assert turin.to_u64("Turin") == turin_raw and turin.to_dict()["fmc"] == 1


def test_parse_is_strict():
    good = sv.vector("aws").report
    cases = {
        "report": good[:-1],
        "version": sv.put_u32(good, 0, 6),
        "signature_algo": sv.put_u32(good, 0x34, 2),
        "policy": sv.put_u64(good, 0x08, 0x30000 | (1 << 40)),
        "signer_info": sv.put_u32(good, 0x48, 1 << 6),
        "reserved": sv.put(good, 0x4C, b"\x01"),
        "signature": sv.put(good, 0x4A0 - 1, b"\x01"),
        "vmpl": sv.put_u32(good, 0x30, 4),
    }
    for name, data in cases.items():
        with pytest.raises(SNPError) as err:
            sev_snp.parse_report(data)
        assert err.value.field == name, name
        assert str(err.value).startswith(name + ": found ")
    with pytest.raises(SNPError, match="policy: found 0x0 .bit 17 clear"):
        sev_snp.parse_report(sv.put_u64(good, 0x08, 0))
    # version 2 keeps the CPUID bytes reserved; versions 3+ read them
    v2 = sev_snp.parse_report(sv.vector("azure").report)
    assert v2.cpuid_fam_id is None
    with pytest.raises(SNPError, match="^reserved: "):
        sev_snp.parse_report(sv.put(sv.vector("azure").report, 0x188, b"\x19"))
    # mitigation vectors exist from version 5 on; before, the bytes are reserved
    with pytest.raises(SNPError, match="^reserved: "):
        sev_snp.parse_report(sv.put(good, 0x1F8, b"\x01"))
    v5 = sev_snp.parse_report(sv.put(sv.put_u32(good, 0, 5), 0x1F8, b"\x01"))
    assert v5.launch_mit_vector == 1 and v5.current_mit_vector == 0
    assert isinstance(SNPError("x", 1, 2), AttestationError)


def test_cert_table_round_trip_and_bounds():
    vec = sv.vector("azure")
    chain = sev_snp.load_certificates(vec.chain, "chain")
    ders = {"vcek": sev_snp.load_certificate(vec.signer, "vcek").public_bytes(serialization.Encoding.DER),
            "ask": chain[0].public_bytes(serialization.Encoding.DER),
            "ark": chain[1].public_bytes(serialization.Encoding.DER)}
    table = sev_snp.build_cert_table(ders)
    assert sev_snp.parse_cert_table(table) == ders
    assert sev_snp.parse_cert_table(b"") == {}
    # an unknown GUID is skipped
    unknown = b"\x11" * 16 + struct.pack("<II", 48, 4) + bytes(24) + b"abcd"
    assert sev_snp.parse_cert_table(unknown) == {}
    for bad, field in ((table[:30], "certs"),
                       (table[:16] + struct.pack("<II", 10, 5) + table[24:], "certs.vcek"),
                       (table[:16] + struct.pack("<II", 96, 10 ** 6) + table[24:], "certs.vcek"),
                       (table[:24] + table[:24] + table[24:], "certs.vcek")):
        with pytest.raises(SNPError) as err:
            sev_snp.parse_cert_table(bad)
        assert err.value.field == field


def test_verified_report_from_extended_table():
    """The signer and chain as a certificate table hands them over (DER), verified like PEM."""
    vec = sv.vector("azure")
    table = sev_snp.parse_cert_table(sev_snp.build_cert_table({
        "vcek": sev_snp.load_certificate(vec.signer, "vcek").public_bytes(serialization.Encoding.DER)}))
    verified = sev_snp.verify_report(sev_snp.parse_report(vec.report), table["vcek"], now=vec.now)
    assert verified.signing_key == "vcek"


def test_pinned_roots_are_amds():
    roots = sev_snp.pinned_roots()
    assert roots.products == ["Milan", "Genoa", "Turin"]
    for root in roots.roots:
        assert sorted(c.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value for c in root.intermediates) == sorted(
            ["SEV-" + root.product, "SEV-VLEK-" + root.product])
    assert sev_snp.pinned_roots() is roots


def test_load_roots_from_file_folder_and_bytes(tmp_path):
    ark_ask = sv.read("go-sev-guest/milan.testcer")
    (tmp_path / "milan.pem").write_bytes(ark_ask)
    (tmp_path / "notes.txt").write_text("not a certificate")
    for source in (str(tmp_path / "milan.pem"), str(tmp_path), [ark_ask]):
        roots = sev_snp.load_roots(source)
        assert roots.products == ["Milan"]
        vec = sv.vector("go-sev-guest")
        sev_snp.verify_report(sev_snp.parse_report(vec.report), vec.signer, roots=roots, now=vec.now)
    with pytest.raises(InputError, match="amd_roots: expected a readable PEM file"):
        sev_snp.load_roots(str(tmp_path / "missing.pem"))
    ask_only = sev_snp.load_certificates(ark_ask, "x")[0].public_bytes(serialization.Encoding.PEM)
    with pytest.raises(SNPError, match="SEV-Milan without its ARK"):
        sev_snp.load_roots(ask_only)


def test_chain_cache_verifies_a_signer_once():
    vec = sv.vector("aws")
    cache = sev_snp.ChainCache(size=2)
    report = sev_snp.parse_report(vec.report)
    for _attempt in range(3):
        sev_snp.verify_report(report, vec.signer, vec.chain, now=vec.now, cache=cache)
    assert (cache.misses, cache.hits, len(cache)) == (1, 2, 1)
    # the cache never skips the time check nor the report's own signature
    with pytest.raises(SNPError, match="^vlek.validity: "):
        sev_snp.verify_report(report, vec.signer, vec.chain, now=datetime.datetime(2026, 6, 1, tzinfo=UTC), cache=cache)
    with pytest.raises(SNPError, match="^signature: "):
        sev_snp.verify_report(sev_snp.parse_report(sv.put(vec.report, 0x50, b"\xff")), vec.signer, vec.chain,
                              now=vec.now, cache=cache)
    for v in sv.vectors():  # bounded
        sev_snp.verify_report(sev_snp.parse_report(v.report), v.signer, v.chain, now=v.now, cache=cache)
    assert len(cache) == 2


def test_check_report_data():
    report = sev_snp.parse_report(sv.vector("go-sev-guest").report)
    sev_snp.check_report_data(report, bytes([1, 2, 3, 4, 5]))
    with pytest.raises(SNPError, match="^report_data: found 0102030405"):
        sev_snp.check_report_data(report, bytes([1, 2, 3, 4, 6]))
    with pytest.raises(SNPError, match="at most 64 bytes"):
        sev_snp.check_report_data(report, bytes(65))


def test_policy_document():
    report = sev_snp.parse_report(sv.vector("azure").report)
    doc = sv.matching_policy(report, launchMeasurement=[report.measurement.hex(), "00" * 48])
    policy = SNPPolicy.from_dict(doc)
    assert len(policy.launch_measurement) == 2 and policy.to_dict()["launchMeasurement"][0] == report.measurement.hex()
    minimal = SNPPolicy.from_dict({"launchMeasurement": report.measurement.hex()})
    assert minimal.id_key_digest is None and minimal.vmpl is None and not minimal.allow_debug
    minimal.check(report)
    bad_docs = {
        "snp": ["not a mapping"],
        "snp.launchMeasurement": {},
        "snp.microcodeVersion": {"launchMeasurement": "00" * 48, "microcodeVersion": 256},
        "snp.idKeyDigest[1]": {"launchMeasurement": "00" * 48, "idKeyDigest": ["00" * 48, "zz"]},
        "snp.hostData": {"launchMeasurement": "00" * 48, "hostData": "00" * 31},
        "snp.allowDebug": {"launchMeasurement": "00" * 48, "allowDebug": "yes"},
        "snp.vmpl": {"launchMeasurement": "00" * 48, "vmpl": 4},
        "snp.amdRootKey": {"launchMeasurement": "00" * 48, "amdRootKey": "not pem"},
    }
    for field, doc in bad_docs.items():
        with pytest.raises(InputError) as err:
            SNPPolicy.from_dict(doc)
        assert err.value.field == field, field
    with pytest.raises(InputError, match="only the keys"):
        SNPPolicy.from_dict({"launchMeasurement": "00" * 48, "bootloader": 1})


def test_policy_amd_root_key_pins_its_own_ark():
    vec = sv.vector("go-sev-guest")
    ark = sev_snp.load_certificates(sv.read("go-sev-guest/milan.testcer"), "x")[1]
    pem = ark.public_bytes(serialization.Encoding.PEM).decode()
    report = sev_snp.parse_report(vec.report)
    policy = SNPPolicy.from_dict(sv.matching_policy(report, amdRootKey=pem))
    roots = policy.roots()
    assert roots.products == ["Milan"] and not roots.roots[0].intermediates
    # with the ARK alone, the ASK must come with the report
    with pytest.raises(SNPError, match="^vcek.issuer: found SEV-Milan"):
        sev_snp.verify_report(report, vec.signer, roots=roots, now=vec.now)
    sev_snp.verify_report(report, vec.signer, vec.chain, roots=roots, now=vec.now)


def test_threads_share_roots_and_cache_without_warnings():
    """The agent validates in worker threads: shared roots and cache, zero-serial VCEKs loaded concurrently, no
    warning escapes and every report verifies."""
    import threading

    cache = sev_snp.ChainCache()
    errors = []

    def work():
        try:
            for vec in sv.vectors():
                sev_snp.verify_report(sev_snp.parse_report(vec.report), vec.signer, vec.chain, now=vec.now,
                                      cache=cache if vec.name != "azure" else None)
        except Exception as err:  # pylint: disable=broad-except  # reported below
            errors.append(err)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        threads = [threading.Thread(target=work) for _thread in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert not errors
    assert len(cache) == 3
