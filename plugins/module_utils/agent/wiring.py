# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one place that builds a node agent (docs/agent.md, "Structure"): every collaborator is made here, in the
order its dependencies allow, and passed to a constructor; nothing is set on an object afterwards. What can exist
only later (a listener binds its port at start; the vpnapi and re-attestation need the VPN IP an activation gives)
is made by ``Listeners`` when the agent's life cycle (agent/daemon.py) asks for it.

The handler classes get exactly the Core's services they call (``pubapi_handlers``, ``vpnapi_handlers``,
``admin_handlers``: the agent and the tests build them alike)."""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from typing import Any, Dict, List, Optional

from ansible_collections.constellation.cluster.plugins.module_utils import atls
from ansible_collections.constellation.cluster.plugins.module_utils.agent import verify_service
from ansible_collections.constellation.cluster.plugins.module_utils.agent.admin import AdminHandlers
from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import AgentConfig, require_dm_crypt
from ansible_collections.constellation.cluster.plugins.module_utils.agent.daemon import Agent
from ansible_collections.constellation.cluster.plugins.module_utils.agent.json_log import JSONLog
from ansible_collections.constellation.cluster.plugins.module_utils.agent.long_poll import LongPoll
from ansible_collections.constellation.cluster.plugins.module_utils.agent.measurement_policy import MeasurementPolicy
from ansible_collections.constellation.cluster.plugins.module_utils.agent.peer_view import CorePeerView
from ansible_collections.constellation.cluster.plugins.module_utils.agent.policy_file import PolicyFile
from ansible_collections.constellation.cluster.plugins.module_utils.agent.pubapi import PubAPI, coordinator_sources
from ansible_collections.constellation.cluster.plugins.module_utils.agent.remote_exec import RemoteExec
from ansible_collections.constellation.cluster.plugins.module_utils.agent.reset import AgentReset
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import deployment
from ansible_collections.constellation.cluster.plugins.module_utils.agent.unsealing import (
    AgentAttestation, measure_and_unseal, open_sealed_store, read_disk_uuid)
from ansible_collections.constellation.cluster.plugins.module_utils.agent.update_loop import UpdateLoop
from ansible_collections.constellation.cluster.plugins.module_utils.agent.vpnapi import MAX_WAIT, VPNAPI
from ansible_collections.constellation.cluster.plugins.module_utils.core import (
    STATE_DISK_KEY_FILE, Core, ReattestLoop, TPMDevice, WireGuardVPN)
from ansible_collections.constellation.cluster.plugins.module_utils.core.leadership import Leadership
from ansible_collections.constellation.cluster.plugins.module_utils.disk.attach import AgentStateDisk
from ansible_collections.constellation.cluster.plugins.module_utils.disk.state_disk import StateDisk
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.join_provider import JoinProvider
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import schema
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient, connect_enrolling
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import (
    MAX_PEER_CONNECTIONS, AgentServerContext, FrameServer)
from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd_member import EtcdMember
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard.peer_auth import NodePeerAuth


# --------------------------------------------------------------------------- the handlers over a Core


def pubapi_handlers(core: Core, validator_for_nodes=None, *, log=None, issuer=None, validator_for_activation=None,
                    connect_node=None, coordinator_endpoints=()) -> PubAPI:
    return PubAPI(validator_for_nodes, connect_node, log=log, issuer=issuer,
                  validator_for_activation=validator_for_activation, status=core.status, coordinator=core.coordinator,
                  activation=core.activation, cluster=core.cluster, node=core.node, join_service=core.join_service,
                  peer_trust=core.peer_trust, recovery=core.recovery, backup=core.backup,
                  coordinator_endpoints=coordinator_endpoints)


def vpnapi_handlers(core: Core, log=None) -> VPNAPI:
    return VPNAPI(log, coordinator=core.coordinator, peer_access=core.peer_access, evictions=core.evictions,
                  kubernetes=core.kubernetes, activation=core.activation,
                  accepted_measurements=core.accepted_measurements)


def admin_handlers(core: Core, log=None, *, issue=None, variant_oid: str = "", reset=None) -> AdminHandlers:
    return AdminHandlers(log, issue, variant_oid, context=core.context, status=core.status, backup=core.backup,
                         removal=core.removal, reset=reset, accepted_measurements=core.accepted_measurements,
                         admissions=core.admissions, coordinator=core.coordinator)


# --------------------------------------------------------------------------- the listeners


class Listeners:
    """The agent's servers and its re-attestation, each made when the life cycle asks: ``serve_public`` (the
    verification service, then the pubapi with the admin channel on ``public_endpoint``), ``serve_vpnapi`` (on
    the Coordinator's VPN IP) and ``reattest_loop``."""

    def __init__(self, config: AgentConfig, core: Core, tls: AgentServerContext, public_handlers: Dict[str, Any],
                 vpnapi: VPNAPI, peer_validator: Any, stop: threading.Event, log):
        self.config = config
        self.public_address = atls.parse_endpoint(config.public_endpoint)  # (host, port)
        self.core = core
        self.tls = tls
        self.public_handlers = public_handlers
        self.vpnapi = vpnapi
        self.peer_validator = peer_validator
        self.stop = stop
        self.log = log

    def serve_public(self) -> List[Any]:
        config = self.config
        # Constellation's verification service: plain gRPC and HTTP, quotes for user data "VerifyService".
        servers = verify_service.serve(config.verify_grpc_endpoint, config.verify_http_endpoint, self.tls.issue,
                                       log=self.log)
        servers.append(FrameServer("pubapi", self.public_address, self.public_handlers, tls=self.tls, log=self.log,
                                   apis=(schema.PUBAPI, schema.ADMIN), peer_view=CorePeerView(self.core),
                                   reserved_for=coordinator_sources(self.core, config)).start())
        return servers

    def serve_vpnapi(self) -> FrameServer:
        return FrameServer("vpnapi", (self.core.context.vpn_ip, self.config.vpnapi_port), self.vpnapi.handlers(),
                           log=self.log, peer_view=CorePeerView(self.core), accept_check=self.vpnapi.accept_check,
                           apis=(schema.VPNAPI,), max_peer_connections=MAX_PEER_CONNECTIONS).start()

    def reattest_loop(self) -> ReattestLoop:
        config = self.config
        port = self.public_address[1]
        timeout = max(2.0, min(10.0, float(config.reattest_interval)))

        def connect_peer(public_ip: str):
            # A new aTLS connection: a fresh nonce, a fresh quote; the policy without PCR 15 (the Core checks it).
            endpoint = ("[%s]:%d" if ":" in public_ip else "%s:%d") % (public_ip, port)
            return connect_enrolling(lambda v: AgentClient.connect(endpoint, v, timeout=timeout), [self.peer_validator])

        # One Coordinator at a time re-attests (an etcd lease when several share the store; alone, always).
        leadership = Leadership(self.core.context.store, "%s@%s" % (config.public_ip, self.core.context.vpn_ip),
                                ttl=max(2, min(60, int(config.reattest_interval * 2) + 1)))
        return ReattestLoop(self.core.peer_trust, connect_peer, float(config.reattest_interval), config.reattest_workers,
                            config.reattest_unreachable_limit, self.stop, log=self.log, leadership=leadership,
                            unverified_eviction_after=float(config.unverified_eviction_after))


# --------------------------------------------------------------------------- the agent


def build_agent(config: AgentConfig, log: Optional[JSONLog] = None) -> Agent:
    """The agent for ``config``, measured, its storage key unsealed and its store open (agent/unsealing.py); nothing
    listens before ``start``."""
    log = log or JSONLog()
    os.makedirs(config.state_dir, mode=0o700, exist_ok=True)
    require_dm_crypt(config)  # state_disk_device: refused here without dm-crypt, naming the key
    stop = threading.Event()
    policy_file = PolicyFile(config.measurements, config.measurements_pub_key)  # agent/policy_file.py
    attestation = AgentAttestation(config, policy_file)
    # Before anything is served or read: the agent measures itself (host mode), then unseals its storage key.
    at_rest = measure_and_unseal(config, attestation, log)
    store = open_sealed_store(config, at_rest)
    # The encrypted state disk (disk/attach.py): opened at start, set up when the disk key arrives (kept sealed).
    state_disk = (AgentStateDisk(StateDisk(config.state_disk_device, config.state_disk_mapper_name,
                                           os.path.join(config.state_dir, "disk")), store,
                                 read_key=functools.partial(at_rest.read_file,
                                                            os.path.join(config.state_dir, STATE_DISK_KEY_FILE)),
                                 log=log)
                  if config.state_disk_device else None)
    vpn = WireGuardVPN(config.vpn_interface, listen_port=config.vpn_listen_port, vpn_cidr=config.vpn_cidr)
    reset = AgentReset(config, vpn, stop, log)  # ResetAgent (agent/reset.py)
    policy = MeasurementPolicy(config, policy_file, attestation, at_rest, log)
    core = Core(store, TPMDevice(config.tcti), vpn, config.state_dir, config.public_ip, read_disk_uuid(config, state_disk),
                log=log, init_secret_hash=config.init_secret_hash, at_rest=at_rest,
                join_coordinator_pub_key=config.coordinator_pub_key,  # join tickets must verify with it
                # What this agent extended into PCR 13 (None in the node image: it extends nothing there).
                agent_measurement=(attestation.measurement.to_dict() if attestation.measurement is not None
                                   and deployment.extends_agent_pcr(config.deployment_mode) else None),
                deployment_mode=config.deployment_mode,  # GetState's details: host or image (attestation/deployment.py)
                state_disk=state_disk,
                etcd_member=(EtcdMember.from_config(config.etcd_member, config.state_dir)
                             if config.etcd_member is not None else None),
                kubeadm_provider=JoinProvider(config.kubeadm_path, config.kubernetes_dir,
                                              kubelet_cert_days=config.kubelet_cert_days),
                activation_workers=config.activation_workers,
                insecure_join_without_admission=config.insecure_join_without_admission,  # warned at every start
                measurements_policy=policy)  # set by the admin on a Coordinator, fetched by Nodes, applied at once
    core.peer_trust.keep_certified_aks(attestation.certified_aks)  # loaded from the sealed store, written through
    tls = AgentServerContext(attestation.issuer)
    remote_exec = RemoteExec(config.state_dir, log)
    admin = admin_handlers(core, log, issue=tls.issue, variant_oid=attestation.issuer.oid, reset=reset.request)
    pubapi = pubapi_handlers(core, attestation.node_validator, log=log, issuer=attestation.issuer,
                             validator_for_activation=attestation.peer_validator,
                             coordinator_endpoints=[config.coordinator_public_endpoint])
    node_auth = NodePeerAuth()  # the vpnapi's PeerAuth with this node's WireGuard key
    long_poll = LongPoll(config.vpnapi_port, min(MAX_WAIT, float(config.update_interval)),
                         lambda client: node_auth.authenticate(client, core.context.node_state))
    update_loop = UpdateLoop(config, core, policy, attestation.issuer, attestation.peer_validator, node_auth, long_poll,
                             stop, log)
    public_handlers = dict(pubapi.handlers(), **admin.handlers(), **remote_exec.handlers())
    listeners = Listeners(config, core, tls, public_handlers, vpnapi_handlers(core, log), attestation.peer_validator,
                          stop, log)
    return Agent(config, log, core, store, state_disk, listeners, update_loop, remote_exec, reset, attestation.issuer,
                 tls, stop)


def main(argv: Optional[List[str]] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="constellation-agent", description="constellation.cluster node agent")
    parser.add_argument("--config", required=True, help="agent configuration (JSON or YAML)")
    args = parser.parse_args(argv)
    log = JSONLog()
    os.environ.setdefault("TSS2_LOG", "all+none")
    try:
        config = AgentConfig.load(args.config)
        agent = build_agent(config, log)
        agent.start()
    except ConstellationError as err:
        log("agent_failed", level="error", error=str(err))
        return 2
    except OSError as err:
        log("agent_failed", level="error", error="%s: %s" % (type(err).__name__, err.strerror or err))
        return 2

    def on_signal(signum, _frame):
        log("signal", signal=signal.Signals(signum).name)
        agent.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    agent.wait()
    agent.stop()
    if agent.reset.requested:
        agent.reset.wipe()
        if argv is None:
            # Start fresh in this process (its pid, its supervisor): a new agent on an empty state directory.
            os.execv(sys.executable, [sys.executable] + sys.argv)
    return 0
