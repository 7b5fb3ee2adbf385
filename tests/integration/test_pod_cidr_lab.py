# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pod CIDRs over the attested mesh on one lab (real agents, swtpm, wireguard-go; lab ``pcidr``, docs/wireguard.md
"Pod CIDRs"): h1 the Coordinator (activated with the default pod range), h2 and h3 Nodes, h4 a spare.

* every peer's ``wg show`` holds each other peer's VPN IP and pod CIDR, the pod range is routed into ``wg0`` by one
  route, and an address of h2's pod CIDR reaches one of h3's through the tunnel (no CNI: addresses on ``lo``);
* ``lab tamper`` on h3: re-attestation evicts it, its VPN IP and pod CIDR leave every other ``wg show``, h2's
  packets to h3's pod CIDR still route into ``wg0`` (where WireGuard drops them) and get no answer;
* RemovePeer (what remove_node.yml sends) frees h3's VPN IP and pod CIDR: h4, activated next, gets both;
* a cluster activated without pod CIDRs (lab ``pcold``, as 0.4.0 did) gets them with UsePodCIDRs (what
  activate_coordinator sends an activated Coordinator): every peer's block in every other ``wg show``, the Nodes'
  from their next signed update, with the range routed into ``wg0``.
"""

from __future__ import annotations

import base64
import ipaddress

import pytest

from lab.agent import start_agent
from tests.support.cluster import LabCluster, lab_cluster
from tests.support.wait import until

pytestmark = pytest.mark.lab

INTERVAL = 1.0  # reattest_interval of this lab's Coordinator
POD_CONFIG = {"cluster_pod_cidr": "10.244.0.0/16", "node_pod_cidr_mask_size": 24}
PEERS = ("h1", "h2", "h3")


class PodCIDRs(LabCluster):
    def start(self, name: str, **config):
        self.hosts = {h.name: h for h in self.lab.hosts}
        config.setdefault("reattest_interval", INTERVAL)
        self.procs[name] = start_agent(self.lab, self.hosts[name], trust=True, **config)
        return self.procs[name]

    def activate_nodes(self, *names) -> list:
        with self.client("h1") as c:
            c.admin_auth(self.admin_key)
            return c.activate_additional_nodes([self.hosts[n].public_endpoint for n in names])["nodes"]

    def allowed_ips(self, name: str) -> dict:
        """``wg show wg0 allowed-ips`` of ``name``: {public key: set of networks}."""
        out = self.hosts[name].run(["wg", "show", "wg0", "allowed-ips"], check=False).stdout
        rows = {}
        for line in out.splitlines():
            key, _sep, rest = line.partition("\t")
            rows[key] = {n for n in rest.split() if n != "(none)"}
        return rows

    def pod_ping(self, name: str, source: str, target: str) -> bool:
        return self.hosts[name].run(["ping", "-c", "1", "-W", "2", "-I", source, target], check=False).returncode == 0


@pytest.fixture(scope="module")
def cluster():
    with lab_cluster("pcidr", 4, PodCIDRs, variant="qemu-vtpm") as made:
        for name in ("h1", "h2", "h3", "h4"):
            made.start(name)
        with made.client("h1") as c:
            answer = c.activate_as_coordinator(made.secret.to_uri(), made.salt, made.admin_pem, cluster_config=POD_CONFIG,
                                               init_secret=base64.b64decode(made.lab.init_secret()))
        assert (answer["cluster_pod_cidr"], answer["coordinator_pod_cidr"]) == ("10.244.0.0/16", "10.244.0.0/24")
        rows = made.activate_nodes("h2", "h3")
        assert [(r["ok"], r["action"]) for r in rows] == [(True, "activated")] * 2, rows
        made.before = {name: made.state(name) for name in PEERS}
        yield made


def _pod_address(cluster, name: str) -> str:
    """The first address of ``name``'s pod CIDR: what stands for a pod there (no CNI here: an address on ``lo``)."""
    return str(ipaddress.ip_network(cluster.before[name]["node_pod_cidr"]).network_address + 1)


def _expected(cluster, names) -> dict:
    return {n: {cluster.before[n]["vpn_ip"] + "/32", cluster.before[n]["node_pod_cidr"]} for n in names}


def test_every_wg_show_holds_each_other_peers_vpn_ip_and_pod_cidr(cluster):
    states = cluster.before
    # The Coordinator the first block; the two Nodes, activated together, the next two in either order.
    assert states["h1"]["node_pod_cidr"] == "10.244.0.0/24"
    assert sorted(states[n]["node_pod_cidr"] for n in ("h2", "h3")) == ["10.244.1.0/24", "10.244.2.0/24"]
    assert all(states[n]["cluster_pod_cidr"] == "10.244.0.0/16" for n in PEERS)
    for name in PEERS:
        want = {states[m]["vpn_pub_key"]: ips for m, ips in _expected(cluster, PEERS).items() if m != name}
        until(lambda n=name, w=want: cluster.allowed_ips(n) == w, timeout=20, what="%s's wg show" % name,
              why=lambda n=name: str(cluster.allowed_ips(n)))
        routes = cluster.hosts[name].run(["ip", "route", "show", "10.244.0.0/16"]).stdout
        assert routes.split() == ["10.244.0.0/16", "dev", "wg0", "scope", "link"], routes
    # A pod address of h2 reaches one of h3 through the tunnel (their pod CIDRs are in each other's AllowedIPs).
    for name in ("h2", "h3"):
        cluster.hosts[name].run(["ip", "address", "add", _pod_address(cluster, name) + "/32", "dev", "lo"])
    until(lambda: cluster.pod_ping("h2", _pod_address(cluster, "h2"), _pod_address(cluster, "h3")), timeout=20,
          what="h2's pod address reaches h3's")


def test_a_tampered_node_is_evicted_with_its_pod_cidr(cluster):
    h3 = cluster.before["h3"]
    cluster.lab.tamper("h3")
    for name in ("h1", "h2"):
        until(lambda n=name: h3["vpn_pub_key"] not in cluster.allowed_ips(n), timeout=2 * INTERVAL + 20, interval=0.2,
              what="h3 gone from %s's wg show" % name)
        held = set().union(*cluster.allowed_ips(name).values())
        assert h3["node_pod_cidr"] not in held and h3["vpn_ip"] + "/32" not in held, held
    assert [e["vpn_ip"] for e in cluster.state("h1")["evicted"]] == [h3["vpn_ip"]]
    # The pod range still routes into wg0 on h2: h3's pod CIDR is dropped there, not sent out by the default route.
    route = cluster.hosts["h2"].run(["ip", "route", "get", _pod_address(cluster, "h3")]).stdout
    assert " dev wg0 " in route, route
    assert not cluster.pod_ping("h2", _pod_address(cluster, "h2"), _pod_address(cluster, "h3"))


def test_removal_frees_the_pod_cidr_and_the_next_node_reuses_it(cluster):
    h3 = cluster.before["h3"]
    with cluster.client("h1") as c:
        c.admin_auth(cluster.admin_key)
        removed = dict(c.invoke("RemovePeer", node_vpn_ip=h3["vpn_ip"]))
    assert removed["changed"], removed
    rows = cluster.activate_nodes("h4")
    assert [(r["ok"], r["action"]) for r in rows] == [(True, "activated")], rows
    h4 = cluster.state("h4")
    assert (h4["vpn_ip"], h4["node_pod_cidr"]) == (h3["vpn_ip"], h3["node_pod_cidr"])
    for name in ("h1", "h2"):
        until(lambda n=name: cluster.allowed_ips(n).get(h4["vpn_pub_key"]) == {h4["vpn_ip"] + "/32", h4["node_pod_cidr"]},
              timeout=20, what="h4 in %s's wg show" % name, why=lambda n=name: str(cluster.allowed_ips(n)))


@pytest.fixture(scope="module")
def old_cluster():
    with lab_cluster("pcold", 3, PodCIDRs, variant="qemu-vtpm") as made:
        for name in PEERS:
            made.start(name)
        with made.client("h1") as c:
            answer = c.activate_as_coordinator(made.secret.to_uri(), made.salt, made.admin_pem,
                                               init_secret=base64.b64decode(made.lab.init_secret()))
        assert answer.get("cluster_pod_cidr") is None
        rows = made.activate_nodes("h2", "h3")
        assert [(r["ok"], r["action"]) for r in rows] == [(True, "activated")] * 2, rows
        yield made


def test_a_cluster_activated_without_pod_cidrs_gets_them_with_use_pod_cidrs(old_cluster):
    cluster = old_cluster
    assert all(cluster.state(n)["node_pod_cidr"] is None for n in PEERS)
    with cluster.client("h1") as c:
        c.admin_auth(cluster.admin_key)
        check = dict(c.invoke("UsePodCIDRs", cluster_pod_cidr="10.244.0.0/16", check=True))
        assert check["changed"] and cluster.state("h1")["node_pod_cidr"] is None, check
        done = dict(c.invoke("UsePodCIDRs", cluster_pod_cidr="10.244.0.0/16", node_pod_cidr_mask_size=24))
    assert sorted(a["pod_cidr"] for a in done["allocated"]) == ["10.244.0.0/24", "10.244.1.0/24", "10.244.2.0/24"], done
    until(lambda: all(cluster.state(n)["node_pod_cidr"] for n in PEERS), timeout=20, what="every peer learnt its block")
    cluster.before = {name: cluster.state(name) for name in PEERS}
    for name in PEERS:
        assert cluster.before[name]["cluster_pod_cidr"] == "10.244.0.0/16"
        want = {cluster.before[m]["vpn_pub_key"]: ips for m, ips in _expected(cluster, PEERS).items() if m != name}
        until(lambda n=name, w=want: cluster.allowed_ips(n) == w, timeout=20, what="%s's wg show" % name,
              why=lambda n=name: str(cluster.allowed_ips(n)))
        assert " dev wg0 " in cluster.hosts[name].run(["ip", "route", "get", "10.244.9.1"]).stdout
    with cluster.client("h1") as c:
        c.admin_auth(cluster.admin_key)
        assert not dict(c.invoke("UsePodCIDRs", cluster_pod_cidr="10.244.0.0/16"))["changed"]
