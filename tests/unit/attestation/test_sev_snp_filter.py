# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The sev_snp_report filter, called as Jinja calls it: real reports verify and return their fields; every refusal
is an AnsibleFilterError naming the field, what was found and what was wanted."""

from __future__ import annotations

import base64
import datetime

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.constellation.cluster.plugins.filter.sev_snp import FilterModule
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import sev_snp
from ansible_collections.constellation.cluster.tests.support import sev_snp_vectors as sv

sev_snp_report = FilterModule().filters()["sev_snp_report"]
AWS = sv.vector("aws")
AWS_NOW = "2025-06-01T00:00:00Z"


def test_a_real_report_verifies_as_base64_and_hex():
    for text in (base64.b64encode(AWS.report).decode(), AWS.report.hex(), sv.read("constellation-aws/report.txt").decode()):
        fields = sev_snp_report(text, signer=AWS.signer.decode(), chain=AWS.chain.decode(), now=AWS_NOW)
        assert fields["product"] == "Milan" and fields["signing_key"] == "vlek"
        assert fields["reported_tcb"] == {"bootloader": 4, "tee": 0, "snp": 24, "microcode": 217}
        assert fields["measurement"].startswith("5a5cdbad8f540ce4")


def test_policy_and_refusals_name_the_field():
    measurement = sev_snp_report(AWS.report.hex(), signer=AWS.signer, now=AWS_NOW)["measurement"]
    policy = {"launchMeasurement": measurement, "microcodeVersion": 217}
    assert sev_snp_report(AWS.report.hex(), signer=AWS.signer, now=AWS_NOW, policy=policy)["version"] == 3
    cases = [
        (dict(policy=dict(policy, microcodeVersion=218)),
         "sev_snp_report: snp.microcodeVersion: found 217 (reported_tcb), wanted >= 218"),
        (dict(policy={"launchMeasurement": "00" * 48}), "sev_snp_report: snp.launchMeasurement: found 5a5cdbad"),
        (dict(policy={"microcodeVersion": 1}), "sev_snp_report: snp.launchMeasurement: expected"),
        (dict(now="2026-01-01T00:00:00Z"), "sev_snp_report: vlek.validity: found 2026-01-01T00:00:00Z outside"),
        (dict(now="next tuesday"), "sev_snp_report: now: found 'next tuesday', wanted an ISO 8601 time"),
        (dict(signer=sv.vector("azure").signer), "sev_snp_report: vlek.cspID: found a VCEK's hwID"),
        (dict(signer=None), "sev_snp_report: signer: found nothing"),
    ]
    for kwargs, message in cases:
        call = dict(signer=AWS.signer, now=AWS_NOW)
        call.update(kwargs)
        with pytest.raises(AnsibleFilterError) as err:
            sev_snp_report(AWS.report.hex(), **call)
        assert str(err.value).startswith(message), str(err.value)
    tampered = bytearray(AWS.report)
    tampered[0x90] ^= 1
    with pytest.raises(AnsibleFilterError, match="^sev_snp_report: signature: found a signature that does not verify"):
        sev_snp_report(bytes(tampered).hex(), signer=AWS.signer, now=AWS_NOW)
    with pytest.raises(AnsibleFilterError, match="^sev_snp_report: report: found 10 bytes, wanted 1184 bytes"):
        sev_snp_report(base64.b64encode(bytes(10)).decode(), signer=AWS.signer, now=AWS_NOW)
    with pytest.raises(AnsibleFilterError, match="^sev_snp_report: report: found text that is neither"):
        sev_snp_report("not a report!", signer=AWS.signer, now=AWS_NOW)


def test_lab_roots_and_naive_now():
    chain = sv.make_chain("Milan")
    report = sv.put_u32(AWS.report, 0x48, 0)
    parsed = sev_snp.parse_report(report)
    key, vcek = chain.vcek(parsed.chip_id, parsed.reported_tcb)
    signed = sv.sign(report, key)
    with pytest.raises(AnsibleFilterError, match="^sev_snp_report: vcek.signature: "):
        sev_snp_report(signed.hex(), signer=vcek.decode())
    fields = sev_snp_report(signed.hex(), signer=vcek.decode(), amd_roots=chain.roots_pem.decode(),
                            now=datetime.datetime(2025, 1, 1))
    assert fields["signing_key"] == "vcek"


def test_documentation_is_yaml():
    with open(sev_snp_report.__code__.co_filename.replace("sev_snp.py", "sev_snp_report.yml"), encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    assert doc["DOCUMENTATION"]["name"] == "sev_snp_report"
    assert set(doc["DOCUMENTATION"]["options"]) == {"_input", "signer", "chain", "policy", "now", "amd_roots"}
