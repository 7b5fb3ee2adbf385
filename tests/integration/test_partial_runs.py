# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Partial runs on a converged cluster (docs/site.md, "Partial runs: --limit" and "When a peer is refused"), on one
lab (real agents, swtpm, wireguard-go): site.yml and verify.yml with --limit on a Node, without the Coordinator;
add_nodes.yml --limit on a new host; then a dead host (its agent stopped: `python -m lab stop`) fails alone on its
line of the recap, whether the run stops (the default, constellation_max_fail_percentage 0: nothing is sent) or
goes on without it (a percentage: the others are checked and configured). The tests run in file order and share
the lab; the dead host comes last."""

from __future__ import annotations

import pytest

from lab.lab import Lab
from tests.support.playbook import LabPlaybooks, PlayRun

pytestmark = pytest.mark.lab

READ_COORDINATOR = "Attest the Coordinator and derive the cluster ID (check mode, nothing is sent)"
ACTIVATE_COORDINATOR = "Activate the Coordinator (ActivateAsCoordinator over aTLS; nothing if it already is ours)"
ACTIVATE_NODES = "The Coordinator activates the fresh nodes and further Coordinators (ActivateAdditionalNodes)"
MESH_TASK = "Wait until the peer's WireGuard lists every other peer, then ping each over the VPN and read the handshakes"
HEALTHY = ("h1", "h2", "h3", "h5")  # once h5 joined and h4 died


def said(run: PlayRun) -> str:
    """The run's output with every run of white space one space (the yaml callback folds long messages)."""
    return " ".join(run.stdout.split())


def tasks_run(run: PlayRun, host: str):
    """The names of the tasks that ran on ``host`` (ok, changed or failed; not skipped), from every result event
    (a task imported twice, as coordinator_facts.yml is, may run once and be skipped once)."""
    return {(e.get("event_data") or {}).get("task", "") for e in run.events
            if e.get("event") in ("runner_on_ok", "runner_on_failed") and (e.get("event_data") or {}).get("host") == host}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Four hosts, converged by site.yml (h1 the Coordinator)."""
    lab = Lab("pr", inventory_dir=tmp_path_factory.mktemp("pr-inventory"))
    try:
        lab.up(hosts=4, tpm=True, agents=True)
        playbooks = LabPlaybooks(lab, lab.inventory_dir)
        converged = playbooks.play("site.yml")
        assert converged.ok, converged.stdout[-6000:]
        yield playbooks
    finally:
        lab.down()


def test_site_limit_on_a_node_reads_the_coordinator_and_changes_nothing(cluster):
    """Before: `cannot activate these peers: ...:9000 is IsNode` (no cluster ID without the Coordinator's play)."""
    run = cluster.play("site.yml", "--limit", "h3")
    assert run.ok, run.stdout[-6000:]
    assert set(run.recap()) == {"h3"}, run.recap()
    assert run.counts("h3")["changed"] == 0 and run.counts("h3")["failed"] == 0, run.recap()
    ran = tasks_run(run, "h3")
    assert READ_COORDINATOR in ran and ACTIVATE_NODES in ran and MESH_TASK in ran, sorted(ran)
    assert ACTIVATE_COORDINATOR not in ran  # the Coordinator is read, never configured
    assert "h3: already active (VPN IP " in said(run)


def test_verify_limit_on_a_node_derives_the_cluster_id(cluster):
    """Before: `the cluster ID cannot be derived on the controller: no cluster secrets` (its play was h1's)."""
    run = cluster.play("playbooks/verify.yml", "--limit", "h3")
    assert run.ok, run.stdout[-6000:]
    assert set(run.recap()) == {"h3"}, run.recap()
    assert "cannot be derived" not in run.stdout and "PCR 15 not checked" not in run.stdout


def test_add_nodes_limit_on_the_new_host(cluster):
    cluster.lab.grow(5)
    run = cluster.play("playbooks/add_nodes.yml", "--limit", "h5")
    assert run.ok, run.stdout[-6000:]
    assert set(run.recap()) == {"h5"}, run.recap()
    assert "h5: activated by the Coordinator (VPN IP " in said(run)
    # The whole cluster, h5 in its mesh (site.yml: `lab grow` wrote the measurements document again, without the
    # agent, which step 1 lists again).
    run = cluster.play("site.yml")
    assert run.ok, run.stdout[-6000:]
    assert all(MESH_TASK in tasks_run(run, h) for h in ("h1", "h2", "h3", "h4", "h5"))


def test_a_dead_host_fails_alone(cluster):
    cluster.lab.stop_agent("h4")
    # The default (constellation_max_fail_percentage 0): the run stops after step 1, only h4 is failed.
    run = cluster.play("site.yml")
    rows = run.recap()
    assert run.rc != 0 and rows["h4"]["failed"] == 1, rows
    assert all(rows[h]["failed"] == 0 and rows[h]["changed"] == 0 for h in HEALTHY), rows
    assert "refused or unreachable: h4 (1 of 5 hosts" in said(run) and "the run stops here" in said(run)
    assert all(MESH_TASK not in tasks_run(run, h) for h in HEALTHY)
    # A percentage that one dead host of five is within: the others are activated (nothing to do) and verified.
    run = cluster.play("site.yml", "-e", "constellation_max_fail_percentage=25")
    rows = run.recap()
    assert run.rc != 0 and rows["h4"]["failed"] == 1, rows
    assert all(rows[h]["failed"] == 0 and rows[h]["changed"] == 0 for h in HEALTHY), rows
    assert "the run goes on without them" in said(run)
    for name in HEALTHY:
        assert MESH_TASK in tasks_run(run, name), name
    # The deprecated alias still works (warned): true is 100.
    run = cluster.play("site.yml", "-e", "constellation_attest_ignore_errors=true")
    rows = run.recap()
    assert rows["h4"]["failed"] == 1 and all(rows[h]["failed"] == 0 for h in HEALTHY), rows
    assert "constellation_attest_ignore_errors is deprecated" in said(run)
    # verify.yml never stops: h4 is in the table, failed alone.
    run = cluster.play("playbooks/verify.yml")
    rows = run.recap()
    assert rows["h4"]["failed"] == 1 and all(rows[h]["failed"] == 0 for h in HEALTHY), rows
