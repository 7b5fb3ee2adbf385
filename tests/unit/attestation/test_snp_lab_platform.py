# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's SEV-SNP platform (lab/snp_platform.py, lab/amd.py) against the verifier (sev_snp.py): the lab's reports
parse and verify to the lab's AMD roots and pass the lab's policy; each tamper is refused for its field; a report
of another AMD, of another chip or altered after signing is refused; the socket service survives bad requests."""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import socket
import struct

import pytest
from cryptography.hazmat.primitives import serialization

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import sev_snp
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import Measurements
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError
from lab import agent, amd, snp, snp_platform
from lab.image import LAB_IMAGE, lab_measurements, launch_measurement
from lab.names import Host

DATA = hashlib.sha512(b"a nonce").digest()
_HOSTS = itertools.count(1)


@pytest.fixture(scope="module")
def lab_state(tmp_path_factory):
    state = tmp_path_factory.mktemp("snplab")
    amd.lab_chain(state).ensure()
    return state


@pytest.fixture
def host(lab_state):
    h = Host("snpl", lab_state, next(_HOSTS))  # a fresh platform (chip) per test
    snp_platform.platform_of(h).state()
    return h


@pytest.fixture(scope="module")
def roots(lab_state):
    return sev_snp.load_roots(str(amd.lab_chain(lab_state).roots_path))


def _report(h, data=DATA):
    raw, table = snp_platform.sign_report(h, data)
    return sev_snp.parse_report(raw), sev_snp.parse_cert_table(table)


def _policy(image=LAB_IMAGE):
    return sev_snp.SNPPolicy.from_dict(snp.lab_snp_policy(image))


def test_a_genuine_report_verifies_to_the_lab_roots_and_passes_the_lab_policy(host, roots):
    report, certs = _report(host)
    assert sorted(certs) == ["ark", "ask", "vcek"]
    verified = sev_snp.verify_report(report, certs["vcek"], b"", roots)
    assert (verified.product, verified.signing_key) == ("Milan", "vcek")
    sev_snp.check_report_data(report, DATA)
    _policy().check(report)
    state = snp_platform.platform_of(host).state()
    fields = report.to_dict()
    assert fields["chip_id"] == state.chip_id and fields["measurement"] == launch_measurement(LAB_IMAGE).hex()
    assert fields["reported_tcb"] == snp_platform.LAB_TCB and fields["policy"]["debug"] is False
    assert (report.version, report.vmpl, report.signing_key) == (3, 0, "vcek")
    # The certificate table's chain is the lab's own AMD, in AMD's profile.
    chain = amd.lab_chain(host.state_dir)
    assert certs["ark"] == chain.cert_der("ark") and certs["ask"] == chain.cert_der("ask")


@pytest.mark.parametrize("version", [2, 3, 5])
def test_every_report_version_the_platform_writes_parses_strictly(host, roots, version):
    snp_platform.platform_of(host).update(version=version)
    report, certs = _report(host)
    assert report.version == version
    sev_snp.verify_report(report, certs["vcek"], b"", roots)


def test_the_lab_report_is_refused_by_amds_pinned_roots(host):
    report, certs = _report(host)
    with pytest.raises(sev_snp.SNPError):
        sev_snp.verify_report(report, certs["vcek"], b"")


@pytest.mark.parametrize("what, field", [("debug", "snp.allowDebug"), ("measurement", "snp.launchMeasurement"),
                                         ("tcb", "snp.microcodeVersion")])
def test_each_tamper_is_genuinely_signed_and_refused_by_the_policy_for_its_field(host, roots, what, field):
    snp.tamper(host, what)
    report, certs = _report(host)
    sev_snp.verify_report(report, certs["vcek"], b"", roots)  # AMD signed it: only the policy can refuse it
    with pytest.raises(sev_snp.SNPError) as err:
        _policy().check(report)
    assert err.value.field == field
    snp.tamper(host, "genuine")
    report, certs = _report(host)
    sev_snp.verify_report(report, certs["vcek"], b"", roots)
    _policy().check(report)


def test_a_downgraded_platform_has_a_genuine_vcek_for_its_own_tcb(host, roots):
    snp.tamper(host, "tcb")
    report, certs = _report(host)
    assert report.reported_tcb.to_dict() == snp_platform.DOWNGRADED_TCB
    verified = sev_snp.verify_report(report, certs["vcek"], b"", roots)
    assert verified.signing_key == "vcek"


def test_a_report_signed_under_a_foreign_ark_is_refused(host, roots):
    snp.tamper(host, "foreign")
    report, certs = _report(host)
    foreign = amd.foreign_chain(host.state_dir)
    assert foreign.cert("ark").subject == amd.lab_chain(host.state_dir).cert("ark").subject  # same names
    pem = b"".join(foreign.cert(name).public_bytes(serialization.Encoding.PEM) for name in ("ask", "ark"))
    for chain in (b"", pem):
        with pytest.raises(sev_snp.SNPError):
            sev_snp.verify_report(report, certs["vcek"], chain, roots)
    # The foreign AMD's own roots would accept it: the refusal is the pin, not a malformed report.
    sev_snp.verify_report(report, certs["vcek"], b"", sev_snp.load_roots(str(foreign.roots_path)))


def test_another_chips_vcek_and_an_altered_report_are_refused(lab_state, roots):
    one, two = Host("snpl", lab_state, 20001), Host("snpl", lab_state, 20002)
    report, _certs = _report(one)
    _other, other_certs = _report(two)
    with pytest.raises(sev_snp.SNPError) as err:
        sev_snp.verify_report(report, other_certs["vcek"], b"", roots)
    assert err.value.field == "vcek.hwID"
    raw, table = snp_platform.sign_report(one, DATA)
    altered = bytearray(raw)
    altered[0x90] ^= 1  # the measurement, signature kept
    with pytest.raises(sev_snp.SNPError) as err:
        sev_snp.verify_report(sev_snp.parse_report(bytes(altered)), sev_snp.parse_cert_table(table)["vcek"], b"",
                              roots)
    assert err.value.field == "signature"


def test_a_vlek_platform_signs_with_a_vlek_under_the_asvk(lab_state, roots):
    h = Host("snpl", lab_state, 20003)
    snp_platform.platform_of(h).state(signing_key="vlek")
    report, certs = _report(h)
    assert sorted(certs) == ["ark", "ask", "vlek"]
    verified = sev_snp.verify_report(report, certs["vlek"], b"", roots)
    assert (verified.signing_key, report.signing_key) == ("vlek", "vlek")


def test_hcl_report_binds_the_runtime_data(host, roots):
    runtime = json.dumps({"keys": [{"kid": "HCLAkPub", "kty": "RSA"}]}).encode()
    hcl = snp_platform.hcl_report(host, runtime)
    signature, version, size, request_type, status = struct.unpack_from("<IIIII", hcl, 0)
    assert (hcl[:4], version, size, request_type, status) == (b"HCLA", 2, len(hcl), 2, 0)
    report = sev_snp.parse_report(hcl[32:32 + sev_snp.REPORT_SIZE])
    sev_snp.check_report_data(report, hashlib.sha256(runtime).digest())
    data_size, _version, report_type, hash_type, runtime_size = struct.unpack_from("<IIIII", hcl, 1216)
    assert (report_type, hash_type, runtime_size, data_size) == (2, 1, len(runtime), 20 + len(runtime))
    assert hcl[1236:] == runtime and signature == 0x414C4348


def _ask(path, payload: bytes) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(path))
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        return json.loads(sock.makefile("rb").readline())


def test_the_socket_service_answers_and_survives_bad_requests(host, roots, tmp_path):
    path = tmp_path / "snp-platform.sock"
    server = snp_platform.serve(path, snp_platform.platform_of(host))
    try:
        bad = [b"not json\n", b"[1]\n", b'{"report_data": "00"}\n', b'{"report_data": "zz' + b"0" * 126 + b'"}\n',
               b'{"report_data": "%s", "more": 1}\n' % (b"0" * 128), b"x" * 10000 + b"\n", b"\xff\xfe\n", b""]
        for payload in bad:
            reply = _ask(path, payload)
            assert set(reply) == {"error"}, (payload[:40], reply)
        reply = _ask(path, json.dumps({"report_data": DATA.hex()}).encode() + b"\n")
        report = sev_snp.parse_report(base64.b64decode(reply["report"]))
        certs = sev_snp.parse_cert_table(base64.b64decode(reply["certs"]))
        sev_snp.verify_report(report, certs["vcek"], b"", roots)
        sev_snp.check_report_data(report, DATA)
        raw, _table = snp_platform.request(path, DATA)  # the client the lab tools use
        assert sev_snp.parse_report(raw).report_data == DATA
    finally:
        server.shutdown()
        server.server_close()


def test_lab_prove_checks_each_hosts_platform_over_a_fresh_nonce(host, roots):
    platform = snp_platform.platform_of(host)
    server = snp_platform.serve(platform.socket_path, platform)
    try:
        row = snp.prove(host, LAB_IMAGE, roots)
        assert row["ok"] and row["tcb"] == snp_platform.LAB_TCB, row
        snp.tamper(host, "debug")
        row = snp.prove(host, LAB_IMAGE, roots)
        assert not row["ok"] and "snp.allowDebug" in row["error"]
        snp.tamper(host, "genuine")
        assert not snp.prove(host, "another-image", roots)["ok"]  # the image's measurement, not the host's
    finally:
        server.shutdown()
        server.server_close()


def test_the_measurements_document_and_agent_config_of_an_snp_lab(host, monkeypatch, tmp_path):
    assert snp.measurements(LAB_IMAGE, "qemu-vtpm-ek") == lab_measurements(LAB_IMAGE)
    monkeypatch.setattr(snp, "uses_snp", lambda variant: variant.endswith("sev-snp"))
    monkeypatch.setattr(snp, "quotes_pcrs", lambda variant: variant != "sev-snp")
    plain, azure = snp.measurements(LAB_IMAGE, "sev-snp"), snp.measurements(LAB_IMAGE, "azure-sev-snp")
    assert set(plain) == {"snp"} and set(azure) == set(lab_measurements(LAB_IMAGE)) | {"snp"}
    assert sev_snp.SNPPolicy.from_dict(plain["snp"]).allow_debug is False
    for doc in (plain, azure):  # documents the Core reads, a report of the lab's platform passing them
        policy = Measurements.from_dict(doc)
        assert policy.snp == sev_snp.SNPPolicy.from_dict(snp.lab_snp_policy(LAB_IMAGE))
        assert set(policy.to_dict()) == set(doc)
    report, _certs = _report(host)
    Measurements.from_dict(plain).compare({}, snp_report=report)
    snp.tamper(host, "measurement")
    with pytest.raises(AttestationError, match="snp.launchMeasurement"):
        Measurements.from_dict(plain).compare({}, snp_report=_report(host)[0])

    class StubLab:  # what lab/agent.py needs of its lab (AgentLab)
        variant = "sev-snp"
        trusted_agents = False
        measurements_pub_path = tmp_path / "measurements.pub"
        ek_ca_path = tmp_path / "none.pem"
        amd_roots_path = amd.lab_chain(host.state_dir).roots_path

        def sign_measurements(self, path):
            (tmp_path / "signed").write_text(str(path))

        def agent_store(self, h):
            return None

        def agent_etcd_member(self, h):
            return None

    config = json.loads(agent.write_config(StubLab(), host).read_text())
    assert config["amd_roots"] == str(amd.lab_chain(host.state_dir).roots_path)
    assert config["snp_report_source"] == "unix:%s" % (host.dir / "snp-platform.sock")
    assert json.loads((host.dir / "agent" / "measurements.json").read_text()) == plain
