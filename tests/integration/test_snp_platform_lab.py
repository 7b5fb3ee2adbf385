"""The lab's SEV-SNP platform services live and die with the lab's hosts: ``up``/``grow`` start one per host inside
its namespaces, a report asked for from inside a host verifies to the lab's AMD roots, a tamper is kept across a new
``Lab`` object's ``status`` and undone by ``genuine``, a reboot into another image launches with that image's
measurement, and ``down`` leaves no service, socket or process behind. Whatever SEV-SNP variant the lab runs, these
parts are the same: the test asks for them through the one rule (lab/snp.py's ``uses_snp``)."""

from __future__ import annotations

import subprocess

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import sev_snp
from lab import snp, snp_platform
from lab.image import LAB_IMAGE, launch_measurement
from lab.lab import Lab
from lab.procs import alive
from tests.support import ROOT

pytestmark = pytest.mark.lab

CLIENT = ("import sys; from lab import snp_platform; raw, _certs = snp_platform.request(sys.argv[1], bytes(range(64)));"
          " sys.stdout.write(raw.hex())")


def _report_from_inside(lab: Lab, h) -> sev_snp.Report:
    out = h.run(["env", "PYTHONPATH=%s:%s" % (ROOT / "collections", ROOT)] + lab.host_python()
                + ["-c", CLIENT, str(snp_platform.platform_of(h).socket_path)], check=False)
    assert out.returncode == 0, out.stderr[-800:]
    return sev_snp.parse_report(bytes.fromhex(out.stdout))


def test_platform_services_follow_the_hosts(tmp_path, monkeypatch):
    monkeypatch.setattr(snp, "uses_snp", lambda variant: True)
    lab = Lab("snpl", inventory_dir=tmp_path / "inv")
    pids = []
    try:
        lab.up(hosts=1)
        assert lab.healthy() and [row["snp_platform"] for row in lab.status()] == [True]
        lab.grow(2)
        assert [row["snp_platform"] for row in lab.status()] == [True, True]
        pids = [snp.platform_pid(h) for h in lab.hosts]
        roots = sev_snp.load_roots(str(lab.amd_roots_path))
        assert (lab.inventory_dir / "amd_roots.pem").read_text() == lab.amd_roots_path.read_text()
        reports = [_report_from_inside(lab, h) for h in lab.hosts]
        assert reports[0].chip_id != reports[1].chip_id  # one chip per host
        for h, report in zip(lab.hosts, reports):
            row = snp.prove(h, LAB_IMAGE, roots)
            assert row["ok"], row
            assert report.report_data == bytes(range(64))

        lab.tamper_snp("h2", "debug")
        assert [row["snp_tampered"] for row in Lab("snpl", inventory_dir=tmp_path / "inv").status()] == [[], ["debug"]]
        assert _report_from_inside(lab, lab.hosts[1]).policy.debug  # the running service, no restart
        assert "snp.allowDebug" in snp.prove(lab.hosts[1], LAB_IMAGE, roots)["error"]
        lab.tamper_snp("h2", "genuine")
        assert snp.prove(lab.hosts[1], LAB_IMAGE, roots)["ok"]

        lab.reimage("h1", "snpl-image-v2")
        assert _report_from_inside(lab, lab.hosts[0]).measurement == launch_measurement("snpl-image-v2")
        assert snp.prove(lab.hosts[0], "snpl-image-v2", roots)["ok"]
    finally:
        lab.down()
    assert not any(pid is not None and alive(pid) for pid in pids)
    assert not lab.state_dir.exists()
    leftover = subprocess.run(["pgrep", "-f", "lab.snp_platform --host-dir %s/" % lab.state_dir],
                              capture_output=True, text=True, check=False).stdout
    assert leftover == ""
