# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The measurements document's ``snp`` object and the chooser's SEV-SNP plumbing: a set with ``snp`` passes only a
report that passes it, a report against a set without ``snp`` fails closed, every transform of a policy keeps
``snp``, and a variant that verifies reports gets AMD's pinned roots unless a bundle is configured."""

from __future__ import annotations

import json

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.agent import pubapi
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import (
    agent_measurement, choose, policy, sev_snp, variant)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    Measurements, MeasurementsMismatch, MeasurementSets, parse_policy)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError
from ansible_collections.constellation.cluster.tests.support import sev_snp_vectors as sv
from ansible_collections.constellation.cluster.tests.support.keys import sign_policy

PCR4 = {"4": {"expected": "aa" * 32, "warnOnly": False}}


@pytest.fixture(name="report")
def fixture_report():
    vec = sv.vector("azure")
    return sev_snp.verify_report(sev_snp.parse_report(vec.report), vec.signer, vec.chain, now=vec.now).report


def test_plain_and_named_forms_round_trip(report):
    snp = sv.matching_policy(report)
    plain = parse_policy(dict(PCR4, snp=snp))
    assert isinstance(plain, Measurements) and plain.snp == sev_snp.SNPPolicy.from_dict(snp)
    assert parse_policy(json.loads(plain.dumps())) == plain
    named = parse_policy({"version": 2, "accepted": {"old": PCR4, "snp-image": {"snp": snp}}})
    assert named.sets["snp-image"].snp is not None and named.sets["old"].snp is None
    assert MeasurementSets.from_dict(json.loads(named.dumps())) == named
    with pytest.raises(InputError, match=r"measurements.accepted\[bad\]: expected a valid set, got "
                                         r"'snp.launchMeasurement: expected"):
        parse_policy({"accepted": {"bad": {"snp": {}}}})


def test_compare_requires_a_passing_report(report):
    plain = parse_policy({"snp": sv.matching_policy(report)})
    assert plain.match({}, report)[0] == "default"
    with pytest.raises(MeasurementsMismatch) as err:
        plain.compare({})
    assert err.value.snp_error.field == "snp" and "no SEV-SNP report" in str(err.value)
    strict = parse_policy({"snp": sv.matching_policy(report, microcodeVersion=report.reported_tcb.microcode + 1)})
    with pytest.raises(MeasurementsMismatch) as err:
        strict.compare({}, report)
    assert err.value.snp_error.field == "snp.microcodeVersion"
    assert "snp.microcodeVersion: found 93 (reported_tcb), wanted >= 94" in str(err.value)


def test_a_report_against_a_set_without_snp_fails_closed(report):
    tpm_only = parse_policy(PCR4)
    with pytest.raises(MeasurementsMismatch) as err:
        tpm_only.compare({4: b"\xaa" * 32}, report)
    assert err.value.snp_error.field == "snp" and "an snp policy" in str(err.value)
    tpm_only.compare({4: b"\xaa" * 32})  # without a report: as before


def test_named_sets_match_the_set_whose_snp_passes(report):
    other = sv.matching_policy(report, launchMeasurement="00" * 48)
    sets = parse_policy({"accepted": {"old": {"snp": other}, "new": {"snp": sv.matching_policy(report)}}})
    assert sets.match({}, report)[0] == "new"
    only_old = parse_policy({"accepted": {"old": {"snp": other}, "tpm": PCR4}})
    with pytest.raises(MeasurementsMismatch) as err:
        only_old.match({4: b"\xaa" * 32}, report)
    assert "set old: snp.launchMeasurement: found 5677f1de" in str(err.value)
    assert "set tpm: snp: found an SEV-SNP report" in str(err.value)


def test_every_transform_keeps_snp(report):
    snp = sv.matching_policy(report)
    for doc in (dict(PCR4, snp=snp), {"accepted": {"a": dict(PCR4, snp=snp)}}):
        pol = parse_policy(doc)
        for transformed in (pubapi.fresh_node_policy(pol), pubapi.coordinator_policy(pol),
                            agent_measurement.enforce_agent_pcr(pol, b"\x13" * 32)):
            for measurement_set in transformed.sets.values():
                assert measurement_set.snp == sev_snp.SNPPolicy.from_dict(snp)


def test_an_snp_only_set_enforces_something(report):
    doc = {"snp": sv.matching_policy(report)}
    assert policy.require_enforced_pcr(parse_policy(doc), "inline measurements", "measurements")
    assert policy.load_policy(measurements=doc).snp is not None
    with pytest.raises(InputError, match="enforces at least one PCR"):
        policy.require_enforced_pcr(parse_policy({"4": {"expected": "aa" * 32, "warnOnly": True}}), "x")


def test_a_signed_document_carries_snp(report, tmp_path):
    path = tmp_path / "measurements.json"
    path.write_text(json.dumps({"accepted": {"snp-image": {"snp": sv.matching_policy(report)}}}))
    pub = sign_policy(tmp_path, path)
    loaded = policy.load_policy(measurements_file=str(path), public_key_path=pub)
    assert loaded.match({}, report)[0] == "snp-image"
    doc = json.loads(path.read_text())
    doc["accepted"]["snp-image"]["snp"]["microcodeVersion"] = 0  # a downgrade of the minimum: the signature breaks
    path.write_text(json.dumps(doc))
    with pytest.raises(ConstellationError, match="does not verify"):
        policy.load_policy(measurements_file=str(path), public_key_path=pub)


def test_validation_carries_the_report():
    assert variant.Validation(b"").snp is None
    assert variant.Validation(b"", snp={"product": "Milan"}).snp["product"] == "Milan"


# --- the chooser ------------------------------------------------------------------------------------------------

def make_validator(_policy, trust):
    return trust


def make_issuer(_tcti=None, **_kwargs):
    return None


@pytest.fixture(name="snp_toy")
def fixture_snp_toy():
    spec = choose.register(choose.VariantSpec(variant.Variant("snp-toy", "1.3.9900.77.2"), "a test variant",
                                              __name__, needs_amd_roots=True, quotes_pcrs=False))
    yield spec
    choose.unregister("snp-toy")


def test_variant_flags_default_to_tpm_variants():
    for name in choose.VARIANT_NAMES:
        assert choose.spec(name).quotes_pcrs is True or choose.spec(name).needs_amd_roots


def test_load_trust_pins_amds_roots_unless_a_bundle_is_given(snp_toy, tmp_path):
    trust = choose.load_trust("snp-toy", None)
    assert trust.amd_roots is sev_snp.pinned_roots() and trust.snp_cache is sev_snp.process_cache()
    assert not snp_toy.quotes_pcrs
    lab = sv.make_chain("Milan")
    (tmp_path / "amd").mkdir()
    (tmp_path / "amd" / "ark.pem").write_bytes(lab.roots_pem)
    trust = choose.load_trust("snp-toy", None, basedir=str(tmp_path), amd_roots_path="amd")
    assert trust.amd_roots.roots[0].ark == lab.ark
    with pytest.raises(InputError, match="^amd_roots: expected a readable PEM file"):
        choose.load_trust("snp-toy", None, amd_roots_path=str(tmp_path / "missing.pem"))
    # the validator gets the pinned roots even from a bare Trust
    assert choose.validator("snp-toy", policy=Measurements(), trust=choose.Trust()).amd_roots is sev_snp.pinned_roots()
    # a TPM variant ignores an AMD bundle
    assert choose.load_trust("qemu-vtpm", None, insecure_trust_any_ak=True, amd_roots_path="x").amd_roots is None
