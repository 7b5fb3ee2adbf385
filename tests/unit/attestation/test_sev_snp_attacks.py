# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Attacks on AMD SEV-SNP reports, each refused with an SNPError naming the field, what was found and what
was wanted: a tampered real report, a report re-signed with the attacker's own key, a chain under a foreign
ARK (also one that copies AMD's names), the wrong signer, a debug or migration-agent guest, a platform below
the TCB minimums, the wrong launch measurement / ID key / host data / VMPL / guest SVN, a report bound to
other data, a certificate outside its validity."""

from __future__ import annotations

import dataclasses
import datetime

import pytest
from cryptography.hazmat.primitives import serialization

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import sev_snp
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.sev_snp import SNPError, SNPPolicy
from ansible_collections.constellation.cluster.tests.support import sev_snp_vectors as sv

UTC = datetime.timezone.utc

# The signed fields of the layout (offset, size), AMD's names.
FIELDS = [("version", 0x00, 4), ("guest_svn", 0x04, 4), ("policy", 0x08, 8), ("family_id", 0x10, 16),
          ("image_id", 0x20, 16), ("vmpl", 0x30, 4), ("signature_algo", 0x34, 4), ("current_tcb", 0x38, 8),
          ("platform_info", 0x40, 8), ("signer_info", 0x48, 4), ("report_data", 0x50, 64),
          ("measurement", 0x90, 48), ("host_data", 0xC0, 32), ("id_key_digest", 0xE0, 48),
          ("author_key_digest", 0x110, 48), ("report_id", 0x140, 32), ("report_id_ma", 0x160, 32),
          ("reported_tcb", 0x180, 8), ("cpuid", 0x188, 3), ("chip_id", 0x1A0, 64), ("committed_tcb", 0x1E0, 8),
          ("current_version", 0x1E8, 3), ("committed_version", 0x1EC, 3), ("launch_tcb", 0x1F0, 8),
          ("signature_r", 0x2A0, 72), ("signature_s", 0x2E8, 72)]
# Tampers caught before the signature, by the field that names them: (field, first byte or last byte) -> field.
EARLY = {("version", 0): "version", ("version", 1): "version", ("signature_algo", 0): "signature_algo", ("signature_algo", 1): "signature_algo",
         ("policy", 1): "policy", ("vmpl", 1): "vmpl", ("signer_info", 1): "signer_info",
         ("chip_id", 0): "vcek.hwID", ("chip_id", 1): "vcek.hwID"}


def _refused(call, field):
    with pytest.raises(SNPError) as err:
        call()
    assert err.value.field == field, str(err.value)
    assert str(err.value).startswith("%s: found " % field) and ", wanted " in str(err.value)
    return err.value


def _verify(data, vec, **kwargs):
    return sev_snp.verify_report(sev_snp.parse_report(data), kwargs.pop("signer", vec.signer),
                                 kwargs.pop("chain", vec.chain), now=kwargs.pop("now", vec.now), **kwargs)


@pytest.mark.parametrize("vec", [sv.vector("aws"), sv.vector("azure")], ids=lambda v: v.name)
@pytest.mark.parametrize("name,offset,size", FIELDS, ids=[f[0] for f in FIELDS])
def test_every_single_field_tamper_is_refused(vec, name, offset, size):
    for position in sorted({offset, offset + size - 1}):
        data = bytearray(vec.report)
        data[position] ^= 0x04 if name == "version" else 0x01  # version 3 -> 7, 2 -> 6 (3 -> 2 would be valid)
        with pytest.raises(SNPError) as err:
            _verify(bytes(data), vec)
        wanted = EARLY.get((name, int(position != offset)), "signature")
        if name == "reported_tcb":  # the signer's TCB extensions no longer match
            wanted = "%s.%s" % (vec.kind, "bootloader" if position == offset else "microcode")
        if name == "chip_id" and vec.kind == "vlek":
            wanted = "signature"  # a VLEK names no chip
        if name == "cpuid" and vec.report[0] == 2:
            wanted = "reserved"  # version 2: the bytes are reserved
        assert err.value.field == wanted, (name, position, str(err.value))


def test_unsigned_and_reserved_tail_is_refused():
    vec = sv.vector("aws")
    _refused(lambda: _verify(sv.put(vec.report, 0x300 + 0x100, b"\x01"), vec), "signature")
    _refused(lambda: _verify(sv.put(vec.report, 0x200, b"\x01"), vec), "reserved")
    no_key = sv.put_u32(vec.report, 0x48, 7 << 2)
    _refused(lambda: _verify(no_key, vec), "signing_key")


@pytest.fixture(scope="module", name="attacker")
def fixture_attacker():
    """The attacker's own chain in AMD's profile, names and all ("ARK-Milan", "SEV-Milan")."""
    return sv.make_chain("Milan")


def _resigned(vec, attacker, **fields):
    """The real report with new field values, signed by the attacker's VCEK for the same chip and TCB."""
    data = vec.report
    for name, value in fields.items():
        offset = dict((f[0], f[1]) for f in FIELDS)[name]
        data = sv.put(data, offset, value)
    data = sv.put_u32(data, 0x48, 0)  # signed by a VCEK
    report = sev_snp.parse_report(data)
    key, cert = attacker.vcek(report.chip_id, report.reported_tcb)
    return sv.sign(data, key), cert


def test_resigned_report_is_refused(attacker):
    vec = sv.vector("aws")
    data, own_vcek = _resigned(vec, attacker, measurement=b"\xee" * 48)
    # with AMD's signer: the signature does not verify
    _refused(lambda: _verify(data, vec, signer=sv.vector("azure").signer, chain=b""), "vcek.hwID")
    _refused(lambda: _verify(sv.put_u32(data, 0x48, 1 << 2), vec), "signature")
    # with the attacker's VCEK, chain or not: its ASK is not AMD's
    _refused(lambda: _verify(data, vec, signer=own_vcek, chain=b""), "vcek.signature")
    _refused(lambda: _verify(data, vec, signer=own_vcek, chain=attacker.ask.public_bytes(
        serialization.Encoding.PEM)), "ask.signature")
    # ... and its ARK is foreign
    err = _refused(lambda: _verify(data, vec, signer=own_vcek, chain=attacker.chain_pem), "ark")
    assert "ARK-Milan" in str(err.found) and "Milan, Genoa, Turin" in str(err.wanted)
    # the same report verifies only where the attacker's ARK is the trust anchor (the lab's case)
    assert _verify(data, vec, signer=own_vcek, chain=b"", roots=attacker.roots()).product == "Milan"


def test_wrong_signer_and_wrong_roots():
    aws, azure, gsg = sv.vector("aws"), sv.vector("azure"), sv.vector("go-sev-guest")
    # another chip's genuine VCEK
    err = _refused(lambda: _verify(gsg.report, gsg, signer=azure.signer, now=azure.now), "vcek.hwID")
    assert "the report's chip_id 3ac3fe21" in str(err)
    # a VCEK offered for a VLEK-signed report
    _refused(lambda: _verify(aws.report, aws, signer=azure.signer, chain=azure.chain, now=azure.now), "vlek.cspID")
    # a genuine VLEK whose report does not match (Constellation's VLEK report and certificate)
    vlek_report = bytes.fromhex(sv.read("constellation-azure/attestation_vlek.hex").decode().strip())
    _refused(lambda: sev_snp.verify_report(sev_snp.parse_report(vlek_report), sv.read("constellation-azure/vlek.pem"),
                                           now=azure.now), "signature")
    # only Genoa's roots: the Milan ASK is nowhere
    genoa = sev_snp.AMDRoots([r for r in sev_snp.pinned_roots().roots if r.product == "Genoa"])
    _refused(lambda: _verify(azure.report, azure, roots=genoa, chain=b""), "vcek.issuer")
    _refused(lambda: _verify(azure.report, azure, roots=genoa), "ark")
    _refused(lambda: _verify(azure.report, azure, signer=b"garbage"), "vcek")
    _refused(lambda: _verify(azure.report, azure, signer=azure.signer + azure.signer), "vcek")
    _refused(lambda: _verify(azure.report, azure, chain=azure.chain * 3), "chain")  # bounded work per report


def test_foreign_ark_in_roots_with_amds_names_cannot_stand_for_amd(attacker):
    """The attacker's VCEK and ASK named like AMD's ("SEV-Milan", "ARK-Milan"): refused by the signatures, whatever
    the names say."""
    azure = sv.vector("azure")
    report = sev_snp.parse_report(azure.report)
    key, own_vcek = attacker.vcek(report.chip_id, report.reported_tcb)
    data = sv.sign(azure.report, key)
    err = _refused(lambda: _verify(data, azure, signer=own_vcek, chain=b""), "vcek.signature")
    assert "SEV-Milan" in str(err)
    err = _refused(lambda: _verify(data, azure, signer=own_vcek, chain=sv.pem(attacker.ask)), "ask.signature")
    assert "ARK-Milan" in str(err)


def test_debug_and_migration_agent_guests_are_refused(attacker):
    gsg = sv.vector("go-sev-guest")
    report = _verify(gsg.report, gsg).report
    assert report.policy.debug
    err = _refused(lambda: SNPPolicy.from_dict(sv.matching_policy(report, allowDebug=False)).check(report),
                   "snp.allowDebug")
    assert "debug bit set" in str(err.found)
    aws = sv.vector("aws")
    data, own_vcek = _resigned(aws, attacker, policy=(0x30000 | 1 << 18).to_bytes(8, "little"))
    migrating = _verify(data, aws, signer=own_vcek, chain=b"", roots=attacker.roots()).report
    _refused(lambda: SNPPolicy.from_dict(sv.matching_policy(migrating, allowMigrationAgent=False)).check(migrating),
             "snp.allowMigrationAgent")
    SNPPolicy.from_dict(sv.matching_policy(migrating, allowMigrationAgent=True)).check(migrating)


@pytest.mark.parametrize("key,part", [("bootloaderVersion", "bootloader"), ("teeVersion", "tee"),
                                      ("snpVersion", "snp"), ("microcodeVersion", "microcode")])
def test_tcb_below_each_minimum_is_refused(key, part):
    vec = sv.vector("azure")
    report = _verify(vec.report, vec).report
    found = getattr(report.reported_tcb, part)
    err = _refused(lambda: SNPPolicy.from_dict(sv.matching_policy(report, **{key: found + 1})).check(report),
                   "snp." + key)
    assert err.found == "%d (reported_tcb)" % found and err.wanted == ">= %d" % (found + 1)


def test_fmc_minimum_needs_a_turin_report():
    vec = sv.vector("azure")
    report = _verify(vec.report, vec).report
    _refused(lambda: SNPPolicy.from_dict(sv.matching_policy(report, fmcVersion=0)).check(report), "snp.fmcVersion")


@pytest.mark.parametrize("key,value", [("launchMeasurement", "ab" * 48), ("idKeyDigest", ["cd" * 48, "ef" * 48]),
                                       ("hostData", "01" * 32), ("vmpl", 1), ("guestSvn", 3)])
def test_wrong_launch_values_are_refused(key, value):
    vec = sv.vector("azure")
    report = _verify(vec.report, vec).report
    err = _refused(lambda: SNPPolicy.from_dict(sv.matching_policy(report, **{key: value})).check(report), "snp." + key)
    shown = {"launchMeasurement": report.measurement, "idKeyDigest": report.id_key_digest,
             "hostData": report.host_data, "vmpl": report.vmpl, "guestSvn": report.guest_svn}[key]
    assert err.found == shown


def test_report_data_bound_to_other_data_is_refused():
    aws = sv.vector("aws")
    report = _verify(aws.report, aws).report
    ak_digest = bytes.fromhex("87ab7caf510e1b3520dc3cceb64ee44128e10976fb0d3fc5e274699d8aaf5061"
                              "54af4c1de0a026b49fdf861e9ac75551551b3534d1c61369a3b08f5baed0db2f")
    sev_snp.check_report_data(report, ak_digest)
    err = _refused(lambda: sev_snp.check_report_data(report, b"\x00" + ak_digest[1:]), "report_data")
    assert err.found == ak_digest


def test_certificates_outside_their_validity_are_refused(attacker):
    aws = sv.vector("aws")
    err = _refused(lambda: _verify(aws.report, aws, now=datetime.datetime(2025, 12, 11, tzinfo=UTC)),
                   "vlek.validity")
    assert "2025-12-10T22:30:16Z" in str(err.found)
    _refused(lambda: _verify(aws.report, aws, now=datetime.datetime(2024, 12, 1, tzinfo=UTC)), "vlek.validity")
    # default now: today (the AWS VLEK expired on 2025-12-10) - unless that is still ahead
    if datetime.datetime.now(UTC) > datetime.datetime(2025, 12, 11, tzinfo=UTC):
        _refused(lambda: sev_snp.verify_report(sev_snp.parse_report(aws.report), aws.signer, aws.chain),
                 "vlek.validity")
    # an expired ASK (the attacker's chain as the roots, the lab's case)
    old = sv.make_chain("Milan", not_after=datetime.datetime(2021, 1, 1, tzinfo=UTC))
    report = sev_snp.parse_report(aws.report)
    key, vcek = old.vcek(report.chip_id, report.reported_tcb, not_after=datetime.datetime(2030, 1, 1, tzinfo=UTC))
    data = sv.sign(sv.put_u32(aws.report, 0x48, 0), key)
    _refused(lambda: _verify(data, aws, signer=vcek, chain=b"", roots=old.roots()), "vcek.validity")


def test_masked_chip_id_and_turin_layout(attacker):
    aws = sv.vector("aws")
    # mask_chip_key: the chip_id must be zero, the hwID is not compared
    data = sv.put(sv.put_u32(aws.report, 0x48, 1 << 1), 0x1A0, bytes(64))
    report = sev_snp.parse_report(data)
    key, vcek = attacker.vcek(b"\x42" * 64, report.reported_tcb)
    assert _verify(sv.sign(data, key), aws, signer=vcek, chain=b"", roots=attacker.roots()).report.mask_chip_key
    nonzero = sv.sign(sv.put(data, 0x1A0, b"\x01"), key)
    _refused(lambda: _verify(nonzero, aws, signer=vcek, chain=b"", roots=attacker.roots()), "chip_id")
    # Turin: the TCB has an FMC byte first; the VCEK's extensions carry it (1.3.6.1.4.1.3704.1.3.9)
    turin = sv.make_chain("Turin")
    tcb = sev_snp.TCB(bootloader=1, tee=2, snp=3, microcode=4, fmc=5)
    data = sv.put(sv.put_u64(aws.report, 0x180, tcb.to_u64("Turin")), 0x188, bytes([0x1A, 0x02, 0x00]))
    data = sv.put_u32(data, 0x48, 0)
    report = sev_snp.parse_report(data)
    assert report.reported_tcb == tcb and report.tcb_product == "Turin"
    key, vcek = turin.vcek(report.chip_id, tcb)
    verified = _verify(sv.sign(data, key), aws, signer=vcek, chain=b"", roots=turin.roots())
    assert verified.product == "Turin" and verified.report.reported_tcb.fmc == 5
    SNPPolicy.from_dict(sv.matching_policy(verified.report, fmcVersion=5)).check(verified.report)
    _refused(lambda: SNPPolicy.from_dict(sv.matching_policy(verified.report, fmcVersion=6)).check(verified.report),
             "snp.fmcVersion")
    key, wrong_fmc = turin.vcek(report.chip_id, dataclasses.replace(tcb, fmc=6))
    _refused(lambda: _verify(sv.sign(data, key), aws, signer=wrong_fmc, chain=b"", roots=turin.roots()), "vcek.fmc")
    # a report naming Turin's CPU under a Milan chain
    key, vcek = attacker.vcek(report.chip_id, sev_snp.TCB.from_u64(tcb.to_u64("Turin"), "Milan"))
    _refused(lambda: _verify(sv.sign(data, key), aws, signer=vcek, chain=b"", roots=attacker.roots()), "cpuid_fam_id")
