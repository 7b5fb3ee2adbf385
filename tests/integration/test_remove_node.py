# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""remove_node.yml and reset.yml end to end on one lab (real agents, swtpm,
wireguard-go; lab ``trmnode``: h1 the Coordinator, h2 and h3 Nodes, file store, built by site.yml).

* h3 is removed without its reset (``remove_node_reset=false``, as for a host that does not answer): gone from
  every other peer's ``wg show``; ``--check`` before changed nothing, a second run changes nothing; after a reboot
  its own rejoin is refused (the Coordinator names remove_node.yml);
* remove_node.yml on the last Coordinator is refused naming it; reset.yml refuses a host that is still a member;
* h2 is removed with its reset (the agent wipes itself and starts again: Failed until the reboot PCR 15 needs,
  AcceptingInit after); reset.yml then resets h3 (rebooted: fresh at once) and leaves h2 alone (reset already: what
  a second run sees);
* add_nodes.yml activates both again (fresh, after h2's reboot) as new peers, on the VPN IPs the removals freed.
"""

from __future__ import annotations

import os
import re
import signal

import pytest

from lab.agent import agent_dir, start_agent
from lab.lab import Lab
from tests.support.playbook import LabPlaybooks, PlayRun
from tests.support.wait import until
from ansible_collections.constellation.cluster.plugins.plugin_utils.controller import peer_report

pytestmark = pytest.mark.lab


class Cluster(LabPlaybooks):
    def status(self, name: str):
        return peer_report(self.lab.host(name).public_endpoint, self.attestation_settings(), None, self.admin_key())

    def wg_peers(self, name: str) -> set:
        return set(self.lab.host(name).run(["wg", "show", "wg0", "peers"], check=False).stdout.split())

    def reboot(self, name: str) -> None:
        """The host's machine reboots: its agent ends, its TPM resets (PCR 15 zero), its agent starts again."""
        host = self.lab.host(name)
        for pid in self.lab._agent_pids(host):  # pylint: disable=protected-access
            os.kill(pid, signal.SIGKILL)
        until(lambda: not self.lab._agent_pids(host), what="%s's agent ends" % name)  # pylint: disable=protected-access
        self.lab.reboot_tpm(name)
        start_agent(self.lab, host)

    def log(self, name: str) -> str:
        return (agent_dir(self.lab.host(name)) / "agent.log").read_text(errors="replace")


def _ok(run: PlayRun) -> str:
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    inv = tmp_path_factory.mktemp("rmnode-inventory")
    lab = Lab("trmnode", inventory_dir=inv)
    try:
        lab.up(hosts=3, tpm=True, agents=True)
        made = Cluster(lab, inv)
        _ok(made.play("site.yml", "--skip-tags", "verify"))  # the tests read the mesh themselves
        made.before = {name: made.status(name) for name in ("h1", "h2", "h3")}
        yield made
    finally:
        lab.down()


def test_a_removed_node_leaves_every_mesh_and_its_rejoin_is_refused(cluster):
    h3 = cluster.before["h3"]
    assert h3.state == "IsNode" and h3.vpn_pub_key in cluster.wg_peers("h1") | cluster.wg_peers("h2")
    # --check: what would be removed; nothing is.
    check = cluster.play("playbooks/remove_node.yml", "-e", "node=h3", "--check")
    out = _ok(check)
    assert "would remove %s (VPN IP %s)" % (cluster.lab.host("h3").public_ip, h3.vpn_ip) in out, out[-3000:]
    assert cluster.status("h1").removed == []
    assert h3.vpn_pub_key in cluster.wg_peers("h1")
    # The removal (the host "does not answer": no reset), then a second run.
    out = _ok(cluster.play("playbooks/remove_node.yml", "-e", "node=h3", "-e", "remove_node_reset=false"))
    assert "removed %s (VPN IP %s)" % (cluster.lab.host("h3").public_ip, h3.vpn_ip) in out
    until(lambda: all(h3.vpn_pub_key not in cluster.wg_peers(name) for name in ("h1", "h2")),
          what="h3 gone from h1's and h2's WireGuard")
    assert [r["vpn_ip"] for r in cluster.status("h1").removed] == [h3.vpn_ip]
    again = cluster.play("playbooks/remove_node.yml", "-e", "node=h3", "-e", "remove_node_reset=false")
    _ok(again)
    assert again.changed() == 0, again.recap()
    # Rebooted, it asks for a rejoin ticket by itself: refused, naming the way back.
    cluster.reboot("h3")
    until(lambda: "removed from this cluster by the admin" in cluster.log("h3"), what="h3's rejoin refused")
    assert cluster.status("h3").state == "AcceptingInit"
    assert h3.vpn_pub_key not in cluster.wg_peers("h1")


def test_the_last_coordinator_and_a_member_are_refused(cluster):
    run = cluster.play("playbooks/remove_node.yml", "-e", "node=h1")
    assert run.returncode != 0
    assert re.search(r"h1 \([0-9.]+\): .*refused to remove .*the cluster's last Coordinator", run.stdout), run.stdout[-3000:]
    run = cluster.play("playbooks/reset.yml", "-e", "hosts_to_reset=h2")
    assert run.returncode != 0
    assert "h2 (%s): is still a member of the cluster" % cluster.lab.host("h2").public_ip in run.stdout, run.stdout[-3000:]
    assert cluster.status("h1").state == "ActivatingNodes" and cluster.status("h2").state == "IsNode"


def test_remove_with_reset_then_reset_and_add_nodes_reuse_the_freed_ips(cluster):
    h2, h3 = cluster.before["h2"], cluster.before["h3"]
    # h2 answers: removed and reset; its agent comes back without state, Failed until PCR 15 is reset.
    out = _ok(cluster.play("playbooks/remove_node.yml", "-e", "node=h2"))
    assert "PCR 15 keeps the old cluster ID until a reboot" in out, out[-3000:]
    assert cluster.status("h2").state == "Failed"
    assert not (agent_dir(cluster.lab.host("h2")) / "state" / "store.json").exists()
    assert "wg0" not in cluster.lab.host("h2").run(["ip", "-br", "link"], check=False).stdout
    # reset.yml on both: h3 (rebooted, its state still there) is wiped and fresh at once; h2, reset already, is left
    # alone (as on any second run). Then h2 reboots.
    run = cluster.play("playbooks/reset.yml", "-e", "hosts_to_reset=h2,h3")
    out = _ok(run)
    assert "h3: reset: AcceptingInit" in out, out[-3000:]
    assert run.recap()["h2"]["changed"] == 0 and run.recap()["h3"]["changed"] == 1, run.recap()
    cluster.reboot("h2")
    status = cluster.status("h2")
    assert (status.state, status.membership) == ("AcceptingInit", "fresh")
    # add_nodes.yml brings both back as new peers (new keys) on the VPN IPs the removals freed.
    _ok(cluster.play("playbooks/add_nodes.yml", "--skip-tags", "verify"))
    after = {name: cluster.status(name) for name in ("h2", "h3")}
    assert {s.vpn_ip for s in after.values()} == {h2.vpn_ip, h3.vpn_ip}
    assert {s.vpn_pub_key for s in after.values()}.isdisjoint({h2.vpn_pub_key, h3.vpn_pub_key})
    assert all(s.state == "IsNode" for s in after.values())
    until(lambda: {s.vpn_pub_key for s in after.values()} <= cluster.wg_peers("h1"), what="h1's WireGuard has both")
