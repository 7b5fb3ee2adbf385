# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``sev-snp`` variant end to end on a lab whose hosts are SEV-SNP guests without a vTPM (the lab's platform
signs each host's reports with a VCEK of the lab's AMD, lab/snp_platform.py): site.yml activates the cluster, a
second run changes nothing, verify.yml passes and every peer's attestation shows its TCB and launch measurement.
A modified guest or a downgraded platform (``lab tamper --snp debug|tcb|measurement``) is refused naming the
field, by the controller and by the Coordinator, with no secret sent and no healthy peer evicted; a
software-signed report (a VCEK of another AMD) gets no activation.
h1 Coordinator, h2 Node; h3 and h4 stay outside the cluster (the tampered ones)."""

from __future__ import annotations

import contextlib

import pytest

from lab.lab import Lab
from lab.snp_platform import SNPPlatform
from tests.support.playbook import LabPlaybooks
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError
from ansible_collections.constellation.cluster.plugins.plugin_utils.controller import open_peer, peer_report

pytestmark = pytest.mark.lab

CLUSTER = "!h3:!h4"
TAMPERS = (("debug", "snp.allowDebug"), ("tcb", "snp.microcodeVersion"), ("measurement", "snp.launchMeasurement"))


@pytest.fixture(scope="module")
def snpp(tmp_path_factory):
    inv = tmp_path_factory.mktemp("snpp-inventory")
    lab = Lab("snpp", inventory_dir=inv)
    lab.up(hosts=4, tpm=True, agents=True, variant="sev-snp")
    try:
        yield LabPlaybooks(lab, inv)
    finally:
        lab.down()


def _platform(site, name):
    host = site.lab.host(name)
    return SNPPlatform(host.dir, host.state_dir).state()


def _report(site, name):
    return peer_report(site.lab.host(name).public_endpoint, site.attestation_settings(), None, site.admin_key())


def test_site_activates_the_cluster_and_a_second_run_changes_nothing(snpp):
    first = snpp.play("site.yml", "--limit", CLUSTER)
    assert first.ok, first.stdout[-4000:]
    assert first.recap()["h1"]["changed"] >= 1  # the activation (it writes the master secret and salt)
    second = snpp.play("site.yml", "--limit", CLUSTER)
    assert second.ok, second.stdout[-4000:]
    assert {host: row["changed"] for host, row in second.recap().items()} == {"h1": 0, "h2": 0}
    for name, state in (("h1", "ActivatingNodes"), ("h2", "IsNode")):
        report = _report(snpp, name)
        # No PCR is quoted: the attested agent answered for its membership (it accepted the admin's key).
        assert (report.state, report.membership, report.pcrs, report.pcr15) == (state, "ours", [], "")


def test_verify_passes_and_each_peer_shows_its_tcb_and_launch_measurement(snpp):
    run = snpp.play("playbooks/verify.yml", "--limit", CLUSTER)
    assert run.ok, run.stdout[-4000:]
    for name in ("h1", "h2"):
        platform = _platform(snpp, name)
        with open_peer(snpp.lab.host(name).public_endpoint, snpp.attestation_settings()) as client:
            snp = client.attested.validation.snp
        assert snp["measurement"] == platform.measurement
        assert snp["reported_tcb"] == dict(platform.reported_tcb)
        assert snp["chip_id"] == platform.chip_id and snp["signing_key"] == "vcek"
        if "launch" in run.stdout.lower():  # verify.yml's SEV-SNP columns (tcb, launch), where the table has them
            assert platform.measurement[:16] in run.stdout
            assert "b%(bootloader)d.t%(tee)d.s%(snp)d.m%(microcode)d" % platform.reported_tcb in run.stdout


def _activate(site, name):
    """The Coordinator asked to activate ``name`` (as activate_nodes does): its row."""
    with open_peer(site.lab.host("h1").public_endpoint, site.attestation_settings()) as client:
        client.admin_auth(site.admin_key())
        result = client.activate_additional_nodes([site.lab.host(name).public_endpoint])
    return result["nodes"][0]


@contextlib.contextmanager
def _tampered(site, name, what):
    """``lab tamper NAME --snp WHAT`` for the block, then the genuine platform again; after it, ``name`` holds
    nothing of the cluster (no secret reached it) and nobody was evicted."""
    site.lab.tamper_snp(name, what)
    try:
        yield
    finally:
        site.lab.tamper_snp(name, "genuine")
    report = _report(site, name)
    assert (report.state, report.membership) == ("AcceptingInit", "fresh"), name
    coordinator = _report(site, "h1")
    assert coordinator.evicted == [] and coordinator.membership == "ours"
    assert _report(site, "h2").state == "IsNode"


@pytest.mark.parametrize("tamper,field", TAMPERS)
def test_a_tampered_guest_or_platform_is_refused_naming_the_field(snpp, tamper, field):
    with _tampered(snpp, "h3", tamper):
        with pytest.raises(AttestationError, match=field.replace(".", r"\.")):
            _report(snpp, "h3")
        row = _activate(snpp, "h3")
        assert not row["ok"] and field in row["error"], row


def test_a_tampered_guest_stops_site_yml_before_any_secret(snpp):
    with _tampered(snpp, "h3", "measurement"):
        run = snpp.play("site.yml", "--limit", "!h4")
        assert not run.ok
        assert "snp.launchMeasurement" in run.stdout and "h3" in run.stdout
        assert run.recap()["h3"]["changed"] == 0


def test_a_software_signed_report_gets_no_activation(snpp):
    with _tampered(snpp, "h4", "foreign"):
        with pytest.raises(AttestationError) as err:
            _report(snpp, "h4")
        assert "ark" in str(err.value).lower()
        row = _activate(snpp, "h4")
        assert not row["ok"] and "ark" in row["error"].lower(), row
