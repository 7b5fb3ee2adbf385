# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""azure-sev-snp and aws-sev-snp end to end: a real swtpm quotes, the lab's SEV-SNP platform (lab/snp_platform.py,
the lab's AMD) signs the report, the issuers build Constellation's document, the validators check it all; attacks
(an HCL report binding another AK, a report over another AK's digest, another AMD) refused naming why."""

from __future__ import annotations

import base64
import hashlib
import http.server
import itertools
import json
import os
import threading

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose, sev_snp
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.aws_snp import AWSSNPIssuer, AWSSNPValidator
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.azure_snp import (
    AZURE_AK_HANDLE,
    AzureSNPIssuer,
    AzureSNPValidator,
)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.ek import ek_pub_sha256
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import Measurements
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.tpm import TPM, read_pcrs
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import ak_template, parse_ak
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError
from lab import amd
from lab.azure_hcl import provision
from lab.snp import lab_snp_policy
from lab.snp_platform import SNPPlatform, serve
from lab.swtpm import free_port

NONCE = bytes(range(32))
_HOSTS = itertools.count(1)


@pytest.fixture(scope="module")
def lab_amd(tmp_path_factory):
    """The lab's AMD, made once for this module: (its state folder, its roots as a verifier pins them)."""
    state = tmp_path_factory.mktemp("snpcloud")
    return state, sev_snp.load_roots(str(amd.lab_chain(state).ensure().roots_path))


@pytest.fixture
def lab_state(lab_amd):
    return lab_amd[0]


@pytest.fixture
def roots(lab_amd):
    return lab_amd[1]


def platform(lab_state, tmp_path, signing_key="vcek") -> SNPPlatform:
    """A fresh lab platform (a chip of its own) signing with ``signing_key``."""
    made = SNPPlatform(tmp_path / ("host%d" % next(_HOSTS)), lab_state)
    made.state(signing_key=signing_key)
    return made


def policy(tcti, indices=(0, 4, 9)) -> Measurements:
    pcrs = read_pcrs(tcti)
    doc = {str(i): pcrs[i].hex() for i in indices}
    doc["snp"] = lab_snp_policy()
    return Measurements.from_dict(doc)


# -------------------------------------------------------------------------------------------------- Azure


def test_azure_document_from_the_hcl_report_validates(fresh_swtpm_ek, lab_state, roots, tmp_path):
    host = platform(lab_state, tmp_path)
    tcti = fresh_swtpm_ek.tcti
    provision(tcti, host, tmp_path / "certs")
    with AzureSNPIssuer(tcti, event_log_path=None, amd_cert_cache=str(tmp_path / "certs")) as issuer:
        document = issuer.issue(b"spki-hash", NONCE)
        with TPM(tcti) as tpm:
            public, _name, _qname = tpm.esapi.read_public(tpm.esapi.tr_from_tpmpublic(AZURE_AK_HANDLE))
        assert issuer.ak_pub == public.publicArea.marshal()  # the HCL's AK, not one of ours
    info = json.loads(base64.b64decode(json.loads(document)["InstanceInfo"]))
    assert list(info) == ["ReportSigner", "CertChain", "AttestationReport", "Azure", "GCP"]
    result = AzureSNPValidator(policy(tcti), roots=roots).validate(document, NONCE)
    assert result.user_data == b"spki-hash" and all(check.ok for check in result.checks)
    assert result.snp["measurement"] == host.state().measurement and result.snp["signing_key"] == "vcek"
    with TPM(tcti) as tpm:
        ek_cert = tpm.nv_read(0x01C00002)
    assert result.ek_pub_sha256 == ek_pub_sha256(ek_cert)  # HCLEkPub: who this TPM is, for the join's admission


def test_azure_chooser_round_trip(fresh_swtpm_ek, lab_state, tmp_path):
    """The chooser builds both sides; the lab's AMD roots come through load_trust's amd_roots_path."""
    host = platform(lab_state, tmp_path)
    tcti = fresh_swtpm_ek.tcti
    provision(tcti, host, tmp_path / "certs")
    trust = choose.load_trust("azure-sev-snp", None, amd_roots_path=str(amd.lab_chain(lab_state).roots_path))
    issuer = choose.issuer("azure-sev-snp", tcti, event_log_path=None, ak_alg="ecc", snp_report_source=None,
                           amd_cert_cache=str(tmp_path / "certs"))
    try:
        document = issuer.issue(b"u", NONCE)
    finally:
        issuer.close()
    assert choose.validator("azure-sev-snp", policy(tcti), trust).validate(document, NONCE).user_data == b"u"
    # AMD's pinned roots do not know the lab's AMD
    with pytest.raises(AttestationError, match="ark: found ARK-Milan .*wanted one of the pinned AMD roots"):
        choose.validator("azure-sev-snp", policy(tcti), choose.load_trust("azure-sev-snp", None)).validate(
            document, NONCE)


def test_a_set_pinning_its_own_amd_root(fresh_swtpm_ek, lab_state, tmp_path):
    """A set's amdRootKey pins the root its reports chain to, instead of AMD's pinned ones (validator roots unset)."""
    host = platform(lab_state, tmp_path)
    tcti = fresh_swtpm_ek.tcti
    provision(tcti, host, tmp_path / "certs")
    with AzureSNPIssuer(tcti, event_log_path=None, amd_cert_cache=str(tmp_path / "certs")) as issuer:
        document = issuer.issue(b"u", NONCE)
    pinned = policy(tcti)
    doc = pinned.to_dict()
    doc["snp"]["amdRootKey"] = amd.lab_chain(lab_state).ark_path.read_text()
    assert AzureSNPValidator(Measurements.from_dict(doc)).validate(document, NONCE).snp["product"] == "Milan"


def test_an_hcl_report_binding_another_ak_is_refused(fresh_swtpm_ek, lab_state, roots, tmp_path):
    """The platform's genuine report over runtime data that names a key the vTPM does not hold: the quote's AK is
    not the one the report vouches for."""
    host = platform(lab_state, tmp_path)
    tcti = fresh_swtpm_ek.tcti
    other = ak_template("rsa")
    other.unique.rsa = rsa.generate_private_key(65537, 2048).public_key().public_numbers().n.to_bytes(256, "big")
    provision(tcti, host, tmp_path / "certs", ak_pub=other.marshal())
    with AzureSNPIssuer(tcti, event_log_path=None, amd_cert_cache=str(tmp_path / "certs")) as issuer:
        provision_ak = issuer.ak_pub
        document = issuer.issue(b"u", NONCE)
    assert parse_ak(provision_ak).public_key.public_numbers() != parse_ak(other.marshal()).public_key.public_numbers()
    with pytest.raises(AttestationError, match="AK is not bound: the quoting AK is not the runtime data's HCLAkPub"):
        AzureSNPValidator(policy(tcti), roots=roots).validate(document, NONCE)


def test_an_hcl_report_of_another_amd_is_refused(fresh_swtpm_ek, lab_state, roots, tmp_path):
    host = platform(lab_state, tmp_path)
    host.tamper("foreign")  # a report signed in software: its VCEK chains to an ARK nobody pinned
    tcti = fresh_swtpm_ek.tcti
    provision(tcti, host, tmp_path / "certs")
    with AzureSNPIssuer(tcti, event_log_path=None, amd_cert_cache=str(tmp_path / "certs")) as issuer:
        document = issuer.issue(b"u", NONCE)
    with pytest.raises(AttestationError, match="ark: found ARK-Milan"):
        AzureSNPValidator(policy(tcti), roots=roots).validate(document, NONCE)


def test_the_azure_issuer_never_makes_its_own_ak(fresh_swtpm, tmp_path):
    with AzureSNPIssuer(fresh_swtpm.tcti, event_log_path=None, amd_cert_cache=str(tmp_path)) as issuer:
        with pytest.raises(AttestationError, match="no AK at the vTPM's persistent handle 0x81000003"):
            issuer.issue(b"u", NONCE)


def test_a_changed_pcr_is_still_refused(fresh_swtpm_ek, lab_state, roots, tmp_path):
    """The report vouches for the AK; the PCRs the AK quotes are checked as for any vTPM variant."""
    host = platform(lab_state, tmp_path)
    tcti = fresh_swtpm_ek.tcti
    provision(tcti, host, tmp_path / "certs")
    expected = policy(tcti)
    with TPM(tcti) as tpm:
        tpm.pcr_extend(9, hashlib.sha256(b"another kernel").digest())
    with AzureSNPIssuer(tcti, event_log_path=None, amd_cert_cache=str(tmp_path / "certs")) as issuer:
        document = issuer.issue(b"u", NONCE)
    with pytest.raises(AttestationError, match="PCR 9"):
        AzureSNPValidator(expected, roots=roots).validate(document, NONCE)


# ---------------------------------------------------------------------------------------------------- AWS


def test_aws_document_over_the_platform_socket_validates(fresh_swtpm, lab_state, roots, tmp_path):
    """The report comes through snp_report_source (the lab platform's unix socket) with a VLEK."""
    host = platform(lab_state, tmp_path, "vlek")
    server = serve(tmp_path / "platform.sock", host)
    try:
        with AWSSNPIssuer(fresh_swtpm.tcti, event_log_path=None,
                          snp_report_source="unix:%s" % (tmp_path / "platform.sock")) as issuer:
            document = issuer.issue(b"spki-hash", NONCE)
    finally:
        server.shutdown()
        server.server_close()
    result = AWSSNPValidator(policy(fresh_swtpm.tcti), roots=roots).validate(document, NONCE)
    assert result.user_data == b"spki-hash" and result.snp["signing_key"] == "vlek"
    assert result.ek_pub_sha256 is None  # AWS names no EK


def test_aws_report_over_another_ak_is_refused(fresh_swtpm, lab_state, roots, tmp_path):
    host = platform(lab_state, tmp_path, "vlek")
    other = os.urandom(64)
    with AWSSNPIssuer(fresh_swtpm.tcti, event_log_path=None,
                      report_source=lambda _data: host.sign_report(other)) as issuer:
        document = issuer.issue(b"u", NONCE)
    with pytest.raises(AttestationError, match="AK is not bound: report_data: found %s" % other.hex()):
        AWSSNPValidator(policy(fresh_swtpm.tcti), roots=roots).validate(document, NONCE)


def test_aws_issuer_needs_a_vlek(fresh_swtpm, lab_state, tmp_path):
    host = platform(lab_state, tmp_path, "vcek")
    with AWSSNPIssuer(fresh_swtpm.tcti, event_log_path=None, report_source=host.sign_report) as issuer:
        with pytest.raises(AttestationError, match="certificate table has no VLEK"):
            issuer.issue(b"u", NONCE)


def test_a_document_replayed_for_another_nonce_is_refused(fresh_swtpm, lab_state, roots, tmp_path):
    """The report is the same for every document of an AK: freshness is the quote's (TPM nonce)."""
    host = platform(lab_state, tmp_path, "vlek")
    with AWSSNPIssuer(fresh_swtpm.tcti, event_log_path=None, report_source=host.sign_report) as issuer:
        document = issuer.issue(b"u", NONCE)
    with pytest.raises(AttestationError, match="extraData"):
        AWSSNPValidator(policy(fresh_swtpm.tcti), roots=roots).validate(document, bytes(32))


def test_the_azure_issuer_asks_thim_when_the_cache_lacks_the_vcek(fresh_swtpm_ek, lab_state, roots, tmp_path):
    """Azure's THIM (IMDS) stands behind the cache folder: here a loopback server that answers as THIM does."""
    host = platform(lab_state, tmp_path)
    tcti = fresh_swtpm_ek.tcti
    provision(tcti, host, tmp_path / "certs")
    vcek = next((tmp_path / "certs" / "Milan").glob("vcek-*.pem")).read_text()
    answer = json.dumps({"vcekCert": vcek, "tcbm": "", "certificateChain": (tmp_path / "certs" / "Milan" /
                                                                            "cert_chain.pem").read_text()}).encode()
    asked = []

    class THIM(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            asked.append(self.headers.get("Metadata"))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), THIM)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = "http://127.0.0.1:%d/metadata/THIM/amd/certification" % server.server_port
        with AzureSNPIssuer(tcti, event_log_path=None, amd_cert_cache=str(tmp_path / "empty"), thim_url=url) as issuer:
            document = issuer.issue(b"u", NONCE)
        with AzureSNPIssuer(tcti, event_log_path=None, amd_cert_cache=str(tmp_path / "empty"),
                            thim_url="http://127.0.0.1:%d/none" % free_port()) as issuer:
            with pytest.raises(AttestationError, match="not in the report's certificates.*and Azure's THIM: THIM at"):
                issuer.issue(b"u", NONCE)
    finally:
        server.shutdown()
        server.server_close()
    assert asked == ["true"]
    assert AzureSNPValidator(policy(tcti), roots=roots).validate(document, NONCE).user_data == b"u"
