# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The example inventory cannot reach anything by accident: its addresses are placeholders under the reserved
``.invalid`` domain (RFC 2606: never resolves), and bootstrap.yml, site.yml and add_nodes.yml run unchanged stop
at the pre-flight check (playbooks/tasks/preflight.yml), naming the variable that still says CHANGE-ME, before
anything is resolved, probed or sent."""

from __future__ import annotations

import shutil

import pytest
import yaml

from tests.support import ROOT
from tests.support.playbook import run_playbook

EXAMPLE = ROOT / "inventories" / "example"


def _hosts(doc):
    for group in doc["all"]["children"].values():
        yield from (group.get("hosts") or {}).items()


def test_every_example_address_is_a_placeholder_under_the_invalid_domain():
    hosts = dict(_hosts(yaml.safe_load((EXAMPLE / "hosts.yml").read_text())))
    assert set(hosts) == {"cp-0", "worker-0", "worker-1"}
    for name, values in hosts.items():
        host, _sep, port = values["constellation_public_endpoint"].rpartition(":")
        assert host == "%s.CHANGE-ME.invalid" % name and port == "9000", (name, values)


@pytest.mark.parametrize("playbook", ["playbooks/bootstrap.yml", "site.yml", "playbooks/add_nodes.yml"])
def test_the_unedited_example_stops_at_the_preflight_check_naming_the_variable(tmp_path, playbook):
    inv = tmp_path / "mycluster"
    shutil.copytree(EXAMPLE, inv)
    run = run_playbook(ROOT / playbook, str(inv / "hosts.yml"), tmp_path / "runs", timeout=120)
    assert run.rc != 0, run.stdout[-3000:]
    rows = run.recap()
    assert set(rows) == {"cp-0", "worker-0", "worker-1"}, rows
    for name, counts in rows.items():
        assert counts["failed"] == 1 and counts["changed"] == 0 and counts["unreachable"] == 0, (name, counts)
        failed = run.results(name)
        (task,) = [t for t, res in failed.items() if res.get("failed")]
        assert task.startswith("Pre-flight"), (name, task)
        msg = failed[task]["msg"]
        assert "constellation_public_endpoint still says CHANGE-ME" in msg, msg
        assert "%s.CHANGE-ME.invalid:9000" % name in msg, msg
    # Nothing else ran: no probe of an agent, no secret made.
    assert not [e for e in run.events if e.get("event") == "runner_on_ok"
                and "answer" in (e.get("event_data") or {}).get("task", "")]
    assert not list(inv.glob("constellation-*.json"))
