# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The verdict on one peer (site.yml step 6, verify.yml): module_utils/verify_problems.py and its filter."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.constellation.cluster.plugins.filter.verify import pod_gateway, verify_podnet, verify_problems
from ansible_collections.constellation.cluster.plugins.module_utils.verify_problems import parse_mesh_output

NODE = {"state": "IsNode", "role": "node", "membership": "ours", "pcr15": "ab" * 32, "vpn_ip": "10.118.0.12"}
COORDINATOR = {"state": "ActivatingNodes", "role": "coordinator", "membership": "ours", "etcd_member": "running"}
ME = {"name": "h2", "key": "K2=", "ip": "10.118.0.12"}
OTHERS = [{"name": "h1", "key": "K1=", "ip": "10.118.0.1"}, {"name": "h3", "key": "K3=", "ip": "10.118.0.13"}]
NOW = 1_800_000_000


def mesh(*lines, rc=0, stderr=""):
    return {"rc": rc, "stdout_lines": list(lines), "stderr": stderr, "changed": False}


HEALTHY = ("allowed K1=\t10.118.0.1/32", "allowed K3=\t10.118.0.13/32", "address 10.118.0.12/16",
           "ping 10.118.0.1 ok", "ping 10.118.0.13 ok", "now %d" % NOW,
           "handshake K1=\t%d" % (NOW - 5), "handshake K3=\t%d" % (NOW - 70))


def node(result=None, **changes):
    args = dict(peer=NODE, attested=True, coordinator=False, cluster_id="c2V0", mesh_self=ME,
                mesh_result=mesh(*HEALTHY) if result is None else result, mesh_others=OTHERS)
    args.update(changes)
    return verify_problems("h2", **args)


def test_a_healthy_peer_has_no_problem():
    assert node() == []
    assert verify_problems("h1", peer=COORDINATOR, attested=True, coordinator=True, cluster_id="c2V0") == []


@pytest.mark.parametrize("changes, problems", [
    ({"attested": False, "peer": {"msg": "attestation refused: PCR 4 mismatch"}},
     ["h2: not attested: attestation refused: PCR 4 mismatch"]),
    ({"attested": False, "peer": {}}, ["h2: not attested: no attested state"]),
    ({"peer": dict(NODE, state="AcceptingInit")}, ["h2: state AcceptingInit (role node), expected IsNode (role node)"]),
    ({"peer": dict(NODE, membership="fresh")}, ["h2: PCR 15 is not set: the peer is not locked to this cluster"]),
    ({"peer": dict(NODE, membership="other")}, ["h2: PCR 15 holds another cluster's ID (%s)" % ("ab" * 32)]),
    ({"cluster_id": ""}, ["h2: PCR 15 not checked: this cluster's ID is not known"]),
    ({"cluster_id": "", "cluster_id_missing": "no master secret"}, ["h2: PCR 15 not checked: no master secret"]),
    ({"pending": True, "peer": dict(NODE, state="AcceptingInit", membership="fresh")}, []),  # check mode: not yet
    ({"eviction": {"reason": "PCR 9 changed", "public_ip": "10.42.0.12"}, "mesh_self": {}},
     ["h2: evicted by the Coordinator (PCR 9 changed): it is re-admitted only by add_nodes.yml, once it passes "
      "attestation again"]),
])
def test_state_problems(changes, problems):
    assert node(**changes) == problems


def test_an_evicted_coordinator_is_named_with_its_etcd_membership():
    """The leader evicted a Coordinator that failed re-attestation."""
    removed = {"reason": "attestation failed: PCR 4", "public_ip": "10.42.0.12", "role": "coordinator",
               "etcd_member": "removed"}
    assert verify_problems("h2", peer=COORDINATOR, attested=True, coordinator=True, cluster_id="c2V0",
                           eviction=removed) == [
        "h2: evicted Coordinator (attestation failed: PCR 4): out of the registry and the etcd cluster; it comes back "
        "only reset and added again as a new Coordinator"]
    kept = dict(removed, etcd_member="kept", held="only 1 of the 2 etcd members that would remain answer")
    assert verify_problems("h2", peer=COORDINATOR, attested=True, coordinator=True, cluster_id="c2V0",
                           eviction=kept) == [
        "h2: evicted Coordinator (attestation failed: PCR 4), but still an etcd member and in the registry: only 1 of "
        "the 2 etcd members that would remain answer"]


def test_an_unverified_node_is_named_with_since_when_and_why():
    """A Node the Coordinator could not re-attest for a while (core/eviction/peer_trust.py): a verify.yml row, not an eviction."""
    unverified = {"vpn_ip": "10.118.0.12", "public_ip": "10.42.0.12", "since": NOW, "error": "timed out"}
    assert verify_problems("h2", peer=NODE, attested=True, cluster_id="c2V0", unverified=unverified) == [
        "h2: unverified: the Coordinator could not re-attest it since 2027-01-15 08:00:00 UTC (timed out); it gets no "
        "new secret until a re-attestation passes, and is evicted after unverified_eviction_after"]
    evicted = {"reason": "PCR 9 changed", "public_ip": "10.42.0.12"}
    assert len(verify_problems("h2", peer=NODE, attested=True, cluster_id="c2V0", eviction=evicted,
                               unverified=unverified)) == 1  # evicted: the eviction alone


def test_a_coordinator_needs_its_state_and_etcd_member():
    stopped = dict(COORDINATOR, etcd_member="stopped")
    assert verify_problems("h1", peer=stopped, attested=True, coordinator=True, cluster_id="c2V0") == [
        "h1: its etcd member is not running (the Coordinators' shared state has one member less)"]
    assert verify_problems("h1", peer=NODE, attested=True, coordinator=True, cluster_id="c2V0") == [
        "h1: state IsNode (role node), expected ActivatingNodes (role coordinator)"]


def replaced(old, new):
    return tuple(new if line.startswith(old) else line for line in HEALTHY if new is not None or not line.startswith(old))


@pytest.mark.parametrize("lines, problems", [
    (replaced("allowed K3=", None), ["h2: no WireGuard peer h3 (key K3=, VPN IP 10.118.0.13) on wg0"]),
    (replaced("allowed K3=", "allowed K3=\t10.118.0.99/32"),
     ["h2: WireGuard peer h3 (key K3=, VPN IP 10.118.0.13) does not route its VPN IP (allowed IPs: 10.118.0.99)"]),
    (replaced("address", "address 10.118.0.99/16"),
     ["h2: WireGuard wg0 does not carry its VPN IP 10.118.0.12 (addresses: 10.118.0.99)"]),
    (replaced("address", None), ["h2: WireGuard wg0 does not carry its VPN IP 10.118.0.12 (addresses: none)"]),
    (replaced("address", "noip"),
     ["h2: its VPN IP on wg0 not checked: no ip command on the host (install iproute2)"]),
    (replaced("ping 10.118.0.13", "ping 10.118.0.13 failed"),
     ["h2: no traffic to h3: ping 10.118.0.13 over wg0 got no answer"]),
    (tuple(line for line in HEALTHY if not line.startswith("ping")) + ("noping",),
     ["h2: no traffic check: no ping command on the host (install iputils-ping)"]),
    (replaced("handshake K1=", "handshake K1=\t0"), ["h2: no WireGuard handshake with h1 yet"]),
    (replaced("handshake K1=", "handshake K1=\t%d" % (NOW - 500)),
     ["h2: no recent WireGuard handshake with h1 (the latest was 500 s ago, more than 180 s)"]),
    (replaced("handshake K1=", "handshake K1=\tnot-a-number"), ["h2: no WireGuard handshake with h1 yet"]),
])
def test_mesh_problems(lines, problems):
    assert node(mesh(*lines)) == problems


def test_a_mesh_command_that_failed_or_did_not_finish_is_reported():
    assert node(mesh(rc=1, stderr="Unable to access interface: No such device\n")) == [
        "h2: cannot read WireGuard wg0: Unable to access interface: No such device"]
    assert node({"unreachable": True, "msg": "ATLS: 10.42.0.12:9000: cannot connect"}) == [
        "h2: cannot read WireGuard wg0: ATLS: 10.42.0.12:9000: cannot connect"]
    # The script stopped before it printed the clock: nothing can be said about traffic.
    cut = tuple(line for line in HEALTHY if line.startswith(("allowed", "address")))
    assert node(mesh(*cut, stderr="killed")) == ["h2: no traffic check for h1: killed", "h2: no traffic check for h3: killed"]


def test_a_mesh_check_that_did_not_run_checks_nothing():
    assert node({"skipped": True, "changed": False}) == []
    assert node(mesh(rc=1), mesh_self={}) == []  # not part of the mesh (pending, evicted, not attested)
    assert verify_problems("h2", peer=NODE, attested=True, cluster_id="c2V0", mesh_self=ME, mesh_result=None) == []


def test_handshake_max_age_and_interface_are_the_callers():
    lines = replaced("handshake K3=", "handshake K3=\t%d" % (NOW - 100))
    assert node(mesh(*lines), handshake_max_age="60", interface="wg7") == [
        "h2: no recent WireGuard handshake with h3 (the latest was 100 s ago, more than 60 s)"]


def test_parse_ignores_what_it_does_not_know():
    report = parse_mesh_output(["", "garbage", "allowed", "allowed K=", "ping 1.2.3.4", "now x y", "handshake K="])
    assert report.allowed == {"K=": []} and report.pings == {} and report.now is None and report.handshakes == {}


@pytest.mark.parametrize("changes, message", [
    ({"peer": "IsNode"}, "verify_problems: peer: expected a mapping, got str"),
    ({"mesh_others": "h1"}, "verify_problems: mesh_others: expected a list of {name, key, ip}"),
    ({"mesh_others": ["h1"]}, "verify_problems: mesh_others[0]: expected a mapping, got str"),
    ({"handshake_max_age": "soon"}, "verify_problems: handshake_max_age: expected a number of seconds, got 'soon'"),
    ({"mesh_result": ["rc", 0]}, "verify_problems: mesh_result: expected a mapping, got list"),
])
def test_bad_input_names_the_argument(changes, message):
    with pytest.raises(AnsibleFilterError) as err:
        node(**changes)
    assert str(err.value) == message


POD_OTHERS = [dict(OTHERS[0], pod_cidr="10.244.0.0/24"), dict(OTHERS[1], pod_cidr="10.244.2.0/24")]
POD_HEALTHY = ("allowed K1=\t10.118.0.1/32 10.244.0.0/24", "allowed K3=\t10.118.0.13/32 10.244.2.0/24") + HEALTHY[2:]


def probe(*answered, failed=False, msg=""):
    if failed:
        return {"failed": True, "msg": msg}
    return {"changed": False, "results": [{"address": address, "reachable": address in answered}
                                          for address in ("10.244.0.1", "10.244.2.1")]}


def test_every_other_peers_pod_cidr_is_routed_over_wireguard():
    assert node(mesh(*POD_HEALTHY), mesh_others=POD_OTHERS) == []
    assert verify_podnet(POD_OTHERS, mesh_result=mesh(*POD_HEALTHY)) == {"h1": "ok", "h3": "ok"}
    withdrawn = ("allowed K1=\t10.118.0.1/32", POD_HEALTHY[1]) + POD_HEALTHY[2:]
    assert node(mesh(*withdrawn), mesh_others=POD_OTHERS) == [
        "h2: WireGuard peer h1 (key K1=) does not route its pod CIDR 10.244.0.0/24 on wg0 (allowed IPs: 10.118.0.1/32)"]
    assert verify_podnet(POD_OTHERS, mesh_result=mesh(*withdrawn)) == {"h1": "not routed", "h3": "ok"}
    # A peer without a pod CIDR (bring your own CNI) is not checked for one.
    assert node(mesh(*HEALTHY)) == [] and verify_podnet(OTHERS, mesh_result=mesh(*HEALTHY)) == {}


def test_a_peer_missing_from_wireguard_is_one_problem_not_two():
    lines = (POD_HEALTHY[1],) + POD_HEALTHY[2:]
    assert node(mesh(*lines), mesh_others=POD_OTHERS) == ["h2: no WireGuard peer h1 (key K1=, VPN IP 10.118.0.1) on wg0"]


def test_the_probe_pod_reaches_every_other_peers_pod_gateway():
    assert pod_gateway("10.244.2.0/24") == "10.244.2.1" and pod_gateway("10.244.3.128/25") == "10.244.3.129"
    assert node(mesh(*POD_HEALTHY), mesh_others=POD_OTHERS, pod_probe=probe("10.244.0.1", "10.244.2.1")) == []
    assert node(mesh(*POD_HEALTHY), mesh_others=POD_OTHERS, pod_probe=probe("10.244.2.1")) == [
        "h2: no pod traffic to h1: a probe pod here got no answer from its pod gateway 10.244.0.1 (pod CIDR 10.244.0.0/24)"]
    assert verify_podnet(POD_OTHERS, mesh_result=mesh(*POD_HEALTHY), pod_probe=probe("10.244.2.1")) == {
        "h1": "no answer", "h3": "ok"}
    failed = probe(failed=True, msg="no conflist /etc/cni/net.d/10-constellation.conflist")
    assert node(mesh(*POD_HEALTHY), mesh_others=POD_OTHERS, pod_probe=failed) == [
        "h2: no pod traffic check: the probe pod failed: no conflist /etc/cni/net.d/10-constellation.conflist"]
    assert verify_podnet(POD_OTHERS, mesh_result=mesh(*POD_HEALTHY), pod_probe=failed) == {
        "h1": "not checked", "h3": "not checked"}
    assert verify_podnet(POD_OTHERS, mesh_result={"skipped": True}) == {"h1": "not checked", "h3": "not checked"}


@pytest.mark.parametrize("cidr", ["10.244.0.1/24", "not-a-cidr", "10.244.0.0/31", ""])
def test_pod_gateway_names_what_it_got(cidr):
    with pytest.raises(AnsibleFilterError, match="pod_gateway: expected a pod CIDR"):
        pod_gateway(cidr)
