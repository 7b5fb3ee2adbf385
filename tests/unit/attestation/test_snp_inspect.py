# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading an SEV-SNP host's report to write its policy (docs/attestation.md, "Reading a host's report"):
snp_inspect on the lab's platform and on a real report, and attestation_info run as Ansible runs it on an SNP
host (no TPM: sev-snp quotes no PCRs). A report nobody genuine signed gives no fields to copy. And the sev-snp
issuer on a host that sends no certificates with the report takes them from amd_cert_cache."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import sev_snp, snp_inspect
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.amd_certs import CertCache, tcb_name
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import Measurements
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.snp import (
    SNPIssuer,
    SNPValidator,
    make_issuer,
)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError
from ansible_collections.constellation.cluster.tests.support import sev_snp_vectors as snp_vectors
from lab import snp_platform
from lab.amd import lab_chain
from lab.azure_hcl import write_cert_cache
from lab.snp import lab_snp_policy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class _Source:
    """The lab's platform as an issuer's report source, in process."""

    def __init__(self, platform):
        self.platform = platform

    def get(self, report_data):
        return self.platform.sign_report(report_data)


@pytest.fixture(name="platform", scope="module")
def fixture_platform(tmp_path_factory):
    base = tmp_path_factory.mktemp("snp-inspect")
    platform = snp_platform.SNPPlatform(base / "host", base / "lab")
    platform.state()
    return platform


def _roots(platform):
    return sev_snp.load_roots(str(lab_chain(platform.lab_state).ensure().roots_path))


def _document(platform, nonce=b"\x01" * 32):
    return SNPIssuer(_Source(platform)).issue(b"VerifyService", nonce)


def test_the_labs_report_gives_its_fields_and_a_policy_it_passes(platform):
    state = platform.restore()
    result = snp_inspect.inspect(_document(platform), roots=_roots(platform))
    assert result["measurement"] == state.measurement and result["chip_id"] == state.chip_id
    assert result["signing_key"] == "vcek" and result["reported_tcb"]["microcode"] == state.reported_tcb["microcode"]
    policy = result["snp_policy"]
    assert policy["launchMeasurement"] == state.measurement
    assert policy["microcodeVersion"] == state.reported_tcb["microcode"]
    assert policy["allowDebug"] is False and policy["allowMigrationAgent"] is False
    sev_snp.SNPPolicy.from_dict(policy).check(sev_snp.parse_report(_report_of(_document(platform))))


def test_a_debug_guests_fields_come_with_a_policy_that_refuses_it(platform):
    document = _document_debug(platform)
    result = snp_inspect.inspect(document, roots=_roots(platform))
    assert result["policy"]["debug"] is True  # the guest's policy, as the report says
    assert result["snp_policy"]["allowDebug"] is False
    with pytest.raises(sev_snp.SNPError, match="debug"):
        sev_snp.SNPPolicy.from_dict(result["snp_policy"]).check(sev_snp.parse_report(_report_of(document)))


def _document_debug(platform):
    platform.tamper("debug")
    try:
        return _document(platform)
    finally:
        platform.restore()


def _report_of(document):
    info = json.loads(base64.b64decode(json.loads(document)["InstanceInfo"]))
    return base64.b64decode(info["AttestationReport"])


def test_a_software_signed_report_gives_no_fields(platform):
    platform.tamper("foreign")
    try:
        document = _document(platform)
    finally:
        platform.restore()
    with pytest.raises(sev_snp.SNPError):
        snp_inspect.inspect(document, roots=_roots(platform))


def test_a_report_without_certificates_takes_them_from_the_cache(tmp_path):
    vector = snp_vectors.vector("go-sev-guest")
    report = sev_snp.parse_report(vector.report)
    info = {"AttestationReport": base64.b64encode(vector.report).decode(), "ReportSigner": None, "CertChain": None}
    document = json.dumps({"InstanceInfo": base64.b64encode(json.dumps(info).encode()).decode()}).encode()
    with pytest.raises(AttestationError, match="ReportSigner is empty.*amd_cert_cache"):
        snp_inspect.inspect(document, now=vector.now)
    (tmp_path / "Milan").mkdir()
    (tmp_path / "Milan" / "cert_chain.pem").write_bytes(vector.chain)
    (tmp_path / "Milan" / ("vcek-%s-%s.der" % (report.chip_id.hex(), tcb_name(report.reported_tcb, "Milan")))) \
        .write_bytes(vector.signer)
    result = snp_inspect.inspect(document, cache=CertCache(str(tmp_path)), now=vector.now)
    assert result["product"] == "Milan" and result["measurement"] == report.measurement.hex()
    assert result["snp_policy"]["launchMeasurement"] == report.measurement.hex()


@pytest.mark.parametrize("document,message", [
    (b"[]", r"document: expected a JSON object, got list"),
    (b'{"Attestation": {}}', r"document: expected an InstanceInfo"),
    (json.dumps({"InstanceInfo": "!!"}).encode(), r"document.InstanceInfo: expected base64 text"),
    (json.dumps({"InstanceInfo": base64.b64encode(b'{"AttestationReport": "AAAA"}').decode()}).encode(),
     r"InstanceInfo.AttestationReport: expected 1184 bytes, got 3"),
])
def test_a_document_that_is_no_snp_document_is_refused_naming_the_part(document, message):
    with pytest.raises(AttestationError, match=message):
        snp_inspect.inspect(document)


def test_attestation_info_on_an_snp_host_returns_the_report_and_its_policy(platform, tmp_path):
    state = platform.restore()
    server = snp_platform.serve(tmp_path / "platform.sock", platform)
    try:
        args = {"ANSIBLE_MODULE_ARGS": {
            "variant": "sev-snp", "nonce": "ab" * 32, "user_data": "VerifyService",
            "snp_report_source": "unix:%s" % (tmp_path / "platform.sock"),
            "amd_roots": [str(lab_chain(platform.lab_state).roots_path)],
            "tcti": "swtpm:host=127.0.0.1,port=1"}}  # never opened: sev-snp reads no PCRs
        (tmp_path / "args.json").write_text(json.dumps(args))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "collections"), ROOT]))
        proc = subprocess.run([sys.executable, "-m", "ansible_collections.constellation.cluster.plugins.modules."
                               "attestation_info", str(tmp_path / "args.json")], capture_output=True, text=True,
                              env=env, cwd=str(tmp_path), timeout=120, check=False)
    finally:
        server.shutdown()
        server.server_close()
    result = json.loads(proc.stdout)
    assert not result.get("failed"), result
    assert result["pcrs"] == {} and result["variant"] == "sev-snp"
    assert result["snp"]["measurement"] == state.measurement
    assert result["snp"]["snp_policy"]["launchMeasurement"] == state.measurement


class _NoCertificates(_Source):
    """A host that hands out the report without its certificate table (no certificates loaded by the hypervisor)."""

    def get(self, report_data):
        return self.platform.sign_report(report_data)[0], b""


def test_sev_snps_issuer_takes_certificates_the_platform_did_not_send_from_amd_cert_cache(platform, tmp_path):
    state = platform.restore()
    policy = Measurements.from_dict({"snp": lab_snp_policy()})
    validator = SNPValidator(policy, roots=_roots(platform))
    bare = SNPIssuer(_NoCertificates(platform)).issue(b"u", b"\x02" * 32)
    with pytest.raises(AttestationError, match="ReportSigner is empty"):
        validator.validate(bare, b"\x02" * 32)
    write_cert_cache(platform, tmp_path / "certs")
    issuer = make_issuer(snp_report_source=None, amd_cert_cache=str(tmp_path / "certs"))
    issuer.source = _NoCertificates(platform)
    result = validator.validate(issuer.issue(b"u", b"\x02" * 32), b"\x02" * 32)
    assert result.snp["chip_id"] == state.chip_id and result.snp["signing_key"] == "vcek"
