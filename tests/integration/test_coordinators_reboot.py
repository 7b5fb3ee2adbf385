# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reboots with several Coordinators (real agents, one etcd member per Coordinator): a rebooted Node whose
own Coordinator is dead takes its rejoin ticket from another Coordinator; a rebooted further Coordinator
gets the KMS URI back (Recover), rejoins the etcd cluster from its data and learns what it missed.
A reboot restarts the host's TPM (PCR 15 back to zero) and ends every process on it."""

from __future__ import annotations

import pytest
from lab.agent import tail_log
from tests.support.cluster import LabCluster, lab_cluster
from tests.support.wait import until
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import expected_pcr15

pytestmark = pytest.mark.lab

COORDINATORS = ("h1", "h2", "h3")
AGENT = {"update_interval": 0.5, "reattest_interval": 0}
ETCD = {"heartbeat_ms": 50, "election_ms": 500}


class Reboots(LabCluster):
    def start_peer(self, name: str):
        config = dict(AGENT, etcd_member=dict(ETCD)) if name in COORDINATORS else dict(AGENT)
        return self.start(name, **config)

    def reboot(self, name: str) -> None:
        """The host's machine reboots: every process on it ends (agent, etcd member), its TPM restarts."""
        self.kill_coordinator(name)
        self.lab.reboot_tpm(name)
        self.start_peer(name)


@pytest.fixture(scope="module")
def cluster():
    with lab_cluster("thaboot", 5, Reboots, variant="qemu-vtpm") as c:
        for name in ("h1", "h2", "h3", "h4", "h5"):
            c.start_peer(name)
        with c.client("h1") as client:
            client.activate_as_coordinator(c.secret.to_uri(), c.salt, c.admin_pem)
        rows = c.activate("h1", nodes=("h4", "h5"), coordinators=("h2", "h3"))["nodes"]
        assert all(r["ok"] for r in rows), [r["error"] for r in rows]
        yield c


def test_a_rebooted_node_rejoins_through_another_coordinator(cluster):
    """h4's own Coordinator (h1) is dead when h4 reboots: h4 takes its rejoin ticket from h2 or h3,
    with its VPN IP, WireGuard key and disk key unchanged."""
    before = cluster.snapshot("h4")
    cluster.kill_coordinator("h1")
    cluster.reboot("h4")
    until(lambda: cluster.state("h4")["state"] == "IsNode", timeout=60, what="h4 rejoined",
          why=lambda: tail_log(cluster.hosts["h4"]))
    assert cluster.snapshot("h4") == before
    with cluster.client("h4") as client:
        assert client.attested_pcrs()[15] == expected_pcr15(cluster.cluster_id)
    rejoined = [e for n in ("h2", "h3") for e in cluster.events(n, "node_rejoined")]
    assert rejoined, "neither h2 nor h3 issued the rejoin ticket"
    cluster.start_peer("h1")
    until(lambda: cluster.state("h1")["state"] == "ActivatingNodes", timeout=30, what="h1 back")


def test_a_rebooted_further_coordinator_recovers_and_catches_up(cluster):
    """h2 reboots; while it is down a Node joins through h1. Recover (the KMS URI proves who asks) brings h2
    back: same identity and disk key, its etcd member rejoins and it learns the new Node."""
    before = cluster.snapshot("h2")
    cluster.reboot("h2")
    assert cluster.state("h2")["state"] == "AcceptingInit"  # waits for Recover
    cluster.lab.grow(6)
    cluster.start_peer("h6")
    rows = cluster.activate("h1", nodes=("h6",))["nodes"]
    assert [r["ok"] for r in rows] == [True], [r["error"] for r in rows]
    with cluster.client("h2") as client:
        state = client.recover(cluster.secret.to_uri())
    assert (state["state"], state["role"]) == ("ActivatingNodes", "coordinator"), state
    assert cluster.snapshot("h2") == before
    h6_key = cluster.state("h6")["vpn_pub_key"]
    until(lambda: h6_key in cluster.wg_peers("h2"), timeout=30, what="h2 learnt h6",
          why=lambda: tail_log(cluster.hosts["h2"]))
    assert cluster.etcd_pid("h2") is not None
    # h2 votes again: with h3 lost, h1 and h2 still make a majority and a Node joins.
    cluster.kill_coordinator("h3")
    cluster.lab.grow(7)
    cluster.start_peer("h7")
    rows = until(lambda: [r for r in cluster.activate("h1", nodes=("h7",))["nodes"] if r["ok"]], timeout=60,
                 interval=2, what="h7 activated with h3 dead")
    assert rows[0]["action"] == "activated"
