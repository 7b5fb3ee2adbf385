# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pod network over the attested mesh, end to end (real agents, swtpm, wireguard-go, the real CNI plugins and
nft; lab ``pnpods``: h1 the Coordinator, h2-h4 Nodes, built by site.yml with the defaults; two lab pods per host,
made by the real plugins from each node's conflist; docs/podnet.md):

* every pod pings every pod of the other hosts while tcpdump captures the lab's underlay bridge: the capture holds
  WireGuard UDP between the hosts (and the Coordinator's attested TLS, its re-attestation), and no frame carries a
  pod address or the pings' payload in the clear (and, as a control, the same checks see a ping that does go in
  the clear: a pod's egress to another host's public address, masqueraded by design);
* remove_node.yml frees h3's pod CIDR (gone from every ``wg show``), and the next new node (``lab grow``,
  add_nodes.yml) gets it, and its pods reach the others';
* ``lab tamper`` gets h4 evicted: within the re-attestation interval plus one peer update its pods are unreachable
  from every other pod and its pod CIDR is gone from every ``wg show``, while the others still reach each other.
"""

from __future__ import annotations

import ipaddress
import json
import time

import pytest

from lab import pods as lab_pods
from lab.agent import tail_log
from lab.capture import UnderlayCapture, contains_bytes, not_wireguard, with_addresses_in
from lab.lab import Lab
from tests.support.playbook import LabPlaybooks, PlayRun
from tests.support.wait import until
from ansible_collections.constellation.cluster.plugins.plugin_utils.controller import peer_report

pytestmark = pytest.mark.lab

LAB = "pnpods"
PODS = ("p1", "p2")
CLUSTER_POD_CIDR = ipaddress.ip_network("10.244.0.0/16")  # the default (docs/podnet.md)
WG_PORT = 51820
ATLS_PORT = 9000
# The lab agents' re-attestation interval (lab/agent.py) and peer update poll: the eviction's deadline.
REATTEST_INTERVAL = 30.0
UPDATE_INTERVAL = 0.5
# A ping payload no encrypted frame carries by chance (16 bytes): found in a capture, a ping went in the clear.
PATTERN = "c0ffee00d15ea5e0feedfacecafebabe"


class PodLab(LabPlaybooks):
    """The lab, its inventory, its pods (lab/pods.py, what ``python -m lab pod`` runs) and the hosts' WireGuard."""

    def add_pod(self, host: str, pod: str) -> str:
        """A pod on ``host`` (CNI ADD with the node's conflist, the real plugins); its address."""
        return lab_pods.add(self.lab.host(host), pod)["ip"]

    def pod_exec(self, host: str, pod: str, *argv: str):
        return lab_pods.run(self.lab.host(host), pod, list(argv), check=False)

    def status(self, name: str):
        return peer_report(self.lab.host(name).public_endpoint, self.attestation_settings(), None, self.admin_key())

    def allowed_ips(self, name: str) -> dict:
        """``wg show wg0 allowed-ips`` of ``name``: public key -> set of networks."""
        out = self.lab.host(name).run(["wg", "show", "wg0", "allowed-ips"], check=False).stdout
        rows = {}
        for line in out.splitlines():
            fields = line.split()
            if fields:
                rows[fields[0]] = {n for n in fields[1:] if n != "(none)"}
        return rows

    def routed(self, name: str) -> set:
        """Every network in ``name``'s WireGuard AllowedIPs."""
        return set().union(set(), *self.allowed_ips(name).values())


def played(run: PlayRun) -> PlayRun:
    """The run, once it succeeded (its output's tail otherwise)."""
    assert run.ok, run.stdout[-4000:]
    return run


@pytest.fixture(scope="module")
def pods(tmp_path_factory):
    inv = tmp_path_factory.mktemp("podnet-inventory")
    lab = Lab(LAB, inventory_dir=inv)
    try:
        made = PodLab(lab.up(hosts=4, tpm=True, agents=True), inv)
        played(made.play("site.yml"))  # the defaults: the pod network on, verify's mesh and pod CIDR checks
        made.pod_ips = {}
        for host in ("h1", "h2", "h3", "h4"):
            for pod in PODS:
                made.pod_ips[(host, pod)] = made.add_pod(host, pod)
        yield made
    finally:
        lab.down()


# ------------------------------------------------------------------------------------------------ helpers
def _ping_script(ips) -> str:
    """A shell loop that pings each address once (the pattern as payload) and prints ``ok IP`` or ``fail IP``."""
    return "; ".join("if ping -n -c 1 -W 2 -p %s %s >/dev/null 2>&1; then echo ok %s; else echo fail %s; fi"
                     % (PATTERN, ip, ip, ip) for ip in ips)


def ping_matrix(pods: PodLab, sources, targets) -> dict:
    """(source pod, target pod) -> whether one ping from inside the source answered; every source pings each
    target of another host (one ``lab pod exec`` per source)."""
    results = {}
    for src in sources:
        dests = [dst for dst in targets if dst[0] != src[0]]
        if not dests:
            continue
        out = pods.pod_exec(src[0], src[1], "sh", "-c", _ping_script(pods.pod_ips[d] for d in dests)).stdout
        answered = {line.split()[1] for line in out.splitlines() if line.startswith("ok ")}
        for dst in dests:
            results[(src, dst)] = pods.pod_ips[dst] in answered
    return results


def _failed(matrix: dict) -> list:
    return ["%s/%s -> %s/%s" % (a + b) for (a, b), ok in sorted(matrix.items()) if not ok]


def _pods_of(*hosts) -> list:
    return [(h, p) for h in hosts for p in PODS]


def cleartext(packets) -> list:
    """The frames that name a pod address in their headers, or carry the pings' payload: none when nothing of a
    pod travels in the clear."""
    return [str(p) for p in with_addresses_in(packets, str(CLUSTER_POD_CIDR))] \
        + ["the pings' payload in %s" % p for p in contains_bytes(packets, bytes.fromhex(PATTERN))]


def between_hosts(packets, hosts) -> tuple:
    """(how many WireGuard frames, the other IPv4 frames) between two hosts' public addresses; the Coordinator's
    re-attestation (attested TLS, port 9000) is neither."""
    publics = {h.public_ip for h in hosts}
    among = [p for p in packets if p.kind == "ipv4" and {p.src, p.dst} <= publics]
    other = [p for p in not_wireguard(among, WG_PORT) if not (p.proto == "tcp" and ATLS_PORT in (p.sport, p.dport))]
    return len(among) - len(not_wireguard(among, WG_PORT)), [str(p) for p in other]


def _pod_cidr(pods: PodLab, name: str, key: str, observer: str) -> str:
    """The pod CIDR ``observer``'s WireGuard gives ``name``'s key: its AllowedIPs but its VPN IP's /32."""
    nets = pods.allowed_ips(observer).get(key, set())
    return "".join(n for n in nets if ipaddress.ip_network(n).prefixlen < 32)


# ------------------------------------------------------------------------------------------------ the tests
def test_every_pod_reaches_every_pod_of_the_other_hosts_and_nothing_leaves_in_the_clear(pods, tmp_path):
    hosts = ("h1", "h2", "h3", "h4")
    # Each peer's WireGuard holds every other peer's VPN IP and pod CIDR; the pods' addresses are in their node's.
    cidrs = {}
    for name in hosts:
        status = pods.status(name)
        for observer in hosts:
            if observer != name:
                cidrs.setdefault(name, set()).add(_pod_cidr(pods, name, status.vpn_pub_key, observer))
    assert all(len(seen) == 1 and "" not in seen for seen in cidrs.values()), cidrs
    cidrs = {name: ipaddress.ip_network(seen.pop()) for name, seen in cidrs.items()}
    assert len(set(cidrs.values())) == 4 and all(c.subnet_of(CLUSTER_POD_CIDR) for c in cidrs.values()), cidrs
    for (host, pod), ip in pods.pod_ips.items():
        assert ipaddress.ip_address(ip) in cidrs[host], (host, pod, ip, cidrs[host])
    # One route for the whole pod range into wg0 (none per peer), the host's own pod CIDR on cni0.
    for name in hosts:
        routes = json.loads(pods.lab.host(name).run(["ip", "-j", "-4", "route", "show"]).stdout)
        in_range = sorted((r["dst"], r.get("dev")) for r in routes
                          if r["dst"] != "default" and ipaddress.ip_network(r["dst"]).subnet_of(CLUSTER_POD_CIDR))
        assert in_range == sorted([(str(CLUSTER_POD_CIDR), "wg0"), (str(cidrs[name]), "cni0")]), (name, in_range)
    # Every pod pings every pod of the other hosts (8 pods: 48 pings) under the capture.
    with UnderlayCapture(pods.lab, tmp_path / "pings.pcap") as capture:
        matrix = ping_matrix(pods, _pods_of(*hosts), _pods_of(*hosts))
    assert len(matrix) == 48 and not _failed(matrix), _failed(matrix)
    assert not cleartext(capture.packets), cleartext(capture.packets)[:20]
    wireguard, other = between_hosts(capture.packets, pods.lab.hosts)
    assert not other, other[:20]
    assert wireguard >= 2 * len(matrix), (wireguard, len(capture.packets))  # a request and a reply each, at least
    print("48 pings: %d frames on the underlay, %d of them WireGuard between hosts" % (len(capture.packets), wireguard))
    # The control: a ping that does go in the clear (a pod's egress to another host's public address, masqueraded
    # to its host's address by design) is seen by the same checks, payload and all, without a pod address.
    with UnderlayCapture(pods.lab, tmp_path / "egress.pcap") as egress:
        answered = pods.pod_exec("h1", "p1", "ping", "-n", "-c", "1", "-W", "2", "-p", PATTERN,
                                 pods.lab.host("h2").public_ip)
    assert answered.returncode == 0, answered.stdout + answered.stderr
    seen = contains_bytes(egress.packets, bytes.fromhex(PATTERN))
    assert {(p.src, p.dst) for p in seen} >= {(pods.lab.host("h1").public_ip, pods.lab.host("h2").public_ip)}, seen
    assert not with_addresses_in(egress.packets, str(CLUSTER_POD_CIDR))


def test_a_removed_nodes_cidr_is_freed_and_a_new_node_gets_it_and_reaches_the_others(pods):
    h3 = pods.status("h3")
    h3_cidr = _pod_cidr(pods, "h3", h3.vpn_pub_key, "h1")
    assert h3_cidr
    played(pods.play("playbooks/remove_node.yml", "-e", "node=h3"))
    until(lambda: all(h3_cidr not in pods.routed(n) and h3.vpn_pub_key not in pods.allowed_ips(n)
                      for n in ("h1", "h2", "h4")), what="h3's key and pod CIDR gone from every wg show")
    assert [r["vpn_ip"] for r in pods.status("h1").removed] == [h3.vpn_ip]
    # A new host boots; add_nodes.yml (h3, removed and reset, stays out of the run) activates it: it gets the
    # freed pod CIDR (the lowest free one), every peer routes it to h5, and its pods reach the others'.
    pods.lab.grow(5)
    played(pods.play("playbooks/add_nodes.yml", "--limit", "all:!h3"))
    h5 = pods.status("h5")
    assert h5.state == "IsNode"
    until(lambda: all(_pod_cidr(pods, "h5", h5.vpn_pub_key, n) == h3_cidr for n in ("h1", "h2", "h4")),
          what="h5 holding h3's freed pod CIDR in every wg show")
    for pod in PODS:
        pods.pod_ips[("h5", pod)] = pods.add_pod("h5", pod)
        assert ipaddress.ip_address(pods.pod_ips[("h5", pod)]) in ipaddress.ip_network(h3_cidr)
    others = _pods_of("h1", "h2", "h4")
    matrix = ping_matrix(pods, _pods_of("h5"), others)
    matrix.update(ping_matrix(pods, others, _pods_of("h5")))
    assert len(matrix) == 24 and not _failed(matrix), _failed(matrix)


def test_an_evicted_nodes_pods_drop_off_within_the_reattestation_interval_plus_one_update(pods, tmp_path):
    members = ("h1", "h2", "h5")
    h4 = pods.status("h4")
    h4_cidr = _pod_cidr(pods, "h4", h4.vpn_pub_key, "h1")
    assert h4_cidr
    before = ping_matrix(pods, _pods_of(*members), _pods_of("h4"))
    assert not _failed(before), _failed(before)
    pods.lab.tamper("h4")  # what `python -m lab tamper h4` does: its boot chain measured something else
    start = time.monotonic()
    until(lambda: all(h4_cidr not in pods.routed(n) for n in members),
          timeout=REATTEST_INTERVAL + UPDATE_INTERVAL + 15, interval=0.2,
          what="h4's pod CIDR gone from every member's wg show", why=lambda: tail_log(pods.lab.host("h1")))
    print("h4's pod CIDR %s left every member's wg show %.1f s after the tamper" % (h4_cidr, time.monotonic() - start))
    evicted = pods.status("h1").evicted
    assert [e["vpn_ip"] for e in evicted] == [h4.vpn_ip] and "PCR 9" in evicted[0]["reason"], evicted
    # Its pods are unreachable from every other pod, and what is sent to them does not leave in the clear.
    with UnderlayCapture(pods.lab, tmp_path / "evicted.pcap") as capture:
        after = ping_matrix(pods, _pods_of(*members), _pods_of("h4"))
        back = ping_matrix(pods, _pods_of("h4"), _pods_of(*members))
    assert after and not any(after.values()), after
    assert back and not any(back.values()), back
    assert not cleartext(capture.packets), cleartext(capture.packets)[:20]
    # The members still reach each other.
    rest = ping_matrix(pods, _pods_of(*members), _pods_of(*members))
    assert not _failed(rest), _failed(rest)
