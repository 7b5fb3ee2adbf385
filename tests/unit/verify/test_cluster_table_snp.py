# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""verify.yml's table and JSON report for SEV-SNP peers (playbooks/templates/cluster_table.j2,
verify_report.json.j2): an SNP peer's row shows its reported TCB and the start of its launch measurement, a TPM
peer's shows ``-`` there, and the columns stay where tests/integration/test_site.py reads them."""

from __future__ import annotations

import json
import os
import re

import jinja2
import pytest

TEMPLATES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "playbooks", "templates")
MEASUREMENT = "6a063be9dd79f6371c842e480f8dc3b5c725961344e57130e88c5adf49e8f7f6c79b75a5eb77fc769959f4aeb2d9401e"
SNP = {"measurement": MEASUREMENT, "reported_tcb": {"bootloader": 3, "tee": 0, "snp": 8, "microcode": 115},
       "product": "Milan", "signing_key": "vcek", "chip_id": "ab" * 64}
TPM_ROW = {"endpoint": "192.0.2.1:9000", "state": "IsNode", "membership": "ours", "state_disk": {"encrypted": False},
           "deployment_mode": "host", "host_root_trusted": True,
           "pcrs": [{"index": 13, "expected": "00" * 32, "found": "00" * 32, "ok": True, "warn_only": False}]}
SNP_ROW = {"endpoint": "192.0.2.2:9000", "state": "ActivatingNodes", "membership": "ours", "pcrs": [],
           "state_disk": {"encrypted": False}, "deployment_mode": "host", "host_root_trusted": True, "snp": SNP}


def _env():
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), trim_blocks=True)  # as Ansible's lookup
    env.filters["to_nice_json"] = lambda value, indent=2: json.dumps(value, indent=indent, sort_keys=True)
    return env


def _hostvars(**rows):
    return {name: {"constellation_peer": row, "constellation_problems": [], "constellation_public_endpoint":
                   row["endpoint"]} for name, row in rows.items()}


def test_an_snp_peers_row_shows_its_reported_tcb_and_launch_measurement():
    table = _env().get_template("cluster_table.j2").render(
        verify_peers=["h1", "h2"], hostvars=_hostvars(h1=SNP_ROW, h2=TPM_ROW))
    lines = [line.split() for line in table.splitlines() if line.strip()]
    assert lines[0] == ["peer", "endpoint", "PCR", "expected", "found", "match", "verdict", "disk", "mode", "root",
                        "tcb", "launch", "podnet", "state"]
    assert lines[1] == ["h1", "192.0.2.2:9000", "-", "-", "-", "-", "ok", "plain", "host", "trusted", "b3.t0.s8.m115",
                        MEASUREMENT[:16] + "..", "-", "ActivatingNodes", "pcr15=ours"]
    assert lines[2][7:14] == ["plain", "host", "trusted", "-", "-", "-", "IsNode"]
    # tests/integration/test_site.py's pattern for a TPM peer's row still matches
    assert re.search(r"%s\s+\S+\s+%s\s+\S+\s+\S+\s+yes\s+ok\s+plain\s+host\s+trusted\s+-\s+-\s+(?:-|\S+/\d+\s+ok)\s+"
                     r"(ActivatingNodes|IsNode)\s+pcr15=ours" % ("h2", "13"), table)


def test_turins_fmc_level_comes_first():
    row = dict(SNP_ROW, snp=dict(SNP, reported_tcb={"fmc": 1, "bootloader": 3, "tee": 0, "snp": 8, "microcode": 115},
                                 product="Turin"))
    table = _env().get_template("cluster_table.j2").render(verify_peers=["h1"], hostvars=_hostvars(h1=row))
    assert " f1.b3.t0.s8.m115 " in table


@pytest.mark.parametrize("row,expected", [
    (SNP_ROW, {"product": "Milan", "signing_key": "vcek", "reported_tcb": SNP["reported_tcb"],
               "measurement": MEASUREMENT}),
    (TPM_ROW, None),
])
def test_the_json_report_carries_an_snp_peers_tcb_and_measurement(row, expected):
    report = json.loads(_env().get_template("verify_report.json.j2").render(
        verify_peers=["h1"], hostvars=_hostvars(h1=row)))
    assert report["peers"][0]["snp"] == expected


def test_a_refused_peers_row_keeps_its_dashes_where_test_site_reads_them():
    hostvars = {"h4": {"constellation_peer": {"failed": True, "msg": "cannot connect"}, "constellation_problems":
                       ["h4: not attested: cannot connect"], "constellation_public_endpoint": "10.42.0.14:9000"}}
    table = _env().get_template("cluster_table.j2").render(verify_peers=["h4"], hostvars=hostvars)
    # tests/integration/test_site.py's pattern for a refused peer's row
    assert re.search(r"^\s*h4\s+%s\s.*FAIL\s+-\s+-\s+-\s+-\s+-\s+-\s+refused$" % re.escape("10.42.0.14:9000"), table,
                     re.M)


def test_the_podnet_column_says_whether_every_other_peer_routes_the_peers_pod_cidr():
    hostvars = _hostvars(h1=SNP_ROW, h2=TPM_ROW, h3=dict(TPM_ROW, endpoint="192.0.2.3:9000"))
    for name, cidr in (("h1", "10.244.0.0/24"), ("h2", "10.244.1.0/24"), ("h3", "")):
        hostvars[name]["constellation_mesh_self"] = {"name": name, "pod_cidr": cidr}
    hostvars["h1"]["constellation_podnet"] = {"h2": "ok"}
    hostvars["h2"]["constellation_podnet"] = {"h1": "not routed"}
    hostvars["h3"]["constellation_podnet"] = {"h1": "ok", "h2": "ok"}
    table = _env().get_template("cluster_table.j2").render(verify_peers=["h1", "h2", "h3"], hostvars=hostvars)
    rows = {line.split()[0]: line for line in table.splitlines()[1:] if line.strip()}
    assert " 10.244.0.0/24 NO " in rows["h1"]  # h2 does not route it
    assert " 10.244.1.0/24 ok " in rows["h2"]  # h1 and h3 do
    assert re.search(r"\s-\s+-\s+-\s+IsNode", rows["h3"])  # no pod CIDR
    report = json.loads(_env().get_template("verify_report.json.j2").render(verify_peers=["h2"], hostvars=hostvars))
    assert report["peers"][0]["podnet_seen"] == {"h1": "not routed"}
