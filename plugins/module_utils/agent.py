# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node agent daemon (docs/agent.md): wires the Core, the pubapi + admin listener, the
vpnapi (Coordinator), the join client and the update loop (Nodes).

Threads, all bounded: one accept thread per listener, one thread per connection (at most 64),
one update/join loop. Logs are JSON lines on stderr and never carry key material. SIGTERM
stops the listeners and loops and exits 0.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from ansible_collections.constellation.cluster.plugins.module_utils import atls, x509compat
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import load_policy_file
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import AK_ALGS
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
from ansible_collections.constellation.cluster.plugins.module_utils.core.activation import ACTIVATION_WORKERS, MAX_ACTIVATION_WORKERS
from ansible_collections.constellation.cluster.plugins.module_utils.core.leadership import Leadership
from ansible_collections.constellation.cluster.plugins.module_utils.encoding import load_yaml, read_text
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError
from ansible_collections.constellation.cluster.plugins.module_utils.core.signing import parse_coordinator_pub_key
from ansible_collections.constellation.cluster.plugins.module_utils.init_secret import require_init_secret_hash
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.join_provider import (
    KUBELET_CERT_DAYS, JoinProvider, validate_kubelet_cert_days)
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import schema
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.admin import AdminHandlers
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient, ask_in_turn, connect_enrolling
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.pubapi import (
    PubAPI,
    coordinator_policy,
    fresh_node_policy,
    join_cluster,
    rejoin_cluster,
)
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import AgentServerContext, FrameServer
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.vpnapi import VPNAPI_PORT, VPNAPI
from ansible_collections.constellation.cluster.plugins.module_utils.store import open_store
from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd_runner import EtcdMember
from ansible_collections.constellation.cluster.plugins.module_utils import verify_service
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import VPN_CIDR
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard.peer_auth import NodePeerAuth

DEFAULT_PUBLIC_PORT = 9000
DEFAULT_UPDATE_INTERVAL = 10.0
# Re-attestation of every Node by the Coordinator (docs/agent.md, "Re-attestation and eviction").
DEFAULT_REATTEST_INTERVAL = 60.0
DEFAULT_REATTEST_UNREACHABLE_LIMIT = 3
DEFAULT_REATTEST_WORKERS = 4
MAX_BACKOFF = 30.0
KILL_AFTER_EVENT_ENV = "CONSTELLATION_AGENT_TEST_KILL_AFTER_EVENT"
# Renamed keys (DESIGN.md 6); the old names work, with a warning in the log, until 2.0.0.
_DEPRECATED_KEYS = {"wg_interface": "vpn_interface"}
_CONFIG_KEYS = {"public_endpoint", "public_ip", "tcti", "variant", "measurements", "ek_ca", "store", "state_dir", "vpn_interface",
                "vpn_api_port", "update_interval", "disk_uuid_file", "coordinator_public_endpoint", "join_interval",
                "vpn_cidr", "wg_listen_port", "log_level", "measurements_public_key", "init_secret_hash",
                "reattest_interval", "reattest_unreachable_limit", "reattest_workers", "activation_workers", "ak_alg",
                "etcd_member", "kubeadm_path", "kubernetes_dir",  # kubeadm: kubeadm/join_provider.py
                "kubelet_cert_days", "coordinator_pub_key",
                "insecure_trust_any_ak", "insecure_unauthenticated_activation"}  # explicit insecure choices
_CONFIG_KEYS |= set(verify_service.CONFIG_KEYS)  # Constellation's verification service (docs/verify.md)
# The types of the keys whose values are used as they are (the others are checked below, by value).
_CONFIG_TYPES = {
    "public_endpoint": ((str,), "host:port"),
    "coordinator_public_endpoint": ((str,), "host:port"),
    "coordinator_pub_key": ((str,), "the Coordinators' Ed25519 signing key (standard base64 of 32 bytes)"),
    "public_ip": ((str,), "an IP address"),
    "tcti": ((str,), "a TCTI string such as swtpm:host=127.0.0.1,port=2321"),
    "variant": ((str,), "a variant name"),
    "measurements": ((str,), "the path of a measurements policy (JSON)"),
    "measurements_public_key": ((str,), "the path of the pinned ECDSA P-256 public key (PEM) the policy is signed with"),
    "init_secret_hash": ((str,), "hex SHA-256 of this node's init secret (64 hex digits)"),
    "ek_ca": ((str, list), "a PEM file path or a list of them"),
    "store": ((Mapping,), "a mapping (docs/store.md)"),
    "etcd_member": ((Mapping,), "a mapping (docs/store.md, several Coordinators)"),
    "vpn_interface": ((str,), "an interface name"),
    "vpn_cidr": ((str,), "an IP network such as 10.118.0.0/16"),
    "disk_uuid_file": ((str,), "a file path"),
    "log_level": ((str,), "a log level name"),
    "ak_alg": ((str,), "rsa or ecc"),
    "kubeadm_path": ((str,), "the path of the kubeadm executable"),
    "kubernetes_dir": ((str,), "an absolute path (kubeadm's directory, /etc/kubernetes)"),
    "insecure_trust_any_ak": ((bool,), "true or false"), "insecure_unauthenticated_activation": ((bool,), "true or false"),
}


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


# --------------------------------------------------------------------------- config


@dataclass
class AgentConfig:
    state_dir: str
    public_endpoint: str = "0.0.0.0:%d" % DEFAULT_PUBLIC_PORT
    public_ip: Optional[str] = None
    tcti: Optional[str] = None
    variant: str = choose.DEFAULT_VARIANT
    measurements: Optional[str] = None
    ek_ca: Optional[Any] = None  # qemu-vtpm-ek: PEM file(s) of the CA(s) that TPMs' EK certificates chain to
    store: Dict[str, Any] = field(default_factory=dict)
    etcd_member: Optional[Dict[str, Any]] = None  # a Coordinator shares the cluster's state in etcd (docs/store.md)
    vpn_interface: str = "wg0"
    wg_listen_port: int = 51820
    vpn_api_port: int = VPNAPI_PORT
    vpn_cidr: str = VPN_CIDR
    update_interval: float = DEFAULT_UPDATE_INTERVAL
    disk_uuid_file: Optional[str] = None
    coordinator_public_endpoint: Optional[str] = None
    # Join mode: the Coordinators' signing key (core/signing.py); join tickets must be signed with it.
    coordinator_pub_key: Optional[str] = None
    join_interval: float = 5.0
    measurements_public_key: Optional[str] = None  # pinned key: the policy file must be signed (FILE.sig)
    init_secret_hash: Optional[str] = None  # hex SHA-256 of this node's init secret: activation needs its proof
    reattest_interval: float = DEFAULT_REATTEST_INTERVAL  # Coordinator: seconds between re-attestation rounds
    reattest_unreachable_limit: int = DEFAULT_REATTEST_UNREACHABLE_LIMIT  # consecutive unreachable rounds -> evicted
    reattest_workers: int = DEFAULT_REATTEST_WORKERS  # peers re-attested at once
    activation_workers: int = ACTIVATION_WORKERS  # Coordinator: Nodes activated at once
    ak_alg: str = "rsa"  # the AK of the vTPM variants: rsa (as Constellation's issuer) or ecc (P-256, faster)
    kubeadm_path: Optional[str] = None  # Coordinator: kubeadm for join arguments (None: looked up on PATH)
    kubernetes_dir: str = "/etc/kubernetes"  # Coordinator: where its control plane is (admin.conf, pki/)
    kubelet_cert_days: int = KUBELET_CERT_DAYS  # Coordinator: lifetime of the kubelet certificates it signs
    verify_grpc_endpoint: Optional[str] = None  # None: public_endpoint's host, port 9090; "": off
    verify_http_endpoint: Optional[str] = None  # None: public_endpoint's host, port 8080; "": off
    insecure_trust_any_ak: bool = False  # accept variant qemu-vtpm (it trusts any AK); warned on every start
    insecure_unauthenticated_activation: bool = False  # start without init_secret_hash; warned on every start
    deprecations: List[str] = field(default_factory=list)  # old key names found in the file

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "AgentConfig":
        if not isinstance(data, Mapping):
            raise InputError("config", "a mapping", type(data).__name__)
        deprecations = []
        for old, new in _DEPRECATED_KEYS.items():
            if old in data:
                if new in data:
                    raise InputError(old, "either %s or its deprecated name %s, not both" % (new, old))
                data = dict(data)
                data[new] = data.pop(old)
                deprecations.append("%s is deprecated (removed in 2.0.0): use %s" % (old, new))
        unknown = set(data) - _CONFIG_KEYS
        if unknown:
            raise InputError("config", "only the keys %s" % ", ".join(sorted(_CONFIG_KEYS)), sorted(str(k) for k in unknown))
        if not isinstance(data.get("state_dir"), str) or not data.get("state_dir"):
            raise InputError("state_dir", "a directory path", data.get("state_dir"))
        for name, (types, expected) in _CONFIG_TYPES.items():
            value = data.get(name)
            if value is not None and (isinstance(value, bool) != (bool in types) or not isinstance(value, types)):
                raise InputError(name, expected, type(value).__name__)
        if isinstance(data.get("ek_ca"), list) and not all(isinstance(item, str) for item in data["ek_ca"]):
            raise InputError("ek_ca", "a PEM file path or a list of them", "a list with a %s"
                             % next(type(i).__name__ for i in data["ek_ca"] if not isinstance(i, str)))
        kwargs = {k: v for k, v in data.items() if k != "log_level"}
        config = cls(**kwargs)
        atls.parse_endpoint(config.public_endpoint, "public_endpoint")
        if config.coordinator_public_endpoint:
            atls.parse_endpoint(config.coordinator_public_endpoint, "coordinator_public_endpoint")
            if not config.coordinator_pub_key:
                # Every Node of the cluster passes the policy a joining node checks the Coordinator with: only
                # the Coordinators' key tells a Coordinator's join ticket from a forged one.
                raise InputError("coordinator_pub_key", "the Coordinators' signing key (role variable "
                                 "node_agent_coordinator_pub_key) when coordinator_public_endpoint is set (join mode)")
        if config.coordinator_pub_key is not None:
            config.coordinator_pub_key = parse_coordinator_pub_key(config.coordinator_pub_key)
        for name in ("update_interval", "join_interval"):
            value = getattr(config, name)
            if not isinstance(value, (int, float)) or not 0.05 <= value <= 3600:
                raise InputError(name, "seconds between 0.05 and 3600", value)
        value = config.reattest_interval
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value == 0 or 0.2 <= value <= 86400):
            raise InputError("reattest_interval", "seconds between 0.2 and 86400, or 0 (no re-attestation)", value)
        for name, low, high in (("reattest_unreachable_limit", 1, 1000), ("reattest_workers", 1, 64),
                                ("activation_workers", 1, MAX_ACTIVATION_WORKERS)):
            value = getattr(config, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise InputError(name, "an integer between %d and %d" % (low, high), value)
        validate_kubelet_cert_days(config.kubelet_cert_days)
        if config.ak_alg not in AK_ALGS:
            raise InputError("ak_alg", "one of %s" % ", ".join(AK_ALGS), config.ak_alg)
        config.init_secret_hash = require_init_secret_hash(config.init_secret_hash, config.insecure_unauthenticated_activation)
        for name in ("wg_listen_port", "vpn_api_port"):
            value = getattr(config, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
                raise InputError(name, "a port number between 1 and 65535", value)
        try:
            ipaddress.ip_network(config.vpn_cidr, strict=True)
        except (TypeError, ValueError):
            raise InputError("vpn_cidr", "an IP network such as 10.118.0.0/16", config.vpn_cidr) from None
        if not isinstance(config.store, Mapping):
            raise InputError("store", "a mapping (docs/store.md)", config.store)
        if config.etcd_member is not None:
            EtcdMember.from_config(config.etcd_member, config.state_dir)  # names a bad key before anything starts
        variant = choose.check_variant_allowed(config.variant, config.insecure_trust_any_ak)  # the one rule
        problem = x509compat.oid_problem(variant.variant.oid)
        if problem:
            raise InputError("variant", "a variant this host can attest with (%s: %s)" % (variant.name, problem))
        if variant.needs_policy and not config.measurements:
            raise InputError("measurements", "the path of a measurements policy (JSON)")
        if variant.needs_ek_ca and not config.ek_ca:
            raise InputError("ek_ca", "the PEM file or folder of the CAs that TPMs' EK certificates chain to (variant %s)"
                             % variant.name)
        host = atls.parse_endpoint(config.public_endpoint)[0]
        if not config.public_ip:
            if host in ("0.0.0.0", "::"):
                raise InputError("public_ip", "this node's public IP (public_endpoint binds to all addresses)")
            config.public_ip = host
        config.verify_grpc_endpoint, config.verify_http_endpoint = verify_service.config_endpoints(
            config.verify_grpc_endpoint, config.verify_http_endpoint, config.public_endpoint, config.public_ip)
        config.deprecations = deprecations
        return config

    @classmethod
    def load(cls, path: str) -> "AgentConfig":
        # JSON is YAML: one bounded loader for both (encoding.load_yaml), UTF-8 only, string keys.
        return cls.from_mapping(load_yaml(read_text(path, "config", expected="a readable file"), "config"))


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
        self._node_auth = NodePeerAuth()  # the vpnapi's PeerAuth with this node's WireGuard key
        self.vpnapi_server: Optional[FrameServer] = None
        self._vpnapi_lock = threading.Lock()
        self.issuer, self.node_validator, self.peer_validator = self._attestation()
        store_spec = config.store or {"type": "file", "path": os.path.join(config.state_dir, "store.json")}
        self.store = open_store(store_spec)
        self.vpn = WireGuardVPN(config.vpn_interface, os.path.join(config.state_dir, "%s.key" % config.vpn_interface),
                                listen_port=config.wg_listen_port, vpn_cidr=config.vpn_cidr)
        self.core = Core(self.store, TPMDevice(config.tcti), self.vpn, config.state_dir, config.public_ip,
                         self._disk_uuid(), log=self.log, init_secret_hash=config.init_secret_hash)
        self.core.join_coordinator_pub_key = config.coordinator_pub_key  # join tickets must verify with it
        self._reattest_started = False
        self.admin = AdminHandlers(self.core, self.log, issue=self._issue_for_connection,
                                   variant_oid=self.issuer.oid)
        self.pubapi = PubAPI(self.core, self.node_validator, admin=self.admin, log=self.log, issuer=self.issuer,
                             validator_for_activation=self.peer_validator)
        self.vpnapi = VPNAPI(self.core, kubeadm=JoinProvider(config.kubeadm_path, config.kubernetes_dir,
                                                                  kubelet_cert_days=config.kubelet_cert_days), log=self.log)
        self.core.activation_workers = config.activation_workers
        self.core.etcd_member = (EtcdMember.from_config(config.etcd_member, config.state_dir)
                                 if config.etcd_member is not None else None)
        self.core.on_state_change(self._on_state)

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
            policy = load_policy_file(self.config.measurements, public_key_path=self.config.measurements_public_key)
        issuer_options = {"ak_alg": self.config.ak_alg} if variant != "dummy" else {}
        return (choose.issuer(variant, self.config.tcti, **issuer_options),
                choose.validator(variant, fresh_node_policy(policy) if policy else None, trust),
                choose.validator(variant, coordinator_policy(policy) if policy else None, trust))

    def _issue_for_connection(self, user_data: bytes, nonce: bytes) -> bytes:
        """Attest (admin channel): a quote as the aTLS server context issues it (with its deadline)."""
        return self.tls.issue(user_data, nonce)

    def _disk_uuid(self) -> str:
        path = self.config.disk_uuid_file or os.path.join(self.config.state_dir, "disk_uuid")
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
        state = self.core.load()
        for deprecation in self.config.deprecations:
            self.log("config_deprecated", level="warning", message=deprecation)
        self.log("agent_started", state=state.wire_name, role=self.core.role, disk_uuid=self.core.disk_uuid,
                 failure=self.core.failure)
        if self.config.init_secret_hash is None:  # insecure_unauthenticated_activation: said on every start
            self.log("init_secret_not_configured", level="warning", message="no init_secret_hash: anyone can activate this node")
        if choose.insecure_warning(self.config.variant):  # insecure_trust_any_ak: said on every start
            self.log("insecure_variant", level="warning", message=choose.insecure_warning(self.config.variant))
        if self.config.measurements_public_key is None and self.config.measurements:
            self.log("measurements_unsigned", level="warning",
                     message="no measurements_public_key: the policy file is used without a signature check")
        host, port = atls.parse_endpoint(self.config.public_endpoint)
        self.tls = AgentServerContext(self.issuer)
        # Constellation's verification service: plain gRPC and HTTP, quotes for user data "VerifyService".
        self.servers.extend(verify_service.serve(self.config.verify_grpc_endpoint, self.config.verify_http_endpoint,
                                                 self.tls.issue, log=self.log))
        handlers = dict(self.pubapi.handlers())
        handlers.update(self.admin.handlers())
        self.servers.append(FrameServer("pubapi", (host, port), handlers, tls=self.tls, log=self.log,
                                        apis=(schema.PUBAPI, schema.ADMIN)).start())
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
        port = atls.parse_endpoint(self.config.public_endpoint)[1]
        timeout = max(2.0, min(10.0, float(self.config.reattest_interval)))

        def connect_peer(public_ip: str):
            # A new aTLS connection: a fresh nonce, a fresh quote; the policy without PCR 15 (the Core checks it).
            endpoint = ("[%s]:%d" if ":" in public_ip else "%s:%d") % (public_ip, port)
            return connect_enrolling(lambda v: AgentClient.connect(endpoint, v, timeout=timeout), [self.peer_validator])

        # One Coordinator at a time re-attests (an etcd lease when several share the store; alone, always).
        leadership = Leadership(self.core.store, "%s@%s" % (self.config.public_ip, self.core.vpn_ip),
                                ttl=max(2, min(60, int(self.config.reattest_interval * 2) + 1)))
        loop = ReattestLoop(self.core, connect_peer, float(self.config.reattest_interval), self.config.reattest_workers,
                            self.config.reattest_unreachable_limit, self._stop, log=self.log, leadership=leadership)
        self._spawn("reattest", loop.run)

    def _start_vpnapi(self) -> None:
        with self._vpnapi_lock:
            if self.vpnapi_server is not None or self._stop.is_set():
                return
            self.vpnapi_server = FrameServer("vpnapi", (self.core.vpn_ip, self.config.vpn_api_port),
                                             self.vpnapi.handlers(), log=self.log,
                                             accept_check=self.vpnapi.accept_check, apis=(schema.VPNAPI,)).start()
            self.servers.append(self.vpnapi_server)

    def _loop(self) -> None:
        """Nodes: join (if configured) while AcceptingInit, then poll GetUpdate with backoff."""
        failures = 0
        while not self._stop.is_set():
            state = self.core.state
            delay = self.config.update_interval
            try:
                if state == State.IS_NODE:
                    self._update_once()
                elif state == State.ACTIVATING_NODES and self.core.etcd_member is not None:
                    self.core.supervise_etcd_member()  # its member died: started again, it rejoins
                    self.core.sync_coordinator_peers()  # another Coordinator may have changed the peers
                elif state == State.NODE_WAITING_FOR_CLUSTER_JOIN and self.core.coordinator_vpn_ip:
                    self._finish_activation_once()
                elif state == State.ACCEPTING_INIT and self.core.recovery_pending and self.core.role == ROLE_NODE:
                    # Rebooted: a rejoin ticket from the Coordinator, never the KMS URI.
                    delay = self.config.join_interval
                    self._rejoin_once()
                elif (state == State.ACCEPTING_INIT and self.config.coordinator_public_endpoint
                      and not self.core.recovery_pending):
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
        ips = self.core.coordinator_vpn_ips()
        if self._update_from in ips:
            start = ips.index(self._update_from)
            ips = ips[start:] + ips[:start]
        endpoint, answer = ask_in_turn(["%s:%d" % (ip, self.config.vpn_api_port) for ip in ips],  # PeerAuth, then call
                                       lambda c: call(self._node_auth.authenticate(c, self.core.node_state)), timeout)
        from_ip = endpoint.rsplit(":", 1)[0]
        if from_ip != (self._update_from or ips[0]):
            self.log("update_failover", coordinator_vpn_ip=from_ip, level="warning")
        self._update_from = from_ip
        return answer

    def _update_once(self) -> None:
        self.core.apply_update(self._ask_coordinators(lambda client: client.get_update(self.core.resource_version)))

    def _finish_activation_once(self) -> None:
        """An interrupted activation: our disk key from a Coordinator, through the WireGuard tunnel."""
        self.core.finish_activation(lambda: self._ask_coordinators(lambda client: client.get_state_disk_key()))

    def _rejoin_once(self) -> None:
        """A rebooted Node: a rejoin ticket from its Coordinator, or from the next one it knows."""
        port = atls.parse_endpoint(self.config.public_endpoint)[1]
        endpoints = [self.config.coordinator_public_endpoint] if self.config.coordinator_public_endpoint else [
            ("[%s]:%d" if ":" in ip else "%s:%d") % (ip, port) for ip in self.core.coordinator_public_ips()]
        if not endpoints:
            raise ConstellationError("rejoin: the stored peers do not name a Coordinator's public IP")
        result = rejoin_cluster(self.core, endpoints, [self.peer_validator], self.issuer)
        self.log("rejoined", node_vpn_ip=result.get("vpn_ip"), resource_version=result.get("resource_version"))

    def _join_once(self) -> None:
        result = join_cluster(self.core, self.config.coordinator_public_endpoint, [self.peer_validator],
                              self.issuer)
        self.log("joined", node_vpn_ip=result.get("node_vpn_ip"), resource_version=result.get("resource_version"))

    def stop(self) -> None:
        self._stop.set()
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
        for store in {id(s): s for s in (self.store, self.core.store)}.values():  # local, and etcd's
            with contextlib.suppress(ConstellationError):
                store.close()
        if self.core.etcd_member is not None:
            self.core.etcd_member.stop()
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
    return 0
