# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node agent daemon (docs/agent.md): wires the Core, the pubapi + admin listener, the
vpnapi (Coordinator), the join client and the update loop (Nodes).

Threads, all bounded: one accept thread per listener, one thread per connection (at most 64),
one update/join loop. Logs are JSON lines on stderr and never carry key material. SIGTERM
stops the listeners and loops and exits 0. The configuration and its checks: ``agent_config.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from typing import Any, List, Optional

from ansible_collections.constellation.cluster.plugins.module_utils import atls
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.agent_measurement import AgentMeasurement, with_agent_pcr
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import deployment
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import policy_version
from ansible_collections.constellation.cluster.plugins.module_utils.agent.policy_file import PolicyFile, own_measurement_set
from ansible_collections.constellation.cluster.plugins.module_utils.core.accepted_measurements import MAX_DOCUMENT, check_document
from ansible_collections.constellation.cluster.plugins.module_utils.encoding import b64decode
from ansible_collections.constellation.cluster.plugins.module_utils.agent import storage_key
from ansible_collections.constellation.cluster.plugins.module_utils.core.at_rest import PlainStorage, SealedStorage, sealed_pcr_sets
from ansible_collections.constellation.cluster.plugins.module_utils.core import (
    ROLE_NODE,
    Core,
    ReattestLoop,
    State,
    TPMDevice,
    WireGuardVPN,
    new_disk_uuid,
    normalize_disk_uuid,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.leadership import Leadership
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.join_provider import JoinProvider
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import schema
from ansible_collections.constellation.cluster.plugins.module_utils.agent.admin import AdminHandlers
from ansible_collections.constellation.cluster.plugins.module_utils.agent.peer_view import CorePeerView
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient, ask_in_turn, connect_enrolling
from ansible_collections.constellation.cluster.plugins.module_utils.agent.reset import AgentReset
from ansible_collections.constellation.cluster.plugins.module_utils.agent.pubapi import (
    PubAPI, coordinator_policy, coordinator_sources, fresh_node_policy, join_cluster, rejoin_cluster)
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import MAX_PEER_CONNECTIONS, AgentServerContext, FrameServer
from ansible_collections.constellation.cluster.plugins.module_utils.agent.vpnapi import MAX_WAIT, VPNAPI
from ansible_collections.constellation.cluster.plugins.module_utils.agent.long_poll import LongPoll
from ansible_collections.constellation.cluster.plugins.module_utils.store import open_store
from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd_member import EtcdMember
from ansible_collections.constellation.cluster.plugins.module_utils.agent import verify_service
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard.peer_auth import NodePeerAuth
from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import AgentConfig, require_dm_crypt
from ansible_collections.constellation.cluster.plugins.module_utils.disk.attach import AgentStateDisk
from ansible_collections.constellation.cluster.plugins.module_utils.disk.state_disk import StateDisk

MAX_BACKOFF = 30.0
KILL_AFTER_EVENT_ENV = "CONSTELLATION_AGENT_TEST_KILL_AFTER_EVENT"


# --------------------------------------------------------------------------- logging


class JSONLog:
    """Structured logs: one JSON object per line. Callers pass names and metadata, never keys."""

    def __init__(self, stream=None, node: str = ""):
        self.stream = stream or sys.stderr
        self.node = node
        self._lock = threading.Lock()
        # Fault tests only (tests/integration/test_faults.py): the process dies at once, as under
        # SIGKILL, right after it logs this event, so that a test can stop an agent at an exact step.
        self.kill_after_event = os.environ.get(KILL_AFTER_EVENT_ENV) or None

    def __call__(self, event: str, level: str = "info", **fields: Any) -> None:
        record = {"ts": round(time.time(), 3), "level": level, "event": event}
        if self.node:
            record["node"] = self.node
        record.update({k: (v if isinstance(v, (str, int, float, bool, type(None))) else str(v))
                       for k, v in fields.items()})
        line = json.dumps(record, sort_keys=False)
        with self._lock:
            try:
                self.stream.write(line + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass
            if event == self.kill_after_event:
                os._exit(137)  # pylint: disable=protected-access


# --------------------------------------------------------------------------- the agent


class Agent:
    def __init__(self, config: AgentConfig, log: Optional[JSONLog] = None):
        self.config = config
        self.log = log or JSONLog()
        os.makedirs(config.state_dir, mode=0o700, exist_ok=True)
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []
        self.servers: List[FrameServer] = []
        self._update_from: Optional[str] = None  # the Coordinator VPN IP that answered the last GetUpdate
        self.long_poll = LongPoll(config.vpnapi_port, min(MAX_WAIT, float(config.update_interval)),
                                  lambda client: self._node_auth.authenticate(client, self.core.context.node_state))
        self._node_auth = NodePeerAuth()  # the vpnapi's PeerAuth with this node's WireGuard key
        self.vpnapi_server: Optional[FrameServer] = None
        self._vpnapi_lock = threading.Lock()
        require_dm_crypt(config)  # state_disk_device: refused here without dm-crypt, naming the key
        self.measurement: Optional[AgentMeasurement] = None  # PCR 13 (attestation/agent_measurement.py)
        self._sealed_pcrs: List[int] = []  # the PCRs the storage key is sealed to
        self.policy = None  # the accepted measurement sets as the policy file holds them (before PCR 13 and 15)
        self.policy_file = PolicyFile(config.measurements, config.measurements_pub_key)  # agent/policy_file.py
        self._refused_version: Optional[int] = None  # a document version this agent refused (logged once)
        self._policy_lock = threading.Lock()
        self.issuer, self.node_validator, self.peer_validator = self._attestation()
        # Before anything is served or read: the agent measures itself, then unseals its storage key.
        self.at_rest = self._measure_and_unseal()
        # A file store is sealed as a whole (core/at_rest.py); the default one is <state_dir>/store.json.
        self.store = open_store(config.store or {"type": "file", "path": os.path.join(config.state_dir, "store.json")}, cipher=self.at_rest)
        # The encrypted state disk (disk/attach.py): opened at start, set up when the disk key arrives.
        self.state_disk = (AgentStateDisk(StateDisk(config.state_disk_device, config.state_disk_mapper_name,
                                                    os.path.join(config.state_dir, "disk")),
                                          self.store, log=self.log)
                           if config.state_disk_device else None)
        with contextlib.suppress(FileNotFoundError):  # an older agent kept the WireGuard key in plain form
            os.unlink(os.path.join(config.state_dir, "%s.key" % config.vpn_interface))
        self.vpn = WireGuardVPN(config.vpn_interface, listen_port=config.vpn_listen_port, vpn_cidr=config.vpn_cidr)
        self.reset = AgentReset(config, self.vpn, self._stop, self.log)  # ResetAgent (agent/reset.py)
        self.core = Core(self.store, TPMDevice(config.tcti), self.vpn, config.state_dir, config.public_ip,
                         self._disk_uuid(), log=self.log, init_secret_hash=config.init_secret_hash,
                         at_rest=self.at_rest)
        context, core = self.core.context, self.core
        core.trust.keep_certified_aks(getattr(self.peer_validator, "certified_aks", None))  # in the sealed store
        context.join_coordinator_pub_key = config.coordinator_pub_key  # join tickets must verify with it
        core.admissions.configure(config.insecure_join_without_admission)  # warns (every start) where insecure
        context.agent_measurement = self.measurement.to_dict() if self.measurement is not None else None
        context.deployment_mode = config.deployment_mode  # GetState's details: host root is trusted on this peer
        if self.state_disk is not None:
            self.state_disk.read_key = context.read_disk_key  # the key at rest, through the Core's seam
            context.state_disk = self.state_disk
        self._reattest_started = False
        # Each server's handlers get the Core's services they call (core/__init__.py), not the Core.
        # The accepted measurement sets: set by the admin on a Coordinator, fetched by Nodes, applied without a restart.
        core.measurements.pub_key = self.policy_file.pub_key
        core.measurements.current = lambda: self.policy
        core.measurements.on_apply = self.apply_measurements
        core.measurements.own_set = self._own_measurement_set
        self.admin = AdminHandlers.for_core(core, self.log, issue=self._issue_for_connection, variant_oid=self.issuer.oid,
                                            reset=self.reset.request)
        self.pubapi = PubAPI(self.node_validator, admin=self.admin, log=self.log, issuer=self.issuer,
                             validator_for_activation=self.peer_validator, status=core.status,
                             coordinator=core.coordinator, activation=core.activation, cluster=core.cluster,
                             node=core.node, join_service=core.join_service, trust=core.trust, recovery=core.recovery,
                             backup=core.backup, coordinator_endpoints=[config.coordinator_public_endpoint])
        provider = JoinProvider(config.kubeadm_path, config.kubernetes_dir, kubelet_cert_days=config.kubelet_cert_days)
        self.vpnapi = VPNAPI(kubeadm=provider, log=self.log, coordinator=core.coordinator, access=core.access,
                             evictions=core.evictions, kubernetes=core.kubernetes, activation=core.activation,
                             measurements=core.measurements)
        core.activation.activation_workers = config.activation_workers
        context.etcd_member = (EtcdMember.from_config(config.etcd_member, config.state_dir)
                               if config.etcd_member is not None else None)
        context.on_state_change(self._on_state)

    def _attestation(self):
        """(issuer, validator of fresh nodes, validator of peers whose PCR 15 is checked elsewhere: the
        Coordinator a node joins, whose cluster ID a fresh node cannot know, and the nodes the Core
        activates or resumes, whose PCR 15 the Core checks against its own cluster ID), from the
        chooser. The validators share one registry of certified AKs (qemu-vtpm-ek)."""
        variant = self.config.variant
        trust = choose.load_trust(variant, self.config.ek_ca, None, "ek_ca", self.config.insecure_trust_any_ak)
        policy = None
        if choose.spec(variant).needs_policy:
            # The one policy loader: with a pinned key the file's signature is checked before it is parsed.
            policy = self.policy_file.load()
            # The agent's PCR: every peer runs this code with this trust configuration (agent_measurement.py).
            self.measurement = AgentMeasurement.of(variant, trust.ek_ca_certs)
            self.policy = policy
            self._sealed_pcrs = sorted({i for pcrs in sealed_pcr_sets(policy, self.config.deployment_mode).values() for i in pcrs})
            policy = with_agent_pcr(policy, self.measurement.value)
        issuer_options = {"ak_alg": self.config.ak_alg} if variant != "dummy" else {}
        return (choose.issuer(variant, self.config.tcti, **issuer_options),
                choose.validator(variant, fresh_node_policy(policy) if policy else None, trust),
                choose.validator(variant, coordinator_policy(policy) if policy else None, trust))

    def _measure_and_unseal(self) -> SealedStorage:
        """PCR 13 <- the agent's code and trust configuration; then the storage key is unsealed (agent/storage_key.py:
        never resealed to the policy file found on disk, whose version must not be below the sealed floor)."""
        if self.measurement is None:  # the test suite's dummy variant: no TPM, nothing sealed
            return PlainStorage()
        storage = storage_key.measure_and_unseal(self.config, self.measurement, self._sealed_pcrs, self.log)
        storage_key.check_policy_file(storage, self.config.state_dir, self.policy, self.config.measurements)
        return storage

    # -- the accepted measurement sets (core/accepted_measurements.py), applied without a restart
    def apply_measurements(self, document: bytes, signature: Optional[str], sets=None) -> bool:
        """Checks a new policy document (with the pinned key: its signature first; a version not below ours),
        seals the storage key to its sets ahead of a reboot, writes the policy file (and its signature)
        atomically and swaps the validators of the aTLS server, the clients and re-attestation. Returns
        whether anything changed."""
        with self._policy_lock:
            if sets is None:
                sets = check_document(document, signature, self.policy_file.pub_key, self.policy)
            storage_key.check_version(self.at_rest, self.config.state_dir, sets)  # the sealed floor
            if self.policy is not None and sets == self.policy:
                return False
            # First: a reboot after the file changed must find its key. Only here, with a document received over
            # the API, is the key resealed (agent/storage_key.py).
            storage_key.reseal(self.at_rest, sets, self.config.deployment_mode, self.log)
            self.policy_file.write(document, signature)
            storage_key.raise_floor(self.at_rest, self.config.state_dir, sets.version)  # a stop before it leaves the floor below the file, never above
            self.policy = sets
            if self.measurement is not None:
                full = with_agent_pcr(sets, self.measurement.value)
                self.node_validator.measurements = fresh_node_policy(full)  # one attribute write each
                self.peer_validator.measurements = coordinator_policy(full)
            self.log("measurements_applied", version=sets.version, sets=",".join(sets.sets))
            return True

    def _own_measurement_set(self) -> Optional[str]:
        """The accepted set this peer's own PCRs match (the Coordinator is not re-attested by itself)."""
        if self.measurement is None or self.policy is None:
            return None
        return own_measurement_set(with_agent_pcr(self.policy, self.measurement.value), self.config.tcti)

    def _follow_measurements(self, version: Optional[int]) -> None:
        """A newer document than ours (GetUpdate's version on a Node; the shared store on a further Coordinator).
        One this agent refuses (no valid signature, an older version) is logged once per version and never stops
        the peer updates."""
        if not version or version <= policy_version(self.policy) or version == self._refused_version:
            return
        try:
            if self.core.state == State.IS_NODE:
                answer = self._ask_coordinators(lambda client: client.invoke("GetMeasurements"))
                answer["document"] = b64decode(answer["document"], "document", max_size=MAX_DOCUMENT)
            else:
                answer = self.core.measurements.stored() or {}
            if answer.get("document") is not None:
                self.apply_measurements(answer["document"], answer.get("signature"))
        except InputError as err:
            self._refused_version = version
            self.log("measurements_refused", level="error", version=version, error=str(err)[:300])

    def _issue_for_connection(self, user_data: bytes, nonce: bytes) -> bytes:
        """Attest (admin channel): a quote as the aTLS server context issues it (with its deadline)."""
        return self.tls.issue(user_data, nonce)

    def _disk_uuid(self) -> str:
        # A formatted state disk's LUKS2 UUID is the disk UUID (the Coordinator derives the disk key for it).
        header_uuid = self.state_disk.header_uuid() if self.state_disk is not None else None
        if header_uuid:
            return normalize_disk_uuid(header_uuid)
        path = self.config.state_disk_uuid_file or os.path.join(self.config.state_dir, "disk_uuid")
        try:
            with open(path, encoding="ascii") as handle:
                return normalize_disk_uuid(handle.read().strip())
        except FileNotFoundError:
            value = new_disk_uuid()
            with open(path, "w", encoding="ascii") as handle:
                handle.write(value + "\n")
            return value

    # -- life cycle
    def start(self) -> "Agent":
        if self.state_disk is not None:
            self.state_disk.at_boot()  # before the store is read: the store is on the disk
        state = self.core.recovery.load()
        if self.state_disk is not None:
            self.state_disk.after_load(bool(self.core.context.node_state), self.core.context.disk_uuid)
        for deprecation in self.config.deprecations:
            self.log("config_deprecated", level="warning", message=deprecation)
        self.log("agent_started", state=state.wire_name, role=self.core.role, disk_uuid=self.core.context.disk_uuid,
                 failure=self.core.context.failure)
        if self.config.init_secret_hash is None:  # insecure_unauthenticated_activation: said on every start
            self.log("init_secret_not_configured", level="warning", message="no init_secret_hash: anyone can activate this node")
        if choose.insecure_warning(self.config.variant):  # insecure_trust_any_ak: said on every start
            self.log("insecure_variant", level="warning", message=choose.insecure_warning(self.config.variant))
        if (self.config.store or {}).get("type") == "etcd":  # said on every start
            self.log("secrets_not_sealed", level="warning", message="store type etcd: this peer's secrets are kept "
                     "in that etcd cluster, not sealed to this TPM")
        if self.config.measurements_pub_key is None and self.config.measurements:  # insecure_unsigned_measurements
            self.log("measurements_unsigned", level="warning", message="insecure_unsigned_measurements: no "
                     "measurements_pub_key, the policy file is used without a signature check")
        if deployment.warning(self.config.deployment_mode):  # said on every start
            self.log("host_root_trusted", level="warning", deployment_mode=self.config.deployment_mode,
                     message=deployment.warning(self.config.deployment_mode))
        host, port = atls.parse_endpoint(self.config.public_endpoint)
        self.tls = AgentServerContext(self.issuer)
        # Constellation's verification service: plain gRPC and HTTP, quotes for user data "VerifyService".
        self.servers.extend(verify_service.serve(self.config.verify_grpc_endpoint, self.config.verify_http_endpoint,
                                                 self.tls.issue, log=self.log))
        handlers = dict(self.pubapi.handlers())
        handlers.update(self.admin.handlers())
        self.servers.append(FrameServer("pubapi", (host, port), handlers, tls=self.tls, log=self.log,
                                        apis=(schema.PUBAPI, schema.ADMIN), peer_view=CorePeerView(self.core),
                                        reserved_for=coordinator_sources(self.core, self.config)).start())
        self._spawn("loop", self._loop)
        return self

    def _spawn(self, name: str, target) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _on_state(self, state: State) -> None:
        if state == State.ACTIVATING_NODES:
            self._start_vpnapi()
            self._start_reattest()

    def _start_reattest(self) -> None:
        """The Coordinator re-attests every Node each ``reattest_interval`` (core/trust.py)."""
        with self._vpnapi_lock:
            if self._reattest_started or self._stop.is_set() or not self.config.reattest_interval:
                return
            self._reattest_started = True
        port, timeout = atls.parse_endpoint(self.config.public_endpoint)[1], max(2.0, min(10.0, float(self.config.reattest_interval)))

        def connect_peer(public_ip: str):
            # A new aTLS connection: a fresh nonce, a fresh quote; the policy without PCR 15 (the Core checks it).
            endpoint = ("[%s]:%d" if ":" in public_ip else "%s:%d") % (public_ip, port)
            return connect_enrolling(lambda v: AgentClient.connect(endpoint, v, timeout=timeout), [self.peer_validator])

        # One Coordinator at a time re-attests (an etcd lease when several share the store; alone, always).
        leadership = Leadership(self.core.context.store, "%s@%s" % (self.config.public_ip, self.core.context.vpn_ip),
                                ttl=max(2, min(60, int(self.config.reattest_interval * 2) + 1)))
        loop = ReattestLoop(self.core.trust, connect_peer, float(self.config.reattest_interval), self.config.reattest_workers,
                            self.config.reattest_unreachable_limit, self._stop, log=self.log, leadership=leadership,
                            unverified_eviction_after=float(self.config.unverified_eviction_after))
        self._spawn("reattest", loop.run)

    def _start_vpnapi(self) -> None:
        with self._vpnapi_lock:
            if self.vpnapi_server is not None or self._stop.is_set():
                return
            self.vpnapi_server = FrameServer("vpnapi", (self.core.context.vpn_ip, self.config.vpnapi_port),
                                             self.vpnapi.handlers(), log=self.log, peer_view=CorePeerView(self.core),
                                             accept_check=self.vpnapi.accept_check, apis=(schema.VPNAPI,),
                                             max_peer_connections=MAX_PEER_CONNECTIONS).start()
            self.servers.append(self.vpnapi_server)

    def _loop(self) -> None:
        """Nodes: join (if configured) while AcceptingInit, then poll GetUpdate with backoff."""
        failures = 0
        while not self._stop.is_set():
            state = self.core.state
            delay = self.config.update_interval
            try:
                if state == State.IS_NODE:
                    if self._update_once():
                        delay = 0.0  # a held long poll answered: ask again at once
                elif state == State.ACTIVATING_NODES and self.core.context.etcd_member is not None:
                    self._follow_measurements(self.core.measurements.version())  # another Coordinator set them
                    self.core.shared_store.supervise_etcd_member()  # its member died: started again, it rejoins
                    self.core.cluster.sync_coordinator_peers()  # another Coordinator may have changed the peers
                elif state == State.NODE_WAITING_FOR_CLUSTER_JOIN and self.core.context.coordinator_vpn_ip:
                    self._finish_activation_once()
                elif state == State.ACCEPTING_INIT and self.core.context.recovery_pending and self.core.role == ROLE_NODE:
                    # Rebooted: a rejoin ticket from the Coordinator, never the KMS URI.
                    delay = self.config.join_interval
                    self._rejoin_once()
                elif (state == State.ACCEPTING_INIT and self.config.coordinator_public_endpoint
                      and not self.core.context.recovery_pending):
                    delay = self.config.join_interval
                    self._join_once()
                failures = 0
            except (ConstellationError, OSError) as err:
                failures += 1
                cap = max(delay, min(MAX_BACKOFF, delay * 16))
                delay = min(delay * (2 ** min(failures, 8)), cap)
                self.log("loop_error", level="warning", state=state.wire_name, error=str(err)[:300],
                         retry_in=round(delay, 2))
            self._stop.wait(delay)

    def _ask_coordinators(self, call):
        """``call(client)`` on the Coordinator that answered last; when it does not answer, on the next
        Coordinator this Node knows (several Coordinators on one etcd cluster answer alike)."""
        timeout = max(5.0, min(30.0, self.config.update_interval * 3))
        ips = self.core.recovery.coordinator_vpn_ips()
        if self._update_from in ips:
            start = ips.index(self._update_from)
            ips = ips[start:] + ips[:start]
        endpoint, answer = ask_in_turn(["%s:%d" % (ip, self.config.vpnapi_port) for ip in ips],  # PeerAuth, then call
                                       lambda c: call(self._node_auth.authenticate(c, self.core.context.node_state)), timeout)
        from_ip = endpoint.rsplit(":", 1)[0]
        if from_ip != (self._update_from or ips[0]):
            self.log("update_failover", coordinator_vpn_ip=from_ip, level="warning")
        self._update_from = from_ip
        return answer

    def _update_once(self) -> bool:
        """One GetUpdate: held on the kept connection to the Coordinator that answered last (agent/long_poll.py) where
        it can, else a poll as before (the fallback and the failover). True: a held long poll answered (ask again now)."""
        ip = self._update_from
        answer = (self.long_poll.get_update(ip, self.core.context.resource_version)
                  if ip is not None and ip in self.core.recovery.coordinator_vpn_ips() else None)
        if answer is None:
            answer = self._ask_coordinators(lambda client: client.get_update(self.core.context.resource_version))
        self.core.node.apply_update(answer)
        self._follow_measurements(answer.get("measurements_version"))
        return bool(answer.get("long_poll"))

    def _finish_activation_once(self) -> None:
        """An interrupted activation: our disk key from a Coordinator, through the WireGuard tunnel."""
        self.core.node.finish_activation(lambda: self._ask_coordinators(lambda client: client.get_state_disk_key()))

    def _rejoin_once(self) -> None:
        """A rebooted Node: a rejoin ticket from its Coordinator, or from the next one it knows."""
        port = atls.parse_endpoint(self.config.public_endpoint)[1]
        endpoints = [self.config.coordinator_public_endpoint] if self.config.coordinator_public_endpoint else [
            ("[%s]:%d" if ":" in ip else "%s:%d") % (ip, port) for ip in self.core.recovery.coordinator_public_ips()]
        if not endpoints:
            raise ConstellationError("rejoin: the stored peers do not name a Coordinator's public IP")
        result = rejoin_cluster(self.core.recovery, endpoints, [self.peer_validator], self.issuer)
        self.log("rejoined", node_vpn_ip=result.get("vpn_ip"), resource_version=result.get("resource_version"))

    def _join_once(self) -> None:
        result = join_cluster(self.core.node, self.config.coordinator_public_endpoint, [self.peer_validator],
                              self.issuer)
        self.log("joined", node_vpn_ip=result.get("node_vpn_ip"), resource_version=result.get("resource_version"))

    def stop(self) -> None:
        self._stop.set()
        self.long_poll.close()  # ends a held GetUpdate now
        for server in list(self.servers):
            server.stop()
        for thread in self._threads:
            thread.join(timeout=5)
        if hasattr(self, "tls"):
            self.tls.close()
        close = getattr(self.issuer, "close", None)
        if close is not None:
            close()
        self.admin.close()  # the warm interpreters
        for store in {id(s): s for s in (self.store, self.core.context.store)}.values():  # local, and etcd's
            with contextlib.suppress(ConstellationError):
                store.close()
        if self.core.context.etcd_member is not None:
            self.core.context.etcd_member.stop()
        self.log("agent_stopped")

    def wait(self) -> None:
        while not self._stop.is_set():
            self._stop.wait(1.0)


def main(argv: Optional[List[str]] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="constellation-agent", description="constellation.cluster node agent")
    parser.add_argument("--config", required=True, help="agent configuration (JSON or YAML)")
    args = parser.parse_args(argv)
    log = JSONLog()
    os.environ.setdefault("TSS2_LOG", "all+none")
    try:
        config = AgentConfig.load(args.config)
        agent = Agent(config, log)
        agent.start()
    except ConstellationError as err:
        log("agent_failed", level="error", error=str(err))
        return 2
    except OSError as err:
        log("agent_failed", level="error", error="%s: %s" % (type(err).__name__, err.strerror or err))
        return 2

    def on_signal(signum, _frame):
        log("signal", signal=signal.Signals(signum).name)
        agent._stop.set()

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
