# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's side of the chain of trust (docs/site.md: attestation, activation, recovery): the
orchestration the cluster actions run (controller-only, so it may
use the RPC client). Their options are in module_utils/controller_options.py.

Each operation attests the peer first (aTLS verifies before the first byte is sent), asks its
state, and decides from the attested PCR 15 whether there is anything to do, so every operation
is idempotent. The action plugins activate_coordinator, activate_nodes, agent_state and
recover_peer are thin adapters over these functions. Secrets (KMS URI) are arguments only: no
return value and no error message here ever contains them.
"""

from __future__ import annotations

import base64
import contextlib
import hmac
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence

from ansible_collections.constellation.cluster.plugins.module_utils import atls, constants
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import (
    FRESH, OTHER, OURS, AttestationSettings, cluster_membership, membership_without_pcrs, pcr_rows)
from ansible_collections.constellation.cluster.plugins.module_utils.encoding import b64decode
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    REASON_NOT_WAITING_FOR_RECOVERY, AttestationError, ConstellationError, InputError, PeerUnreachable, StateError)
from ansible_collections.constellation.cluster.plugins.module_utils.netns import create_connection
from ansible_collections.constellation.cluster.plugins.plugin_utils.peer_plan import Action, plan_peer


ACCEPTING_INIT = constants.STATE_ACCEPTING_INIT
ACTIVATING_NODES = constants.STATE_ACTIVATING_NODES
IS_NODE = constants.STATE_IS_NODE
NODE_WAITING = constants.STATE_NODE_WAITING_FOR_CLUSTER_JOIN
ROLE_COORDINATOR = constants.ROLE_COORDINATOR
ROLE_NODE = constants.ROLE_NODE
# activate_nodes attests the peers it is given this many at a time (each a TLS handshake with a quote:
# mostly waiting for the peer's TPM), not one after the other (63 in a row at 64 hosts).
ATTEST_WORKERS = 16


@dataclass
class PeerReport:
    """What the controller learnt from one attested GetState."""

    endpoint: str
    state: str
    role: str
    membership: str  # FRESH, OURS or OTHER (PCR 15)
    pcrs: List[Dict[str, Any]] = field(default_factory=list)  # the policy table
    pcr15: str = ""
    warnings: List[str] = field(default_factory=list)
    vpn_ip: Optional[str] = None  # from GetState, once the peer is activated
    vpn_pub_key: Optional[str] = None
    # The Coordinator's evicted peers (failed re-attestation): [{vpn_ip, vpn_pub_key, public_ip, reason, ts}].
    evicted: List[Dict[str, Any]] = field(default_factory=list)
    # The Coordinator's unverified Nodes (not re-attested for a while; no new secret): [{vpn_ip, public_ip, since, error}].
    unverified: List[Dict[str, Any]] = field(default_factory=list)
    # The Nodes the admin removed (remove_node.yml): [{vpn_ip, vpn_pub_key, public_ip, role, disk_uuid, ts}].
    removed: List[Dict[str, Any]] = field(default_factory=list)
    # A Coordinator sharing the state in etcd: its member is "running" or "stopped" (one member less).
    etcd_member: Optional[str] = None
    # Whether the peer's state is on its encrypted state disk: {encrypted, device, luks_uuid, open, message}.
    state_disk: Optional[Dict[str, Any]] = None
    # PCR 13's events (the agent's code and trust configuration; None in image mode, where the agent extends
    # nothing) and whether its secrets at rest are sealed.
    agent_measurement: Optional[Dict[str, Any]] = None
    secrets_at_rest: Optional[Dict[str, Any]] = None
    # The peer set's version a Node applied or a Coordinator holds (details only).
    peer_resource_version: Optional[int] = None
    # How the agent is deployed (host or image) and whether the host's root is trusted on the peer
    # (attestation/deployment.py: only in host mode).
    deployment_mode: Optional[str] = None
    host_root_trusted: Optional[bool] = None
    # An SEV-SNP peer's verified report (Validation.snp: AMD's field names, product, signing_key); None for a TPM one.
    snp: Optional[Dict[str, Any]] = None
    # The pod network (docs/wireguard.md, "Pod CIDRs"): the peer's own pod CIDR and the cluster's pod range (details).
    node_pod_cidr: Optional[str] = None
    cluster_pod_cidr: Optional[str] = None

    def to_dict(self) -> Dict[str, Any]:
        return {"endpoint": self.endpoint, "state": self.state, "role": self.role, "membership": self.membership,
                "pcrs": list(self.pcrs), "pcr15": self.pcr15, "warnings": list(self.warnings),
                "vpn_ip": self.vpn_ip, "vpn_pub_key": self.vpn_pub_key, "evicted": list(self.evicted),
                "unverified": list(self.unverified),
                "removed": list(self.removed),
                "etcd_member": self.etcd_member, "state_disk": self.state_disk,
                "agent_measurement": self.agent_measurement, "secrets_at_rest": self.secrets_at_rest,
                "peer_resource_version": self.peer_resource_version,
                "deployment_mode": self.deployment_mode, "host_root_trusted": self.host_root_trusted,
                "snp": self.snp, "node_pod_cidr": self.node_pod_cidr, "cluster_pod_cidr": self.cluster_pod_cidr}


class Planned(NamedTuple):
    """One peer of activate_nodes: its report, the role it is given as, and what is done with it."""

    report: PeerReport
    as_role: str
    action: Action


def open_peer(endpoint: str, settings: AttestationSettings):
    """An AgentClient on an attested connection; AttestationError (with ``checks``) when refused."""
    from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient

    from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import connect_enrolling

    host, port = atls.parse_endpoint(endpoint)

    def connect(validators):
        try:
            sock = create_connection((host, port), settings.timeout, settings.netns)
        except OSError as err:
            raise PeerUnreachable("cannot connect to %s: %s" % (endpoint, err.strerror or err)) from None
        return AgentClient.connect(endpoint, validators, sock=sock, timeout=settings.timeout)

    try:
        return connect_enrolling(connect, settings.validators())
    except AttestationError as err:
        raise _prefixed(err, "%s: " % endpoint) from None


@contextlib.contextmanager
def open_coordinator(endpoint: str, settings: AttestationSettings, admin_priv_key, cluster_id: Optional[bytes],
                     purpose: str = "") -> Iterator[Any]:
    """An attested connection to an activated Coordinator of this cluster (PCR 15 ours, where ``cluster_id`` is
    known), after AdminAuth: what every admin operation on the Coordinator opens (activate_nodes, RemovePeer,
    ExportState). Anything else is refused before the admin key is proven, naming what the peer is."""
    with open_peer(endpoint, settings) as client:
        # A variant that quotes no PCRs: the admin key proven to decide the membership (report_of) serves here too.
        quotes_pcrs = bool(client.attested.validation.pcrs)
        report = report_of(client, endpoint, cluster_id, None if quotes_pcrs else admin_priv_key)
        if report.role != ROLE_COORDINATOR or report.state != ACTIVATING_NODES \
                or (cluster_id is not None and report.membership != OURS):
            raise StateError("%s is not an activated Coordinator of this cluster (%s, role %s, PCR 15 %s)%s"
                             % (endpoint, report.state, report.role, report.membership, purpose))
        if quotes_pcrs:
            client.admin_auth(admin_priv_key)
        yield client


def _prefixed(err: AttestationError, prefix: str) -> AttestationError:
    new = AttestationError(prefix + str(err))
    for name in ("checks", "warnings"):
        if hasattr(err, name):
            setattr(new, name, getattr(err, name))
    return new


def report_of(client, endpoint: str, cluster_id: Optional[bytes], admin_priv_key=None) -> PeerReport:
    """``admin_priv_key``: GetState tells anyone only state and role (least disclosure); with the admin key an
    activated (or waiting) peer's details (VPN IP and key, evicted peers, etcd member) are read after AdminAuth on this
    connection. A peer that refuses the key (not ours) keeps its details; the caller decides from the state."""
    validation = client.attested.validation
    state = client.get_state()
    key_accepted = None
    if admin_priv_key is not None and state.get("state") in (ACTIVATING_NODES, NODE_WAITING, IS_NODE):
        from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import RemoteError

        try:
            client.admin_auth(admin_priv_key)
        except RemoteError:
            key_accepted = False
        else:
            key_accepted = True
            state = client.get_state()
    pcr15 = validation.pcrs.get(15, b"")
    # A variant that quotes no PCRs (sev-snp): the attested agent's own word replaces PCR 15.
    membership = (cluster_membership(validation.pcrs, cluster_id) if validation.pcrs
                  else membership_without_pcrs(str(state.get("state")), key_accepted))
    return PeerReport(endpoint=endpoint, state=str(state.get("state")), role=str(state.get("role")),
                      membership=membership, pcrs=pcr_rows(validation.checks),
                      pcr15=pcr15.hex(), warnings=list(validation.warnings), vpn_ip=_opt_str(state.get("vpn_ip")),
                      vpn_pub_key=_opt_str(state.get("vpn_pub_key")),
                      evicted=[dict(e) for e in state.get("evicted") or () if isinstance(e, dict)],
                      unverified=[dict(e) for e in state.get("unverified") or () if isinstance(e, dict)],
                      removed=[dict(e) for e in state.get("removed") or () if isinstance(e, dict)],
                      etcd_member=_opt_str(state.get("etcd_member")),
                      state_disk=dict(state["state_disk"]) if isinstance(state.get("state_disk"), dict) else None,
                      agent_measurement=_opt_dict(state.get("agent_measurement")),
                      secrets_at_rest=_opt_dict(state.get("secrets_at_rest")),
                      peer_resource_version=_opt_int(state.get("peer_resource_version")),
                      deployment_mode=_opt_str(state.get("deployment_mode")),
                      host_root_trusted=state["host_root_trusted"] if isinstance(state.get("host_root_trusted"), bool) else None,
                      snp=dict(validation.snp) if validation.snp else None,
                      node_pod_cidr=_opt_str(state.get("node_pod_cidr")),
                      cluster_pod_cidr=_opt_str(state.get("cluster_pod_cidr")))


def _opt_dict(value: Any) -> Optional[Dict[str, Any]]:
    return dict(value) if isinstance(value, dict) else None


def _opt_int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _opt_str(value: Any) -> Optional[str]:
    return value if isinstance(value, str) and value else None


def peer_report(endpoint: str, settings: AttestationSettings, cluster_id: Optional[bytes] = None,
                admin_priv_key=None) -> PeerReport:
    """Attests the peer and asks its state (read-only; its details with ``admin_priv_key``, see report_of)."""
    with open_peer(endpoint, settings) as client:
        return report_of(client, endpoint, cluster_id, admin_priv_key)


def decode_salt(value: Any, field_name: str = "measurement_salt") -> bytes:
    """The measurement salt from standard base64 (32 bytes)."""
    return b64decode(value, field_name, 32, strip=True)


def derive_cluster_id(kms_uri: str, measurement_salt: bytes) -> bytes:
    from ansible_collections.constellation.cluster.plugins.module_utils.kms import cluster_id, open_kms

    return cluster_id(open_kms(kms_uri), measurement_salt)


def activate_coordinator(endpoint: str, settings: AttestationSettings, kms_uri: str, measurement_salt: bytes,
                         admin_pub_key: str, admin_priv_key=None, storage_uri: Optional[str] = None,
                         cluster_config: Optional[Mapping[str, Any]] = None,
                         check_mode: bool = False, init_secret: Optional[str] = None) -> Dict[str, Any]:
    """Activates the Coordinator unless it already is ours. Returns changed, cluster_id (b64),
    coordinator_vpn_ip, coordinator_vpn_pub_key, state. ``init_secret``: the cluster's init secret
    (std base64), proven to a peer provisioned with an init_secret_hash."""
    from ansible_collections.constellation.cluster.plugins.module_utils.kms.init_secret import parse_init_secret

    secret = parse_init_secret(init_secret) if init_secret else None
    cluster_id = derive_cluster_id(kms_uri, measurement_salt)
    result: Dict[str, Any] = {"cluster_id": base64.b64encode(cluster_id).decode(), "changed": False}
    with open_peer(endpoint, settings) as client:
        report = report_of(client, endpoint, cluster_id, admin_priv_key)
        result["state_before"] = report.state
        if report.membership == OURS:
            if report.role != ROLE_COORDINATOR or report.state != ACTIVATING_NODES:
                raise StateError("%s belongs to this cluster but is %s (role %s), not an activated Coordinator"
                                 % (endpoint, report.state, report.role))
            result["state"] = report.state
            if admin_priv_key is not None:
                client.admin_auth(admin_priv_key)  # the admin key pinned at activation is still ours
            result.update(coordinator_vpn_ip=report.vpn_ip, coordinator_vpn_pub_key=report.vpn_pub_key,
                          cluster_pod_cidr=report.cluster_pod_cidr, coordinator_pod_cidr=report.node_pod_cidr)
            _use_pod_cidrs(client, report, dict(cluster_config or {}), admin_priv_key, check_mode, result)
            return result
        if report.membership == OTHER:
            raise StateError("%s is locked to another cluster (PCR 15 %s does not hold the cluster ID derived from "
                             "this KMS URI and measurement salt); it is not activated again"
                             % (endpoint, report.pcr15))
        if report.state != ACCEPTING_INIT:
            raise StateError("%s is %s: only a peer in AcceptingInit can be activated as Coordinator"
                             % (endpoint, report.state))
        result["changed"] = True
        if check_mode:
            result.update(state=report.state, coordinator_vpn_ip=None, coordinator_vpn_pub_key=None,
                          cluster_pod_cidr=None, coordinator_pod_cidr=None)
            return result
        answer = client.activate_as_coordinator(kms_uri, measurement_salt, admin_pub_key, storage_uri=storage_uri,
                                                cluster_config=dict(cluster_config or {}), init_secret=secret)
    answered = base64.b64decode(answer.get("cluster_id", ""))
    if not hmac.compare_digest(answered, cluster_id):
        raise StateError("%s answered another cluster ID than the one derived on the controller" % endpoint)
    result.update(state=answer.get("state"), coordinator_vpn_ip=answer.get("coordinator_vpn_ip"),
                  coordinator_vpn_pub_key=answer.get("coordinator_vpn_pub_key"),
                  cluster_pod_cidr=answer.get("cluster_pod_cidr"), coordinator_pod_cidr=answer.get("coordinator_pod_cidr"))
    return result


def _use_pod_cidrs(client, report: PeerReport, config: Mapping[str, Any], admin_priv_key, check_mode: bool,
                   result: Dict[str, Any]) -> None:
    """An activated Coordinator without the pod range asked for (a cluster activated before pod CIDRs existed):
    UsePodCIDRs gives every Coordinator and Node one (docs/wireguard.md, "Pod CIDRs"). Nothing is sent when it has
    that range already, or without the admin's key (which reads and changes it); another range is refused by the
    Coordinator."""
    wanted = config.get("cluster_pod_cidr")
    if not wanted or admin_priv_key is None or report.cluster_pod_cidr == wanted:
        return
    answer = client.invoke("UsePodCIDRs", cluster_pod_cidr=wanted,
                           node_pod_cidr_mask_size=config.get("node_pod_cidr_mask_size"), check=bool(check_mode))
    result.update(changed=bool(answer.get("changed")), cluster_pod_cidr=answer.get("cluster_pod_cidr"),
                  coordinator_pod_cidr=answer.get("coordinator_pod_cidr"), pod_cidrs_allocated=answer.get("allocated") or [])


def activate_nodes(coordinator_public_endpoint: str, node_public_endpoints: List[str], settings: AttestationSettings,
                   admin_priv_key, cluster_id: Optional[bytes] = None, check_mode: bool = False,
                   coordinator_public_endpoints: Sequence[str] = (),
                   control_plane_public_endpoints: Sequence[str] = (),
                   node_names: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """``control_plane_public_endpoints``: those of ``node_public_endpoints`` the admin designates control
    planes (recorded by the Coordinator at their activation). ``node_names``: endpoint -> the node's name (its
    inventory name), its only kubelet node name.

    Attests every further Coordinator and node, then asks the Coordinator (admin-authenticated) to
    activate the fresh ones (Coordinators first) and to resume nodes locked to our cluster whose
    activation was interrupted (NodeWaitingForClusterJoin). What to do with each peer is plan_peer's decision
    (peer_plan.py); this attests, plans every peer, refuses the run if any peer is refused, and executes the plan.
    Returns changed and one row per peer: endpoint, role, state_before, action (none, activate, resume, readmit),
    node_vpn_ip."""
    planes = set(control_plane_public_endpoints or ())
    if not planes <= set(node_public_endpoints):
        raise InputError("control_plane_public_endpoints", "endpoints of node_public_endpoints",
                         ", ".join(sorted(planes - set(node_public_endpoints))))
    # The activating Coordinator is no further Coordinator of its own: an inventory's whole group may be given.
    further = list(dict.fromkeys(e for e in coordinator_public_endpoints if e != coordinator_public_endpoint))
    nodes = list(dict.fromkeys(node_public_endpoints))  # unique, in order
    reports = _reports(further + nodes, settings, cluster_id, admin_priv_key)
    # Nodes the Coordinator evicted (failed re-attestation) come back only this way, once they pass again.
    evicted, removed = set(), set()
    if node_public_endpoints:
        evicted_rows, removed_rows = _coordinator_outcasts(coordinator_public_endpoint, settings, cluster_id, admin_priv_key)
        evicted = {e.get("vpn_ip") for e in evicted_rows}
        removed = {e.get("vpn_pub_key") for e in removed_rows}
    plan: List[Planned] = []
    for endpoint, as_role in [(e, ROLE_COORDINATOR) for e in further] + [(e, "node") for e in nodes]:
        report = reports[endpoint]
        plan.append(Planned(report, as_role, plan_peer(as_role, report.membership, report.state, report.role,
                                                       cluster_id_known=cluster_id is not None,
                                                       evicted=report.vpn_ip in evicted,
                                                       removed=bool(report.vpn_pub_key) and report.vpn_pub_key in removed)))
    refused = [p.action.reason(p.report) for p in plan if p.action.refused]
    if refused:
        raise StateError("cannot activate these peers: " + "; ".join(refused))
    rows = [{"endpoint": p.report.endpoint, "role": p.as_role, "state_before": p.report.state,
             "node_vpn_ip": p.report.vpn_ip, "action": p.action.row} for p in plan]
    fresh = [p.report.endpoint for p in plan if p.action.sent and p.as_role != ROLE_COORDINATOR]
    fresh_coordinators = [p.report.endpoint for p in plan if p.action.sent and p.as_role == ROLE_COORDINATOR]
    result: Dict[str, Any] = {"changed": bool(fresh or fresh_coordinators), "nodes": rows, "resource_version": None}
    if not (fresh or fresh_coordinators) or check_mode:
        return result
    with open_coordinator(coordinator_public_endpoint, settings, admin_priv_key, cluster_id) as client:
        answer = client.activate_additional_nodes(fresh, coordinator_public_endpoints=fresh_coordinators,
                                                  control_plane_endpoints=[e for e in fresh if e in planes],
                                                  node_names={e: n for e, n in (node_names or {}).items() if e in fresh})
    by_endpoint = {n.get("node_public_endpoint"): n for n in answer.get("nodes", [])}
    failures = []
    for row, planned in zip(rows, plan):
        if not planned.action.sent:
            continue
        node = by_endpoint.get(row["endpoint"], {})
        row["node_vpn_ip"] = node.get("node_vpn_ip")
        if not node.get("ok"):
            failures.append("%s: %s" % (row["endpoint"], node.get("error") or "not activated"))
    result["resource_version"] = answer.get("resource_version")
    if failures:
        err = StateError("the Coordinator could not activate: " + "; ".join(failures))
        err.rows = rows  # type: ignore[attr-defined]
        raise err
    return result


def _reports(endpoints: List[str], settings: AttestationSettings, cluster_id: Optional[bytes],
             admin_priv_key) -> Dict[str, PeerReport]:
    """{endpoint: attested report}, ATTEST_WORKERS peers at a time; the first refusal (in the order given) is raised."""
    if not endpoints:
        return {}
    with ThreadPoolExecutor(max_workers=min(ATTEST_WORKERS, len(endpoints)), thread_name_prefix="attest") as pool:
        return dict(zip(endpoints, pool.map(lambda e: peer_report(e, settings, cluster_id, admin_priv_key), endpoints)))


def _coordinator_outcasts(endpoint: str, settings: AttestationSettings, cluster_id: Optional[bytes],
                          admin_priv_key=None):
    """(evicted, removed) from the Coordinator's attested GetState after AdminAuth (([], []) if it is not an
    activated Coordinator of this cluster)."""
    try:
        report = peer_report(endpoint, settings, cluster_id, admin_priv_key)
    except ConstellationError:
        return [], []
    if report.role != ROLE_COORDINATOR or (cluster_id is not None and report.membership != OURS):
        return [], []
    return report.evicted, report.removed


REJOIN_TIMEOUT = 60.0
REJOIN_POLL = 0.5


def recover_peer(endpoint: str, settings: AttestationSettings, kms_uri: str, cluster_id: Optional[bytes],
                 check_mode: bool = False, rejoin_timeout: float = REJOIN_TIMEOUT) -> Dict[str, Any]:
    """Recovers a rebooted peer of this cluster (PCR 15 reset, state stored): the Coordinator gets the
    KMS URI (Recover); a Node never does: it rejoins by itself with a ticket from its Coordinator
    (IssueRejoinTicket), and this waits (attested GetState) until it has."""
    with open_peer(endpoint, settings) as client:
        report = report_of(client, endpoint, cluster_id)
        result: Dict[str, Any] = {"changed": False, "state_before": report.state, "state": report.state}
        if report.membership == OURS:
            return result
        if report.membership == OTHER:
            raise StateError("%s is locked to another cluster (PCR 15 %s)" % (endpoint, report.pcr15))
        if report.state != ACCEPTING_INIT:
            raise StateError("%s is %s with PCR 15 reset: it cannot be recovered" % (endpoint, report.state))
        if check_mode:
            result["changed"] = report.role in (ROLE_COORDINATOR, ROLE_NODE)
            return result
        if report.role == ROLE_NODE:
            return _wait_for_rejoin(endpoint, settings, cluster_id, result, rejoin_timeout)
        from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import RemoteError
        try:
            answer = client.recover(kms_uri)
        except RemoteError as err:
            if err.kind == "StateError" and err.reason == REASON_NOT_WAITING_FOR_RECOVERY:
                # A fresh peer that never joined: nothing to recover (activate it with site.yml).
                result["note"] = "never activated: nothing to recover"
                return result
            raise
        result.update(changed=True, state=answer.get("state"))
        return result


def _wait_for_rejoin(endpoint: str, settings: AttestationSettings, cluster_id: Optional[bytes],
                     result: Dict[str, Any], timeout: float) -> Dict[str, Any]:
    """A rebooted Node rejoins by itself (its agent pulls a rejoin ticket from the Coordinator); the
    controller sends it nothing and watches its attested PCR 15 and state."""
    import time

    deadline = time.monotonic() + timeout
    report = None
    while time.monotonic() < deadline:
        report = peer_report(endpoint, settings, cluster_id)
        if report.membership == OURS and report.state == IS_NODE:
            result.update(changed=True, state=report.state, note="rejoined with a ticket from its Coordinator")
            return result
        time.sleep(REJOIN_POLL)
    raise StateError("%s did not rejoin within %d s (it is %s, PCR 15 %s): its agent pulls a rejoin ticket from the "
                     "Coordinator, which must be recovered and reachable; its agent log says why"
                     % (endpoint, timeout, report.state if report else "?", report.membership if report else "?"))


def remove_peer(coordinator_public_endpoint: str, settings: AttestationSettings, admin_priv_key,
                node_public_ip: Optional[str] = None, node_vpn_ip: Optional[str] = None,
                cluster_id: Optional[bytes] = None, check_mode: bool = False) -> Dict[str, Any]:
    """Asks the Coordinator (attested, admin-authenticated) to remove the Node with this public or VPN IP
    (RemovePeer, core/removal.py); ``check_mode``: it only reports. The Coordinator's answer:
    changed, msg, peer, kubernetes_node_names, disk_uuid, control_plane, evicted."""
    with open_coordinator(coordinator_public_endpoint, settings, admin_priv_key, cluster_id) as client:
        fields: Dict[str, Any] = {"check": bool(check_mode)}
        if node_public_ip:
            fields["node_public_ip"] = node_public_ip
        if node_vpn_ip:
            fields["node_vpn_ip"] = node_vpn_ip
        return dict(client.invoke("RemovePeer", **fields))


RESET_POLL = 0.5


def reset_agent(endpoint: str, settings: AttestationSettings, admin_priv_key, public_ip: str,
                cluster_id: Optional[bytes] = None, force: bool = False, check_mode: bool = False,
                wait_timeout: float = 60.0) -> Dict[str, Any]:
    """Resets the agent at ``endpoint`` (ResetAgent; attested, admin-authenticated): it stops, wipes its state
    and WireGuard interface and starts fresh; this waits until it answers again. Nothing to do for a peer
    that holds no state (fresh, or reset and not rebooted yet: Failed). ``reboot_needed``: PCR 15 still holds
    a cluster ID (only a reboot resets it; until then the host cannot be activated)."""
    import time

    with open_peer(endpoint, settings) as client:
        # A variant that quotes no PCRs: the admin key decides the membership (report_of).
        report = report_of(client, endpoint, cluster_id, None if client.attested.validation.pcrs else admin_priv_key)
        result: Dict[str, Any] = {"changed": False, "state_before": report.state, "state": report.state,
                                  "role_before": report.role, "wiped": [],
                                  "reboot_needed": report.membership != FRESH}
        if report.membership == OTHER and cluster_id is not None:
            raise StateError("%s is locked to another cluster (PCR 15 %s): not reset" % (endpoint, report.pcr15))
        if report.state == ACCEPTING_INIT and report.role not in (ROLE_COORDINATOR, ROLE_NODE):
            result["msg"] = "holds no cluster state (fresh)"
            return result
        if report.state == constants.STATE_FAILED:
            result["msg"] = ("Failed: reset already and waiting for a reboot, or holding a state it cannot use; "
                             "after a reboot it is fresh or says why")
            return result
        if report.role == ROLE_COORDINATOR and not force:
            raise StateError("%s is a Coordinator: resetting it takes the cluster's state with it (take it out "
                             "first: remove_coordinator.yml; or force)" % endpoint)
        result["changed"] = True
        if check_mode:
            result["msg"] = "would be reset"
            return result
        client.admin_auth(admin_priv_key)
        answer = client.invoke("ResetAgent", confirm=public_ip, force=bool(force))
    result["wiped"] = list(answer.get("wiped") or [])
    deadline = time.monotonic() + wait_timeout
    last: Any = None
    time.sleep(RESET_POLL)
    while True:
        try:
            with open_peer(endpoint, settings) as client:
                after = report_of(client, endpoint, cluster_id)
            if after.role not in (ROLE_COORDINATOR, ROLE_NODE):
                result.update(state=after.state, reboot_needed=after.membership != FRESH)
                break
            last = "%s (role %s): not reset yet" % (after.state, after.role)
        except (ConstellationError, OSError) as err:
            last = err
        if time.monotonic() > deadline:
            raise StateError("%s did not come back fresh within %d s after its reset: %s" % (endpoint, wait_timeout, last))
        time.sleep(RESET_POLL)
    result["msg"] = "reset: %s%s" % (result["state"], "; PCR 15 keeps the old cluster ID until a reboot: activate it "
                                     "again after one" if result["reboot_needed"] else "")
    return result
