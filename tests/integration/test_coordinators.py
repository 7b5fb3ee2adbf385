# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Several Coordinators on one etcd cluster, on real agents (swtpm, wireguard-go, namespaces, one real
etcd member per Coordinator on its VPN IP, TLS from the chain of trust): docs/store.md, "Several
Coordinators".

h1 is activated by the admin; h1 activates h2 and h3 as further Coordinators and h4, h5 as Nodes (one
ActivateAdditionalNodes, as site.yml sends it). Then the faults of #18: the leader is killed (agent and
etcd member) and the cluster goes on (a new Node joins through another Coordinator, every Node learns it,
re-attestation goes on); it comes back and catches up; a majority is lost and writes stop with a clear
error while the mesh stays up. Nothing is lost: VPN IPs, WireGuard keys and disk keys are compared
before and after.
"""

from __future__ import annotations

import json

import pytest
from lab.agent import agent_dir, tail_log
from tests.support import ROOT
from tests.support.cluster import LabCluster, lab_cluster
from tests.support.wait import until

pytestmark = pytest.mark.lab

COORDINATORS = ("h1", "h2", "h3")
NODES = ("h4", "h5")
SPARE_COORDINATORS = ("h9", "h10")  # hosts the attacks try to make Coordinators
# Short intervals so that the test's waits stay short; etcd's timing as the lab runs it.
AGENT = {"update_interval": 0.5, "reattest_interval": 2, "reattest_unreachable_limit": 3}
ETCD = {"heartbeat_ms": 50, "election_ms": 500}


class Coordinators(LabCluster):
    def start_peer(self, name: str, **config):
        if name in COORDINATORS + SPARE_COORDINATORS:
            config.setdefault("etcd_member", dict(ETCD))
        return self.start(name, **dict(AGENT, **config))


@pytest.fixture(scope="module")
def cluster():
    with lab_cluster("tha", 5, Coordinators, variant="qemu-vtpm") as c:
        for name in COORDINATORS + NODES:
            c.start_peer(name)
        with c.client("h1") as client:
            client.activate_as_coordinator(c.secret.to_uri(), c.salt, c.admin_pem)
        yield c


def test_the_coordinator_activates_further_coordinators_and_nodes(cluster):
    rows = cluster.activate("h1", nodes=NODES, coordinators=("h2", "h3"))["nodes"]
    assert [(r["ok"], r["action"], r.get("role", "node")) for r in rows] == [
        (True, "activated", "coordinator"), (True, "activated", "coordinator"),
        (True, "activated", "node"), (True, "activated", "node")], [r["error"] for r in rows]
    for name in COORDINATORS:
        state = cluster.state(name)
        assert (state["state"], state["role"]) == ("ActivatingNodes", "coordinator"), (name, state)
        # Each derived its own disk key from the KMS it received after attestation.
        assert cluster.disk_key(name) == cluster.expected_disk_key(name)
    for name in NODES:
        assert cluster.disk_key(name) == cluster.expected_disk_key(name)
    # Every peer is in every Coordinator's mesh, Coordinators included (a full mesh of 5).
    keys = {name: cluster.state(name)["vpn_pub_key"] for name in COORDINATORS + NODES}
    for name in COORDINATORS + NODES:
        until(lambda n=name: cluster.wg_peers(n) == {k for m, k in keys.items() if m != n}, timeout=20,
              what="the full mesh on %s" % name, why=lambda n=name: tail_log(cluster.hosts[n]))
    # A second run changes nothing.
    rows = cluster.activate("h1", nodes=NODES, coordinators=("h2", "h3"))["nodes"]
    assert all(r["ok"] and r["action"] == "none" for r in rows), rows


def _grow_and_start(cluster, *names):
    cluster.lab.grow(int(names[-1][1:]))
    for name in names:
        cluster.start_peer(name)


def test_the_cluster_goes_on_without_the_leader_and_it_catches_up(cluster):
    """Kill h1 (agent and etcd member): a new Node joins through h2, every Node and Coordinator learns it,
    re-attestation goes on elsewhere; h1 comes back with what it had and learns what it missed."""
    names = COORDINATORS + NODES
    before = cluster.snapshot(*names)
    cluster.kill_coordinator("h1")
    _grow_and_start(cluster, "h6")
    rows = cluster.activate("h2", nodes=("h6",))["nodes"]
    assert [(r["ok"], r["action"]) for r in rows] == [(True, "activated")], [r["error"] for r in rows]
    assert cluster.disk_key("h6") == cluster.expected_disk_key("h6")
    h6_key = cluster.state("h6")["vpn_pub_key"]
    for name in ("h3", "h4", "h5"):
        until(lambda n=name: h6_key in cluster.wg_peers(n), timeout=30, what="%s learnt h6" % name,
              why=lambda n=name: tail_log(cluster.hosts[n]))
    for name in NODES:  # their own Coordinator (h1) is gone: they asked another one
        assert cluster.events(name, "update_failover"), tail_log(cluster.hosts[name])
    # Re-attestation goes on: a surviving Coordinator leads now and runs rounds.
    until(lambda: [e for n in ("h2", "h3") for e in cluster.events(n, "leadership") if e["leads"]], timeout=30,
          what="h2 or h3 leading the re-attestation rounds")
    # h1 comes back: same VPN IP, WireGuard key and disk key; it catches up with h6.
    cluster.start_peer("h1")
    assert cluster.snapshot(*names) == before
    until(lambda: h6_key in cluster.wg_peers("h1"), timeout=30, what="h1 learnt h6",
          why=lambda: tail_log(cluster.hosts["h1"]))
    assert cluster.state("h1")["state"] == "ActivatingNodes"


def test_a_majority_lost_stops_writes_and_keeps_the_mesh(cluster):
    """h2 and h3 die: h1 alone has no majority. Activating a Node fails with a clear error and leaves
    nothing behind; the Nodes keep their mesh (h1 answers from memory). Both back: writes resume."""
    names = ("h1", "h4", "h5", "h6")
    before = cluster.snapshot(*names)
    meshes = {name: cluster.wg_peers(name) for name in names}
    cluster.kill_coordinator("h2")
    cluster.kill_coordinator("h3")
    _grow_and_start(cluster, "h7")
    rows = cluster.activate("h1", nodes=("h7",))["nodes"]
    assert [r["ok"] for r in rows] == [False], rows
    assert "quorum" in rows[0]["error"], rows[0]["error"]
    assert cluster.state("h7")["state"] == "AcceptingInit"  # nothing reached it
    # The mesh stays: a Node's poll is answered (from h1's memory); nothing changed anywhere.
    mark = len(cluster.events("h4", "loop_error"))
    cluster.hosts["h4"].run(["sleep", "2"])
    assert len(cluster.events("h4", "loop_error")) == mark, tail_log(cluster.hosts["h4"])
    assert {name: cluster.wg_peers(name) for name in names} == meshes
    assert cluster.snapshot(*names) == before
    # A majority again: the same request succeeds.
    cluster.start_peer("h2")
    cluster.start_peer("h3")
    rows = until(lambda: [r for r in cluster.activate("h1", nodes=("h7",))["nodes"] if r["ok"]], timeout=60,
                 interval=2, what="h7 activated once h2 and h3 are back")
    assert rows[0]["action"] == "activated", rows
    assert cluster.disk_key("h7") == cluster.expected_disk_key("h7")


def test_the_leader_killed_during_a_node_activation_converges_through_another(cluster):
    """h1 dies right after it recorded h8 and before h8 got its disk key: h8 fetches its key from another
    Coordinator over the VPN, and the re-run through h2 finds it active."""
    cluster.stop("h1")
    cluster.start_peer("h1", kill_after_event="peer_added")
    _grow_and_start(cluster, "h8")
    try:
        cluster.activate("h1", nodes=("h8",))
    except Exception:  # pylint: disable=broad-except
        pass  # the connection dies with h1
    until(lambda: cluster.procs["h1"].poll() is not None, timeout=30, what="h1 died at peer_added")
    cluster.procs.pop("h1")
    rows = until(lambda: [r for r in cluster.activate("h2", nodes=("h8",))["nodes"] if r["ok"]], timeout=90,
                 interval=2, what="h8 converged through h2", why=lambda: tail_log(cluster.hosts["h8"]))
    assert rows[0]["action"] in ("resumed", "recorded", "none"), rows
    until(lambda: cluster.state("h8")["state"] == "IsNode", timeout=60, what="h8 IsNode",
          why=lambda: tail_log(cluster.hosts["h8"]))
    assert cluster.disk_key("h8") == cluster.expected_disk_key("h8")
    cluster.start_peer("h1")
    h8_key = cluster.state("h8")["vpn_pub_key"]
    until(lambda: h8_key in cluster.wg_peers("h1"), timeout=30, what="h1 learnt h8")


def _request(cluster, vpn_ip: str) -> dict:
    """An ActivateAsAdditionalCoordinator request as h1 would send it (peers: h1 only)."""
    h1 = cluster.state("h1")
    return {"node_vpn_ip": vpn_ip, "cluster_id": _b64(cluster.cluster_id), "measurement_salt": _b64(cluster.salt),
            "admin_pub_key": cluster.admin_pem, "coordinator_vpn_ip": h1["vpn_ip"],
            "peers": [{"vpn_ip": h1["vpn_ip"], "vpn_pub_key": h1["vpn_pub_key"],
                       "public_ip": cluster.hosts["h1"].public_ip, "role": "coordinator"}]}


def _b64(raw: bytes) -> str:
    import base64

    return base64.b64encode(raw).decode()


def test_attacks_on_the_activation_of_a_coordinator_are_refused(cluster):
    from ansible_collections.constellation.cluster.plugins.module_utils import kms
    from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import RemoteError

    # A second activation of a Coordinator: refused, it stays as it was.
    before = cluster.snapshot("h2")
    with cluster.client("h2") as client, pytest.raises(RemoteError, match="allowed only in state AcceptingInit"):
        client.activate_as_additional_coordinator(_request(cluster, "10.118.0.9"), lambda *a: {}, lambda: None)
    assert cluster.snapshot("h2") == before
    # Without the admin key nobody may ask a Coordinator to activate further Coordinators.
    _grow_and_start(cluster, "h9", "h10")
    with cluster.client("h1") as client, pytest.raises(RemoteError, match="(?i)admin"):
        client.activate_additional_nodes([], coordinator_public_endpoints=[cluster.hosts["h9"].public_endpoint])
    assert cluster.state("h9")["state"] == "AcceptingInit"
    # A fresh host provisioned with an init secret: a caller that cannot prove it takes nothing.
    cluster.stop("h10")
    cluster.start_peer("h10", trust=True)
    with cluster.client("h10") as client, pytest.raises(RemoteError, match="init"):
        client.activate_as_additional_coordinator(_request(cluster, "10.118.0.9"), lambda *a: {}, lambda: None)
    assert cluster.state("h10")["state"] == "AcceptingInit"
    # An activator whose KMS URI does not derive the cluster ID it announced (another cluster's secret):
    # the peer refuses it before it stores it or starts an etcd member, and fails (it holds the lock).
    other = kms.MasterSecret.generate().to_uri()
    with cluster.client("h9") as client, pytest.raises(RemoteError, match="does not derive"):
        client.activate_as_additional_coordinator(
            _request(cluster, "10.118.0.9"),
            lambda uuid, key: {"kms_uri": other, "etcd_initial_cluster": "x=https://10.118.0.1:2380"}, lambda: None)
    assert cluster.state("h9")["state"] == "Failed"
    assert cluster.etcd_pid("h9") is None
    assert not (agent_dir(cluster.hosts["h9"]) / "state" / "state_disk.key").exists()


REMOVE_SCRIPT = """
import json, sys
from ansible_collections.constellation.cluster.plugins.module_utils.core.coordinator_removal import remove_coordinator
from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd_members import open_local_member
member = open_local_member(sys.argv[1])
try:
    print(json.dumps(remove_coordinator(member.store, sys.argv[2], tls=member.tls)))
finally:
    member.close()
"""


def test_a_dead_coordinator_is_replaced(cluster):
    """The operator's procedure (docs/store.md, "Replacing a dead Coordinator"): h3 dies for good; on h1 (as
    the coordinator_member module runs there) its etcd member and peer entry are removed; a fresh host is
    activated as a further Coordinator in its place. Every peer drops h3 and learns the new one; the cluster
    has three members again and keeps writing when another one dies."""

    h3 = cluster.state("h3")
    cluster.kill_coordinator("h3")
    env = ["env", "PYTHONPATH=%s:%s" % (ROOT / "collections", ROOT)]
    run = cluster.hosts["h1"].run(env + cluster.lab.host_python() + [
        "-c", REMOVE_SCRIPT, str(agent_dir(cluster.hosts["h1"]) / "state"), h3["vpn_ip"]], check=False,
        capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    removed = json.loads(run.stdout)
    assert removed["changed"] and removed["member"]["name"] == "coordinator-%s" % h3["vpn_ip"].replace(".", "-")
    assert removed["peer"]["vpn_ip"] == h3["vpn_ip"] and len(removed["members"]) == 2
    for name in ("h1", "h2", "h4", "h5"):
        until(lambda n=name: h3["vpn_pub_key"] not in cluster.wg_peers(n), timeout=30, what="%s dropped h3" % name)
    # The replacement: a fresh host, activated as a further Coordinator; it gets h3's VPN IP back.
    _grow_and_start(cluster, "h11")
    cluster.stop("h11")
    cluster.start_peer("h11", etcd_member=dict(ETCD))
    rows = cluster.activate("h1", coordinators=("h11",))["nodes"]
    assert [(r["ok"], r["action"]) for r in rows] == [(True, "activated")], [r["error"] for r in rows]
    h11 = cluster.state("h11")
    assert (h11["state"], h11["role"], h11["vpn_ip"]) == ("ActivatingNodes", "coordinator", h3["vpn_ip"])
    for name in ("h1", "h2", "h4", "h5"):
        until(lambda n=name: h11["vpn_pub_key"] in cluster.wg_peers(n), timeout=30, what="%s learnt h11" % name)
    # Three voting members again: one more may die and a Node still joins.
    cluster.kill_coordinator("h2")
    _grow_and_start(cluster, "h12")
    rows = until(lambda: [r for r in cluster.activate("h1", nodes=("h12",))["nodes"] if r["ok"]], timeout=60,
                 interval=2, what="h12 activated with h2 dead")
    assert rows[0]["action"] == "activated"


def test_an_etcd_member_that_dies_is_started_again_by_its_agent(cluster):
    """h1's etcd member dies while its agent lives (SIGKILL, the member only). Since the test above h2 is
    dead: h1 and h11 are the majority and both are needed. h1's agent notices, logs it and starts the
    member again from its data; it rejoins and votes: GetState says "running" with a new process, and a
    Node joins through h1 (a write that needs h1's member and h11's)."""
    import os
    import signal

    assert cluster.procs["h1"].poll() is None and cluster.procs["h11"].poll() is None
    assert cluster.state("h11")["etcd_member"] == "running"
    pid = cluster.etcd_pid("h1")
    assert pid and cluster.state("h1")["etcd_member"] == "running"
    marks = {event: len(cluster.events("h1", event)) for event in ("etcd_member_exited", "etcd_member_started")}
    os.kill(pid, signal.SIGKILL)
    until(lambda: cluster.etcd_pid("h1") not in (None, pid) and cluster.state("h1")["etcd_member"] == "running",
          timeout=60, what="h1's agent started its etcd member again", why=lambda: tail_log(cluster.hosts["h1"]))
    exited = cluster.events("h1", "etcd_member_exited")[marks["etcd_member_exited"]:]
    started = cluster.events("h1", "etcd_member_started")[marks["etcd_member_started"]:]
    assert exited and exited[0]["level"] == "warning", tail_log(cluster.hosts["h1"])
    assert started and started[-1]["cluster"] == "restart", tail_log(cluster.hosts["h1"])
    new_pid = cluster.etcd_pid("h1")
    with open("/proc/%d/cmdline" % new_pid, "rb") as handle:
        assert b"etcd" in handle.read()
    assert cluster.procs["h1"].poll() is None  # the agent lived on
    _grow_and_start(cluster, "h13")
    rows = until(lambda: [r for r in cluster.activate("h1", nodes=("h13",))["nodes"] if r["ok"]], timeout=60,
                 interval=2, what="h13 activated through h1 with h2 dead", why=lambda: tail_log(cluster.hosts["h1"]))
    assert rows[0]["action"] == "activated"
    assert cluster.disk_key("h13") == cluster.expected_disk_key("h13")
    assert cluster.etcd_pid("h1") == new_pid and cluster.state("h1")["etcd_member"] == "running"
