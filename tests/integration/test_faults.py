# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Faults during node activation, on real agents (swtpm, wireguard-go, namespaces): an agent dies at
an exact step (it exits as under SIGKILL right after it logs that step's event), is started again, and
the next ActivateAdditionalNodes (what site.yml and add_nodes.yml send) converges: every node active,
its disk key the one the KMS derives, its WireGuard key and VPN IP those it got before the fault, and
the Coordinator's mesh complete. docs/agent.md, "Resumable activation".

Everything runs twice: with the Coordinator on the file store and on a real etcd (``lab up --store etcd``).
h1 Coordinator; h2: the Coordinator dies after recording it, before sending its disk key; h3: the node
dies right after taking the node lock, before it answers the first step; h4: offline (link down) while
it is activated; h5 boots later and is activated while h2's link is cut (h2 misses the peer update);
then the Coordinator is killed and restarted, and h6 joins the cluster it kept.
"""

from __future__ import annotations

import signal

import pytest
from tests.support.cluster import LabCluster, lab_cluster
from tests.support.wait import until
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import expected_pcr15
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConnectionLost

pytestmark = pytest.mark.lab


class Faults(LabCluster):
    def died(self, name) -> bool:
        return self.procs[name].poll() is not None

    def activate_nodes(self, *names) -> dict:
        return self.activate("h1", nodes=names)

    def link(self, name, up: bool):
        """The host's cable to the lab's switch (its veth end in the bridge namespace)."""
        self.lab.admin_run(["ip", "link", "set", name, "up" if up else "down"])


@pytest.fixture(scope="module", params=["file", "etcd"])
def faults(request):
    with lab_cluster("tfault", 4, Faults, variant="qemu-vtpm", store=request.param) as f:
        lab = f.lab
        if request.param == "etcd":
            lab.start_etcd()
        f.start("h1")
        with f.client("h1") as c:
            c.activate_as_coordinator(f.secret.to_uri(), f.salt, f.admin_pem)
        yield f


def test_coordinator_killed_after_recording_a_node_before_its_disk_key(faults):
    coordinator_pub_key = faults.state("h1")["vpn_pub_key"]
    faults.stop("h1")
    faults.start("h1", kill_after_event="peer_added")  # dies once it has recorded h2, before the key
    faults.start("h2")
    with pytest.raises((ConnectionLost, OSError)):
        faults.activate_nodes("h2")
    until(lambda: faults.died("h1"), what="the Coordinator died")
    waiting = faults.state("h2")
    assert waiting["state"] == "NodeWaitingForClusterJoin"  # locked to us, not Failed
    assert faults.disk_key("h2") is None
    faults.start("h1")  # the Coordinator comes back
    assert faults.state("h1")["vpn_pub_key"] == coordinator_pub_key
    # The node finishes by itself: its disk key from the Coordinator's vpnapi, through the tunnel.
    until(lambda: faults.state("h2")["state"] == "IsNode", timeout=40, what="h2 finished its activation")
    assert faults.disk_key("h2") == faults.expected_disk_key("h2")
    after = faults.state("h2")
    assert (after["vpn_ip"], after["vpn_pub_key"]) == (waiting["vpn_ip"], waiting["vpn_pub_key"])
    # The re-run (site.yml / add_nodes.yml) finds nothing to do.
    rows = faults.activate_nodes("h2")["nodes"]
    assert [(r["ok"], r["action"]) for r in rows] == [(True, "none")], rows
    assert faults.wg_peers("h1") == {after["vpn_pub_key"]}
    assert faults.hosts["h2"].run(["ping", "-c1", "-W2", faults.state("h1")["vpn_ip"]], check=False).returncode == 0


def test_node_killed_right_after_the_node_lock_resumes_on_the_next_run(faults):
    faults.start("h3", kill_after_event="node_lock")
    rows = faults.activate_nodes("h3")["nodes"]
    assert not rows[0]["ok"] and "the next run resumes it" in rows[0]["error"], rows
    until(lambda: faults.died("h3"), what="the node died")
    faults.start("h3")  # its agent restarts: locked to our cluster, waiting
    waiting = faults.state("h3")
    assert waiting["state"] == "NodeWaitingForClusterJoin"
    with faults.client("h3") as c:
        assert c.attested_pcrs()[15] == expected_pcr15(faults.cluster_id)
    rows = faults.activate_nodes("h3")["nodes"]
    assert [(r["ok"], r["action"], r["node_vpn_ip"]) for r in rows] == [(True, "resumed", waiting["vpn_ip"])], rows
    after = faults.state("h3")
    assert after["state"] == "IsNode" and after["vpn_pub_key"] == waiting["vpn_pub_key"]
    assert faults.disk_key("h3") == faults.expected_disk_key("h3")
    h2_pub_key = faults.state("h2")["vpn_pub_key"]
    assert faults.wg_peers("h1") == {h2_pub_key, after["vpn_pub_key"]}
    # The other node learns the resumed one through its peer updates; a third run changes nothing.
    until(lambda: after["vpn_pub_key"] in faults.wg_peers("h2"), timeout=30, what="h2 learnt h3")
    rows = faults.activate_nodes("h2", "h3")["nodes"]
    assert [(r["ok"], r["action"]) for r in rows] == [(True, "none"), (True, "none")], rows


def test_node_offline_during_its_activation_is_activated_by_the_next_run(faults):
    faults.start("h4")
    faults.link("h4", up=False)
    rows = faults.activate_nodes("h4")["nodes"]
    assert not rows[0]["ok"] and rows[0]["error"], rows
    faults.link("h4", up=True)
    assert faults.state("h4")["state"] == "AcceptingInit"  # nothing reached it
    rows = faults.activate_nodes("h4")["nodes"]
    assert [(r["ok"], r["action"]) for r in rows] == [(True, "activated")], rows
    assert faults.disk_key("h4") == faults.expected_disk_key("h4")
    until(lambda: len(faults.wg_peers("h2")) == 3, timeout=30, what="h2 learnt h4")


def test_a_node_cut_off_during_a_peer_update_catches_up(faults):
    before = faults.snapshot("h2", "h3", "h4")
    faults.lab.grow(5)
    faults.start("h5")
    faults.link("h2", up=False)
    try:
        rows = faults.activate_nodes("h5")["nodes"]
        assert [(r["ok"], r["action"]) for r in rows] == [(True, "activated")], rows
        h5_pub_key = faults.state("h5")["vpn_pub_key"]
        until(lambda: h5_pub_key in faults.wg_peers("h3"), timeout=30, what="h3 learnt h5")
        assert h5_pub_key not in faults.wg_peers("h2")  # cut off: it cannot have heard
    finally:
        faults.link("h2", up=True)
    until(lambda: h5_pub_key in faults.wg_peers("h2"), timeout=60, what="h2 caught up after its link came back")
    assert faults.snapshot("h2", "h3", "h4") == before


def test_coordinator_killed_and_restarted_keeps_the_cluster(faults):
    names = ("h1", "h2", "h3", "h4", "h5")
    before = faults.snapshot(*names)
    mesh = faults.wg_peers("h1")
    faults.stop("h1", sig=signal.SIGKILL)
    faults.start("h1")
    assert faults.snapshot(*names) == before
    assert faults.wg_peers("h1") == mesh
    # The restarted Coordinator goes on: a new node joins and every node learns it.
    faults.lab.grow(6)
    faults.start("h6")
    rows = faults.activate_nodes("h6")["nodes"]
    assert [(r["ok"], r["action"]) for r in rows] == [(True, "activated")], rows
    h6_pub_key = faults.state("h6")["vpn_pub_key"]
    for name in ("h2", "h3", "h4", "h5"):
        until(lambda n=name: h6_pub_key in faults.wg_peers(n), timeout=30, what="%s learnt h6" % name)
    rows = faults.activate_nodes(*names[1:], "h6")["nodes"]
    assert all(r["ok"] and r["action"] == "none" for r in rows), rows


# Each step of node activation as the Coordinator logs it: the IP reserved (before the node lock), the
# node's answer (locked, WireGuard set up, not yet recorded), the node recorded (peer and disk UUID
# stored, key not sent), the disk key delivered.
COORDINATOR_STEPS = ["node_ip_reserved", "node_locked", "peer_added", "node_activated"]


@pytest.mark.parametrize("step", COORDINATOR_STEPS)
def test_coordinator_killed_at_each_step_of_node_activation_converges(faults, step):
    others = [n for n in sorted(faults.procs) if n != "h1"]
    before = faults.snapshot(*others)
    coordinator_pub_key = faults.state("h1")["vpn_pub_key"]
    new = faults.lab.grow(len(faults.lab.hosts) + 1)[0].name
    faults.start(new)
    faults.stop("h1")
    faults.start("h1", kill_after_event=step)
    with pytest.raises((ConnectionLost, OSError)):
        faults.activate_nodes(new)
    until(lambda: faults.died("h1"), what="the Coordinator died after %s" % step)
    faults.start("h1")
    rows = faults.activate_nodes(new)["nodes"]  # the next site.yml / add_nodes.yml run
    assert rows[0]["ok"], rows
    until(lambda: faults.state(new)["state"] == "IsNode", timeout=40, what="%s active" % new)
    assert faults.disk_key(new) == faults.expected_disk_key(new)
    new_pub_key = faults.state(new)["vpn_pub_key"]
    for name in others:
        until(lambda n=name: new_pub_key in faults.wg_peers(n), timeout=30, what="%s learnt %s" % (name, new))
    assert faults.wg_peers(new) >= {coordinator_pub_key}
    assert faults.snapshot(*others) == before and faults.state("h1")["vpn_pub_key"] == coordinator_pub_key
    rows = faults.activate_nodes(new, *others)["nodes"]
    assert all(r["ok"] and r["action"] == "none" for r in rows), rows
