# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The verdict on one peer of site.yml's step 6 and verify.yml (playbooks/tasks/verify_peer.yml): every
problem one line "<peer>: <what is wrong>", none when the peer passed every check. Public values only.

Inputs are what the playbook has: the peer's attested state (agent_state's result), whether the Coordinators
evicted it (a Node, or a Coordinator evicted by the leader) or hold it unverified (not re-attested for a while), and the output of the one command the playbook
runs on the peer for its WireGuard interface
(lines "allowed KEY IPS", "address ADDR/PREFIX", "noip", "ping IP ok|failed", "noping", "now EPOCH",
"handshake KEY EPOCH"; a failed `wg show` exits with its status and stderr). Lines it does not know are
ignored; a value that is not a number counts as 0, as it did in the Jinja template this replaces.

The pod network (docs/site.md, "The pod network"): every other peer that has a pod CIDR (its attested GetState's ``node_pod_cidr``)
must have it among its allowed IPs on this peer's WireGuard interface, and with ``verify_pod_network`` a probe pod on
this peer (module pod_network_probe) must reach its pod gateway, the first address of that CIDR (the ``cni0`` bridge).
"""

from __future__ import annotations

import ipaddress
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

COORDINATOR_STATE = ("ActivatingNodes", "coordinator")
NODE_STATE = ("IsNode", "node")
DEFAULT_HANDSHAKE_MAX_AGE = 180


def _int(text: Any) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        return 0


def _text(value: Any, fallback: str) -> str:
    """value as text, fallback when it is missing or empty (Jinja's default(fallback, true))."""
    return fallback if value is None or value == "" else str(value)


def _since(value: Any) -> str:
    """An epoch time as UTC text (the value itself when it is not a number)."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(value)))
    except (TypeError, ValueError, OverflowError):
        return _text(value, "an unknown time")


def _address(text: str) -> str:
    return text.split("/", 1)[0]


@dataclass
class MeshReport:
    """What the mesh command printed."""
    allowed: Dict[str, List[str]] = field(default_factory=dict)  # peer key -> allowed IPs (prefixes dropped)
    routes: Dict[str, List[str]] = field(default_factory=dict)  # peer key -> allowed IPs as wg prints them (CIDRs)
    addresses: List[str] = field(default_factory=list)  # the interface's addresses (prefixes dropped)
    pings: Dict[str, str] = field(default_factory=dict)  # IP -> "ok" | "failed"
    handshakes: Dict[str, int] = field(default_factory=dict)  # peer key -> epoch of the latest handshake
    now: Optional[int] = None
    noip: bool = False
    noping: bool = False


def parse_mesh_output(lines: Sequence[str]) -> MeshReport:
    report = MeshReport()
    for line in lines:
        fields = str(line).split()
        if len(fields) >= 2 and fields[0] == "allowed":
            report.allowed[fields[1]] = [_address(ip) for ip in fields[2:]]
            report.routes[fields[1]] = fields[2:]
        elif len(fields) == 2 and fields[0] == "address":
            report.addresses.append(_address(fields[1]))
        elif fields == ["noip"]:
            report.noip = True
        elif fields == ["noping"]:
            report.noping = True
        elif len(fields) == 3 and fields[0] == "ping":
            report.pings[fields[1]] = fields[2]
        elif len(fields) == 2 and fields[0] == "now":
            report.now = _int(fields[1])
        elif len(fields) == 3 and fields[0] == "handshake":
            report.handshakes[fields[1]] = _int(fields[2])
    return report


def state_problems(me: str, peer: Mapping[str, Any], *, coordinator: bool, cluster_id_known: bool,
                   cluster_id_missing: str = "") -> List[str]:
    """An attested peer's state, role, etcd member and PCR 15."""
    problems = []
    want_state, want_role = COORDINATOR_STATE if coordinator else NODE_STATE
    if peer.get("state") != want_state or peer.get("role") != want_role:
        problems.append("%s: state %s (role %s), expected %s (role %s)"
                        % (me, peer.get("state"), peer.get("role"), want_state, want_role))
    if coordinator and peer.get("etcd_member") == "stopped":
        problems.append("%s: its etcd member is not running (the Coordinators' shared state has one member less)" % me)
    if not cluster_id_known:
        problems.append("%s: PCR 15 not checked: %s" % (me, _text(cluster_id_missing, "this cluster's ID is not known")))
    elif peer.get("membership") == "fresh":
        problems.append("%s: PCR 15 is not set: the peer is not locked to this cluster" % me)
    elif peer.get("membership") != "ours":
        problems.append("%s: PCR 15 holds another cluster's ID (%s)" % (me, _text(peer.get("pcr15"), "?")))
    return problems


def pod_gateway(pod_cidr: Any) -> str:
    """The pod gateway of a pod CIDR: its first address, which the CNI bridge plugin (isGateway) gives ``cni0``."""
    try:
        network = ipaddress.ip_network(str(pod_cidr), strict=True)
    except ValueError:
        return ""
    return str(network.network_address + 1) if network.num_addresses > 2 else ""


def _probe_answers(probe: Optional[Mapping[str, Any]]) -> Dict[str, bool]:
    """The pod_network_probe result: address -> answered."""
    answers = {}
    for row in (probe or {}).get("results") or []:
        if isinstance(row, Mapping) and row.get("address"):
            answers[str(row["address"])] = bool(row.get("reachable"))
    return answers


def podnet_view(result: Optional[Mapping[str, Any]], others: Sequence[Mapping[str, Any]],
                probe: Optional[Mapping[str, Any]] = None) -> Dict[str, str]:
    """What this peer sees of each other peer's pod CIDR: name -> ``ok``, ``not routed`` (its pod CIDR is not among
    the peer's allowed IPs here), ``no answer`` (the probe pod here did not reach its pod gateway) or ``not checked``
    (the mesh command or the probe did not run or failed). Peers without a pod CIDR are left out."""
    ran = bool(result) and not result.get("skipped") and not result.get("unreachable") and result.get("rc", 1) == 0
    routes = parse_mesh_output(result.get("stdout_lines") or []).routes if ran else {}
    probed = bool(probe) and not probe.get("skipped")
    answers = _probe_answers(probe) if probed and not probe.get("failed") else {}
    view = {}
    for other in others:
        cidr = other.get("pod_cidr")
        if not cidr:
            continue
        name = str(other.get("name"))
        if not ran:
            view[name] = "not checked"
        elif str(cidr) not in routes.get(other.get("key"), []):
            view[name] = "not routed"
        elif not probed:
            view[name] = "ok"
        elif probe.get("failed"):
            view[name] = "not checked"
        else:
            view[name] = "ok" if answers.get(pod_gateway(cidr)) else "no answer"
    return view


def pod_problems(me: str, result: Mapping[str, Any], others: Sequence[Mapping[str, Any]],
                 probe: Optional[Mapping[str, Any]] = None, iface: str = "wg0") -> List[str]:
    """The other peers' pod CIDRs on this peer's WireGuard interface, and (with a probe) the pod traffic to them."""
    report = parse_mesh_output(result.get("stdout_lines") or [])
    problems = []
    if probe and not probe.get("skipped") and probe.get("failed"):
        problems.append("%s: no pod traffic check: the probe pod failed: %s"
                        % (me, _text(probe.get("msg"), "no message").strip()))
    for name, seen in podnet_view(result, others, probe).items():
        other = next(o for o in others if str(o.get("name")) == name)
        if seen == "not routed" and other.get("key") in report.routes:  # no peer at all: reported by mesh_problems
            problems.append("%s: WireGuard peer %s (key %s) does not route its pod CIDR %s on %s (allowed IPs: %s)"
                            % (me, name, other.get("key"), other.get("pod_cidr"), iface,
                               " ".join(report.routes.get(other.get("key"), [])) or "none"))
        elif seen == "no answer":
            problems.append("%s: no pod traffic to %s: a probe pod here got no answer from its pod gateway %s (pod CIDR %s)"
                            % (me, name, pod_gateway(other.get("pod_cidr")), other.get("pod_cidr")))
    return problems


def mesh_problems(me: str, result: Mapping[str, Any], *, iface: str, vpn_ip: str,
                  others: Sequence[Mapping[str, Any]], handshake_max_age: int = DEFAULT_HANDSHAKE_MAX_AGE,
                  pod_probe: Optional[Mapping[str, Any]] = None) -> List[str]:
    """The mesh command's result (a registered command result) against the other peers' attested VPN
    identities (name, key, ip, and pod_cidr when the peer has one); ``pod_probe``: the pod_network_probe result
    (with verify_pod_network), None or skipped without."""
    if result.get("unreachable") or result.get("rc", 1) != 0:
        reason = _text(result.get("stderr"), "") or _text(result.get("msg"), "no output")
        return ["%s: cannot read WireGuard %s: %s" % (me, iface, reason.strip())]
    report = parse_mesh_output(result.get("stdout_lines") or [])
    problems = []
    if report.noip:
        problems.append("%s: its VPN IP on %s not checked: no ip command on the host (install iproute2)" % (me, iface))
    if report.noping:
        problems.append("%s: no traffic check: no ping command on the host (install iputils-ping)" % me)
    if not report.noip and str(vpn_ip) not in report.addresses:
        problems.append("%s: WireGuard %s does not carry its VPN IP %s (addresses: %s)"
                        % (me, iface, vpn_ip, " ".join(report.addresses) or "none"))
    for other in others:
        name, key, ip = other.get("name"), other.get("key"), other.get("ip")
        what = "WireGuard peer %s (key %s, VPN IP %s)" % (name, key, ip)
        if key not in report.allowed:
            problems.append("%s: no %s on %s" % (me, what, iface))
        elif ip not in report.allowed[key]:
            problems.append("%s: %s does not route its VPN IP (allowed IPs: %s)"
                            % (me, what, " ".join(report.allowed[key]) or "none"))
        elif report.now is None:
            problems.append("%s: no traffic check for %s: %s"
                            % (me, name, (_text(result.get("stderr"), "") or "it did not run").strip()))
        else:
            if report.pings.get(ip) != "ok" and not report.noping:
                problems.append("%s: no traffic to %s: ping %s over %s got no answer" % (me, name, ip, iface))
            latest = report.handshakes.get(key, 0)
            if latest == 0:
                problems.append("%s: no WireGuard handshake with %s yet" % (me, name))
            elif report.now - latest > handshake_max_age:
                problems.append("%s: no recent WireGuard handshake with %s (the latest was %d s ago, more than %d s)"
                                % (me, name, report.now - latest, handshake_max_age))
    return problems + pod_problems(me, result, others, pod_probe, iface)


def verify_problems(me: str, *, peer: Mapping[str, Any], attested: bool, pending: bool, coordinator: bool,
                    cluster_id_known: bool, cluster_id_missing: str = "", eviction: Optional[Mapping[str, Any]] = None,
                    unverified: Optional[Mapping[str, Any]] = None, mesh_self: Optional[Mapping[str, Any]] = None,
                    mesh_result: Optional[Mapping[str, Any]] = None,
                    mesh_others: Sequence[Mapping[str, Any]] = (), iface: str = "wg0",
                    handshake_max_age: int = DEFAULT_HANDSHAKE_MAX_AGE,
                    pod_probe: Optional[Mapping[str, Any]] = None) -> List[str]:
    """Every problem of peer ``me``, in the order verify.yml reports them.

    ``attested``: agent_state passed and returned a state; ``pending``: check mode and the run would
    activate or resume the peer (its state is not checked yet); ``mesh_self``: the peer's attested VPN
    identity ({} when it takes no part in the mesh: not attested, pending or evicted); ``mesh_result``:
    the mesh command's registered result (None or skipped: it did not run); ``unverified``: the Coordinator's
    record of the peer when it could not re-attest it for a while (core/eviction/peer_trust.py), {} otherwise."""
    problems = []
    if eviction and eviction.get("role") == "coordinator":
        # A Coordinator evicted by the leader (docs/store.md, "Evicting a Coordinator"): no re-admission.
        reason = _text(eviction.get("reason"), "failed re-attestation")
        if eviction.get("etcd_member") == "kept":
            problems.append("%s: evicted Coordinator (%s), but still an etcd member and in the registry: %s" % (
                me, reason, _text(eviction.get("held"), "no live majority without it")))
        else:
            problems.append("%s: evicted Coordinator (%s): out of the registry and the etcd cluster; it comes back "
                            "only reset and added again as a new Coordinator" % (me, reason))
    elif eviction:
        problems.append("%s: evicted by the Coordinator (%s): it is re-admitted only by add_nodes.yml, once it passes "
                        "attestation again" % (me, _text(eviction.get("reason"), "failed re-attestation")))
    elif unverified:
        problems.append("%s: unverified: the Coordinator could not re-attest it since %s (%s); it gets no new secret "
                        "until a re-attestation passes, and is evicted after unverified_eviction_after" % (
                            me, _since(unverified.get("since")), _text(unverified.get("error"), "unreachable")))
    if not attested:
        problems.append("%s: not attested: %s" % (me, _text(peer.get("msg"), "no attested state")))
    elif not pending:
        problems += state_problems(me, peer, coordinator=coordinator, cluster_id_known=cluster_id_known,
                                   cluster_id_missing=cluster_id_missing)
    if mesh_self and mesh_result is not None and not mesh_result.get("skipped"):
        problems += mesh_problems(me, mesh_result, iface=iface, vpn_ip=mesh_self.get("ip"), others=mesh_others,
                                  handshake_max_age=handshake_max_age, pod_probe=pod_probe)
    return problems
