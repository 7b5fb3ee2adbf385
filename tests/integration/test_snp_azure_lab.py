# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``azure-sev-snp`` variant end to end on a lab that plays Azure's paravisor (lab/azure_hcl.py: the AK at
0x81000003 and the HCL report of the host's platform in NV 0x01400001, written at each host's boot): site.yml
activates the cluster, verify.yml passes and each peer's attestation shows its report and its EK (HCLEkPub). A
host whose paravisor report is signed by another AMD (a software-signed HCL report) gets no activation and no
secret; no healthy peer is evicted. h1 Coordinator, h2 Node; h3 stays outside the cluster."""

from __future__ import annotations

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.ek import ek_pub_sha256
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError
from ansible_collections.constellation.cluster.plugins.plugin_utils.controller import open_peer, peer_report
from lab.lab import Lab
from lab.snp_platform import SNPPlatform
from tests.support.playbook import LabPlaybooks

pytestmark = pytest.mark.lab

CLUSTER = "!h3"


@pytest.fixture(scope="module")
def snpa(tmp_path_factory):
    """Lab ``snpa``: three hosts of variant azure-sev-snp, their agents running."""
    inv = tmp_path_factory.mktemp("snpa-inventory")
    lab = Lab("snpa", inventory_dir=inv)
    try:
        lab.up(hosts=3, tpm=True, agents=True, variant="azure-sev-snp")
        yield LabPlaybooks(lab, inv)
    finally:
        lab.down()


def _report(site, name):
    """The attested peer's state, as the controller sees it (the admin's key for the details)."""
    endpoint = site.lab.host(name).public_endpoint
    return peer_report(endpoint, site.attestation_settings(), None, site.admin_key())


def test_site_activates_the_cluster(snpa):
    run = snpa.play("site.yml", "--limit", CLUSTER)
    assert run.ok, run.stdout[-4000:]
    assert run.recap()["h1"]["changed"] >= 1  # the activation (it writes the master secret and salt)
    reports = {name: _report(snpa, name) for name in ("h1", "h2")}
    assert (reports["h1"].state, reports["h2"].state) == ("ActivatingNodes", "IsNode")
    # a vTPM variant: the PCRs are quoted, and both carry the same cluster ID in PCR 15
    assert reports["h1"].pcrs and reports["h1"].membership != "fresh"
    assert reports["h1"].pcr15 == reports["h2"].pcr15


def test_verify_passes_and_each_peer_shows_its_report_and_ek(snpa):
    run = snpa.play("playbooks/verify.yml", "--limit", CLUSTER)
    assert run.ok, run.stdout[-4000:]
    for name in ("h1", "h2"):
        host = snpa.lab.host(name)
        platform = SNPPlatform(host.dir, host.state_dir).state()
        with open_peer(host.public_endpoint, snpa.attestation_settings()) as client:
            validation = client.attested.validation
        assert validation.snp["measurement"] == platform.measurement and validation.snp["signing_key"] == "vcek"
        assert validation.snp["chip_id"] == platform.chip_id
        ek_cert = snpa.lab.host_cmd(host, ["--tcti", host.tcti, "--nv-read", "0x01c00002"]).strip()
        assert validation.ek_pub_sha256 == ek_pub_sha256(bytes.fromhex(ek_cert))


def test_a_software_signed_hcl_report_gets_no_activation(snpa):
    """h3's paravisor report comes from a platform whose VCEK chains to another AMD (written at its next boot)."""
    snpa.lab.tamper_snp("h3", "foreign")
    snpa.lab.reboot("h3")
    try:
        with pytest.raises(AttestationError, match="ark: found ARK-Milan"):
            _report(snpa, "h3")
        with open_peer(snpa.lab.host("h1").public_endpoint, snpa.attestation_settings()) as client:
            client.admin_auth(snpa.admin_key())
            row = client.activate_additional_nodes([snpa.lab.host("h3").public_endpoint])["nodes"][0]
        assert not row["ok"] and "ark" in row["error"].lower(), row
    finally:
        snpa.lab.tamper_snp("h3", "genuine")
    # no secret reached h3, nobody was evicted
    with pytest.raises(AttestationError):
        _report(snpa, "h3")  # still the foreign report until its next boot
    coordinator = _report(snpa, "h1")
    assert coordinator.evicted == [] and coordinator.state == "ActivatingNodes"
    assert _report(snpa, "h2").state == "IsNode"
