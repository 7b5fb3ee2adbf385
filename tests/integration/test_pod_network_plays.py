# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pod network's plays end to end on a lab (real agents, swtpm, wireguard-go, the real CNI plugins and nft;
lab ``plnet``: h1 the Coordinator, h2 and h3 Nodes; each host's own /etc/cni). What the inventory's defaults give:

* site.yml gives every peer the conflist of the pod CIDR its attested GetState names (distinct, inside the cluster's
  pod range), ``cni0`` with its pod gateway and the nftables table; every peer's WireGuard routes the others' pod
  CIDRs; a second run and ``--check`` change nothing;
* ``--tags podnet`` alone puts back a conflist that went missing, on that host only (``--check --diff`` first
  predicts it and writes nothing);
* verify.yml with ``verify_pod_network`` pings every other peer's pod gateway from a probe pod on each peer, and its
  table's podnet column says ``ok`` for every peer;
* remove_node.yml takes h3's pod network away with its agent's state (conflist, table, ``cni0``), and its pod CIDR
  leaves the other peers' WireGuard;
* on a second lab (``plbyo``, 2 hosts), ``constellation_pod_network: false`` brings no pod network at all, and the
  next site.yml with the default gives the activated cluster its pod range and every peer its pod network.
"""

from __future__ import annotations

import ipaddress
import json
import re

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.pod_network import conflist
from lab import pods
from lab.lab import Lab
from tests.support.playbook import LabPlaybooks, PlayRun
from tests.support.wait import until

pytestmark = pytest.mark.lab

HOSTS = ("h1", "h2", "h3")
TABLE = ["nft", "list", "table", "inet", "constellation_pod_network"]


def _ok(run: PlayRun) -> str:
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    return out


class Cluster(LabPlaybooks):
    def conflist_path(self, name: str):
        return pods.cni_dir(self.lab.host(name), "etc") / "net.d" / conflist.CONFLIST_NAME

    def pod_cidr(self, name: str) -> str:
        """The pod CIDR of the host's conflist (host-local IPAM's range)."""
        doc = json.loads(self.conflist_path(name).read_text())
        return doc["plugins"][0]["ipam"]["ranges"][0][0]["subnet"]

    def allowed_ips(self, name: str) -> str:
        return self.lab.host(name).run(["wg", "show", "wg0", "allowed-ips"]).stdout

    def has_table(self, name: str) -> bool:
        return self.lab.host(name).run(TABLE, check=False).returncode == 0

    def bridge(self, name: str) -> str:
        return self.lab.host(name).run(["ip", "-o", "-4", "addr", "show", "dev", conflist.BRIDGE], check=False).stdout


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    inv = tmp_path_factory.mktemp("plnet-inventory")
    lab = Lab("plnet", inventory_dir=inv)
    try:
        lab.up(hosts=len(HOSTS), tpm=True, agents=True)
        made = Cluster(lab, inv)
        made.first = made.play("site.yml")
        yield made
    finally:
        lab.down()


def test_site_gives_every_peer_the_pod_network_of_its_attested_pod_cidr(cluster):
    _ok(cluster.first)
    cidrs = {name: cluster.pod_cidr(name) for name in HOSTS}
    networks = [ipaddress.ip_network(cidr) for cidr in cidrs.values()]
    assert all(net.subnet_of(ipaddress.ip_network("10.244.0.0/16")) and net.prefixlen == 24 for net in networks)
    assert not any(a.overlaps(b) for i, a in enumerate(networks) for b in networks[i + 1:]), cidrs
    for name in HOSTS:
        # The role read the pod CIDR from the peer's attested GetState and reported it.
        assert "%s: pod network pod CIDR %s in 10.244.0.0/16" % (name, cidrs[name]) in cluster.first.stdout, name
        gateway = str(ipaddress.ip_network(cidrs[name]).network_address + 1)
        assert "inet %s/24" % gateway in cluster.bridge(name), name
        assert cluster.has_table(name), name
        allowed = cluster.allowed_ips(name)
        for other in HOSTS:
            assert (other == name) == (cidrs[other] not in allowed), (name, other, allowed)
    # kubeadm is not run in the lab (constellation_kubernetes: false); the pod network is, before it.
    assert "The pod network on the Coordinator (CNI conflist, nftables table)" in cluster.first.stdout


def test_a_second_run_and_check_mode_change_nothing(cluster):
    _ok(cluster.first)
    again = cluster.play("site.yml")
    _ok(again)
    assert again.changed() == 0, again.recap()
    check = cluster.play("site.yml", "--check", "--diff")
    _ok(check)
    assert check.changed() == 0, check.recap()


def test_tags_podnet_puts_back_a_missing_conflist_on_that_host_only(cluster):
    _ok(cluster.first)
    path = cluster.conflist_path("h2")
    before = path.read_bytes()
    path.unlink()
    predicted = cluster.play("site.yml", "--tags", "podnet", "--check", "--diff")
    out = _ok(predicted)
    assert not path.exists()  # check mode wrote nothing
    assert predicted.changed("h2") >= 1 and predicted.changed("h1") == 0 and predicted.changed("h3") == 0, \
        predicted.recap()
    # --diff shows the conflist that would be written: h2's pod CIDR.
    assert '"subnet": "%s"' % json.loads(before)["plugins"][0]["ipam"]["ranges"][0][0]["subnet"] in out, out[-4000:]
    applied = cluster.play("site.yml", "--tags", "podnet")
    _ok(applied)
    assert path.read_bytes() == before
    assert applied.changed("h2") >= 1 and applied.changed("h1") == 0 and applied.changed("h3") == 0, applied.recap()


def test_verify_pings_pod_to_pod_and_shows_the_podnet_column(cluster):
    _ok(cluster.first)
    run = cluster.play("playbooks/verify.yml", "-e", "verify_pod_network=true")
    out = _ok(run)
    for name in HOSTS:
        assert re.search(r"^\s*%s\s.*\s%s ok\s" % (name, re.escape(cluster.pod_cidr(name))), out, re.M), out[-4000:]
        probe = run.results(name)["Ping every other peer's pod gateway from a probe pod (verify_pod_network)"]
        assert probe["unanswered"] == [] and len(probe["results"]) == len(HOSTS) - 1, probe
    assert "every peer passed" in out


def test_remove_node_takes_the_pod_network_away_and_its_cidr_leaves_every_mesh(cluster):
    _ok(cluster.first)
    h3_cidr = cluster.pod_cidr("h3")
    run = cluster.play("playbooks/remove_node.yml", "-e", "node=h3")
    _ok(run)
    assert not cluster.conflist_path("h3").exists()
    assert not cluster.has_table("h3") and not cluster.bridge("h3")
    for name in ("h1", "h2"):
        until(lambda name=name: h3_cidr not in cluster.allowed_ips(name), what="h3's pod CIDR leaves %s" % name)
        assert cluster.conflist_path(name).exists() and cluster.has_table(name)


def test_bring_your_own_cni_then_the_pod_network_on_the_next_run(tmp_path):
    """constellation_pod_network false: no pod CIDRs, no conflist, no table, verify passes with "-" in its podnet
    column. The next site.yml with the default (on) gives the activated cluster its pod range and every peer its
    pod network."""
    inv = tmp_path / "inventory"
    lab = Lab("plbyo", inventory_dir=inv)
    try:
        lab.up(hosts=2, tpm=True, agents=True)
        byo = Cluster(lab, inv)
        out = _ok(byo.play("site.yml", "-e", "constellation_pod_network=false"))
        assert "Read the peer's pod CIDR" not in out  # the role pod_network did not run
        for name in ("h1", "h2"):
            assert not byo.conflist_path(name).exists() and not byo.has_table(name) and not byo.bridge(name)
            assert "10.244." not in byo.allowed_ips(name)
        out = _ok(byo.play("playbooks/verify.yml", "-e", "constellation_pod_network=false"))
        assert re.search(r"^\s*h2\s.*\s-\s+IsNode", out, re.M), out[-3000:]
        _ok(byo.play("site.yml"))
        cidrs = {name: byo.pod_cidr(name) for name in ("h1", "h2")}
        assert len(set(cidrs.values())) == 2
        assert cidrs["h1"] in byo.allowed_ips("h2") and cidrs["h2"] in byo.allowed_ips("h1")
        assert all(byo.has_table(name) for name in ("h1", "h2"))
    finally:
        lab.down()
