# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every Coordinator is re-attested and evictions are shared, on real agents (swtpm, wireguard-go, namespaces, one real etcd member per
Coordinator, as tests/integration/test_coordinators.py runs them): h1 activates h2 and h3 as further
Coordinators and h4 as a Node; then h3's boot chain is tampered with (``lab tamper``). The leader (h1, the
first activated) re-attests it, evicts it out of the registry and out of the etcd cluster, every peer drops
it, and every Coordinator names it in GetState, as verify.yml reports it."""

from __future__ import annotations

import pytest
from lab.agent import tail_log
from tests.support.cluster import lab_cluster
from tests.support.wait import until

from ansible_collections.constellation.cluster.plugins.module_utils.verify_problems import verify_problems

pytestmark = pytest.mark.lab

COORDINATORS = ("h1", "h2", "h3")
NODES = ("h4",)
AGENT = {"update_interval": 0.5, "reattest_interval": 2, "reattest_unreachable_limit": 3}
ETCD = {"heartbeat_ms": 50, "election_ms": 500}


@pytest.fixture(scope="module")
def cluster():
    with lab_cluster("ecoord", 4, variant="qemu-vtpm") as c:
        for name in COORDINATORS + NODES:
            config = dict(AGENT, etcd_member=dict(ETCD)) if name in COORDINATORS else dict(AGENT)
            c.start(name, **config)
        with c.client("h1") as client:
            client.activate_as_coordinator(c.secret.to_uri(), c.salt, c.admin_pem)
        rows = c.activate("h1", nodes=NODES, coordinators=("h2", "h3"))["nodes"]
        assert all(r["ok"] for r in rows), [r["error"] for r in rows]
        yield c


def test_a_tampered_coordinator_is_evicted_by_the_leader(cluster):
    h3 = cluster.state("h3")
    keys = {name: cluster.state(name)["vpn_pub_key"] for name in COORDINATORS + NODES}
    for name in ("h1", "h2", "h4"):
        until(lambda n=name: keys["h3"] in cluster.wg_peers(n), timeout=30, what="%s has h3" % name)
    until(lambda: [e for e in cluster.events("h1", "leadership") if e["leads"]], timeout=30, what="h1 leads",
          why=lambda: tail_log(cluster.hosts["h1"]))
    cluster.lab.tamper("h3")

    def evicted():
        return [e for e in cluster.state("h1").get("evicted") or () if e["vpn_ip"] == h3["vpn_ip"]]

    (eviction,) = until(evicted, timeout=60, what="the leader evicted h3", why=lambda: tail_log(cluster.hosts["h1"]))
    assert eviction["role"] == "coordinator" and eviction["etcd_member"] == "removed", eviction
    assert "PCR" in eviction["reason"], eviction
    # The record comes first (every Coordinator refuses h3 from then on), the log line once the peer is removed.
    logged = until(lambda: [e for e in cluster.events("h1", "peer_evicted") if e["vpn_ip"] == h3["vpn_ip"]],
                   timeout=30, what="h1 logged the eviction", why=lambda: tail_log(cluster.hosts["h1"]))
    assert logged[0]["role"] == "coordinator"
    assert cluster.events("h1", "coordinator_member_removed")
    # Out of every peer's mesh (the registry entry went), named by the other Coordinator as well.
    for name in ("h1", "h2", "h4"):
        until(lambda n=name: keys["h3"] not in cluster.wg_peers(n), timeout=30, what="%s dropped h3" % name,
              why=lambda n=name: tail_log(cluster.hosts[n]))
    until(lambda: [e for e in cluster.state("h2").get("evicted") or () if e["vpn_ip"] == h3["vpn_ip"]], timeout=30,
          what="h2 names the eviction")
    # The two Coordinators left keep their members running.
    assert cluster.state("h1")["etcd_member"] == "running" and cluster.state("h2")["etcd_member"] == "running"
    # verify.yml's verdict on h3 from the leader's GetState record.
    problems = verify_problems("h3", peer={"msg": "attestation refused (tampered)"}, attested=False, pending=False,
                               coordinator=True, cluster_id_known=True, eviction=eviction)
    assert problems[0].startswith("h3: evicted Coordinator (") and "out of the registry and the etcd cluster" \
        in problems[0], problems
