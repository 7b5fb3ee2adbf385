# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node agent's configuration (docs/agent.md, "Configuration"): its keys, their types and defaults, and
every check made before anything starts, so that a bad or missing option is an ``InputError`` naming it. The
secure defaults are decided here and in the Core functions it calls (``choose.check_variant_allowed``,
``init_secret.require_init_secret_hash``); an insecure choice is an explicit key named for what it does
(docs/security.md)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils import atls
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose, deployment
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import AK_ALGS
from ansible_collections.constellation.cluster.plugins.module_utils.core.activation import ACTIVATION_WORKERS, MAX_ACTIVATION_WORKERS
from ansible_collections.constellation.cluster.plugins.module_utils.core.eviction.peer_trust import UNVERIFIED_EVICTION_AFTER
from ansible_collections.constellation.cluster.plugins.module_utils.disk.luks import dm_crypt_available
from ansible_collections.constellation.cluster.plugins.module_utils.disk.state_disk import DEFAULT_MAPPER_NAME
from ansible_collections.constellation.cluster.plugins.module_utils.encoding import load_yaml, read_text
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.core.signing import parse_coordinator_pub_key
from ansible_collections.constellation.cluster.plugins.module_utils.kms.init_secret import require_init_secret_hash
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.join_provider import (
    KUBELET_CERT_DAYS,
    validate_kubelet_cert_days,
)
from ansible_collections.constellation.cluster.plugins.module_utils.agent.vpnapi import VPNAPI_PORT
from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd_member import EtcdMember
from ansible_collections.constellation.cluster.plugins.module_utils.agent import verify_service
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import VPN_CIDR

DEFAULT_PUBLIC_PORT = 9000
DEFAULT_UPDATE_INTERVAL = 10.0
# Re-attestation of every Node by the Coordinator (docs/agent.md, "Re-attestation and eviction").
DEFAULT_REATTEST_INTERVAL = 60.0
DEFAULT_REATTEST_UNREACHABLE_LIMIT = 3
DEFAULT_REATTEST_WORKERS = 4
MAX_UNVERIFIED_EVICTION_AFTER = 30 * 86400.0
# Renamed keys (docs/names.md); the old names work, with a warning in the log, until 2.0.0.
_DEPRECATED_KEYS = {"wg_interface": "vpn_interface", "wg_listen_port": "vpn_listen_port", "vpn_api_port": "vpnapi_port",
                    "disk_uuid_file": "state_disk_uuid_file", "measurements_public_key": "measurements_pub_key"}
_CONFIG_KEYS = {"public_endpoint", "public_ip", "tcti", "variant", "measurements", "ek_ca", "store",
                "state_dir", "vpn_interface",
                "amd_roots", "snp_report_source",  # the SEV-SNP variants: attestation/sev_snp.py, attestation/snp.py
                "amd_cert_cache", "amd_kds_fetch",  # where the SEV-SNP issuers find a VCEK the platform did not send (attestation/amd_certs.py)
                "vpnapi_port", "update_interval", "state_disk_uuid_file", "coordinator_public_endpoint", "join_interval",
                "vpn_cidr", "vpn_listen_port", "log_level", "measurements_pub_key", "init_secret_hash",
                "reattest_interval", "reattest_unreachable_limit", "unverified_eviction_after", "reattest_workers", "activation_workers", "ak_alg",
                "etcd_member", "kubeadm_path", "kubernetes_dir",  # kubeadm: kubeadm/join_provider.py
                "kubelet_cert_days", "coordinator_pub_key",
                "state_disk_device", "state_disk_mapper_name",  # the encrypted state disk: disk/
                "deployment_mode",  # attestation/deployment.py: what the TPM proves against the host's root
                "node_settings",  # per-node settings outside the measured image (NODE_SETTINGS_KEYS only)
                "insecure_trust_any_ak", "insecure_unauthenticated_activation",  # explicit insecure choices
                "insecure_unsigned_measurements", "insecure_join_without_admission"}
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
    "measurements_pub_key": ((str,), "the path of the pinned ECDSA P-256 public key (PEM) the policy is signed with"),
    "init_secret_hash": ((str,), "hex SHA-256 of this node's init secret (64 hex digits)"),
    "ek_ca": ((str, list), "a PEM file path or a list of them"),
    "amd_roots": ((str, list), "a PEM file or folder of AMD root certificates (ARK, ASK/ASVK), or a list of them"),
    "snp_report_source": ((str,), "configfs-tsm:<path> or unix:<path> (where the SEV-SNP report comes from)"),
    "amd_cert_cache": ((str,), "the path of a folder of AMD certificates (VCEKs and chains, named as AMD's KDS names them)"),
    "amd_kds_fetch": ((bool,), "true or false"),
    "store": ((Mapping,), "a mapping (docs/store.md)"),
    "etcd_member": ((Mapping,), "a mapping (docs/store.md, several Coordinators)"),
    "vpn_interface": ((str,), "an interface name"),
    "vpn_cidr": ((str,), "an IP network such as 10.118.0.0/16"),
    "state_disk_uuid_file": ((str,), "a file path"),
    "log_level": ((str,), "a log level name"),
    "ak_alg": ((str,), "rsa or ecc"),
    "kubeadm_path": ((str,), "the path of the kubeadm executable"),
    "kubernetes_dir": ((str,), "an absolute path (kubeadm's directory, /etc/kubernetes)"),
    "state_disk_device": ((str,), "the absolute path of the state disk's block device"),
    "state_disk_mapper_name": ((str,), "a device-mapper name such as constellation-state"),
    "insecure_trust_any_ak": ((bool,), "true or false"), "insecure_unauthenticated_activation": ((bool,), "true or false"),
    "insecure_unsigned_measurements": ((bool,), "true or false"),
    "deployment_mode": ((str,), "one of %s" % ", ".join(deployment.MODES)),
    "node_settings": ((str,), "the absolute path of a file or raw block device holding this node's settings (JSON)"),
    "insecure_join_without_admission": ((bool,), "true or false"),
}


@dataclass
class AgentConfig:
    state_dir: str
    public_endpoint: str = "0.0.0.0:%d" % DEFAULT_PUBLIC_PORT
    public_ip: Optional[str] = None
    tcti: Optional[str] = None
    variant: str = choose.DEFAULT_VARIANT
    measurements: Optional[str] = None
    ek_ca: Optional[Any] = None  # qemu-vtpm-ek: PEM file(s) of the CA(s) that TPMs' EK certificates chain to
    amd_roots: Optional[Any] = None  # SEV-SNP variants: AMD root bundle (PEM file(s)/folder); None: the pinned roots
    snp_report_source: Optional[str] = None  # SEV-SNP variants: configfs-tsm:<path> (None: Linux's) or unix:<path>
    amd_cert_cache: Optional[str] = None  # the SEV-SNP issuers: a VCEK the platform did not send (Azure's THIM fills it)
    amd_kds_fetch: Optional[bool] = None  # the SEV-SNP issuers: fetch a missing VCEK from AMD's KDS (explicit)
    store: Dict[str, Any] = field(default_factory=dict)
    etcd_member: Optional[Dict[str, Any]] = None  # a Coordinator shares the cluster's state in etcd (docs/store.md)
    vpn_interface: str = "wg0"
    vpn_listen_port: int = 51820
    vpnapi_port: int = VPNAPI_PORT
    vpn_cidr: str = VPN_CIDR
    update_interval: float = DEFAULT_UPDATE_INTERVAL
    state_disk_uuid_file: Optional[str] = None
    coordinator_public_endpoint: Optional[str] = None
    # Join mode: the Coordinators' signing key (core/signing.py); join tickets must be signed with it.
    coordinator_pub_key: Optional[str] = None
    join_interval: float = 5.0
    measurements_pub_key: Optional[str] = None  # pinned key: the policy file must be signed (FILE.sig)
    init_secret_hash: Optional[str] = None  # hex SHA-256 of this node's init secret: activation needs its proof
    reattest_interval: float = DEFAULT_REATTEST_INTERVAL  # Coordinator: seconds between re-attestation rounds
    reattest_unreachable_limit: int = DEFAULT_REATTEST_UNREACHABLE_LIMIT  # consecutive unreachable rounds -> unverified
    # Coordinator: seconds a Node stays unreachable (unverified, no new secret) before it is evicted
    unverified_eviction_after: float = UNVERIFIED_EVICTION_AFTER
    reattest_workers: int = DEFAULT_REATTEST_WORKERS  # peers re-attested at once
    activation_workers: int = ACTIVATION_WORKERS  # Coordinator: Nodes activated at once
    ak_alg: str = "rsa"  # the AK of the vTPM variants: rsa (as Constellation's issuer) or ecc (P-256, faster)
    kubeadm_path: Optional[str] = None  # Coordinator: kubeadm for join arguments (None: looked up on PATH)
    kubernetes_dir: str = "/etc/kubernetes"  # Coordinator: where its control plane is (admin.conf, pki/)
    kubelet_cert_days: int = KUBELET_CERT_DAYS  # Coordinator: lifetime of the kubelet certificates it signs
    verify_grpc_endpoint: Optional[str] = None  # None: public_endpoint's host, port 9090; "": off
    verify_http_endpoint: Optional[str] = None  # None: public_endpoint's host, port 8080; "": off
    state_disk_device: Optional[str] = None  # the LUKS2 state disk (docs/agent.md, "State disk"); None: not encrypted
    state_disk_mapper_name: str = DEFAULT_MAPPER_NAME  # opened at /dev/mapper/<name>, mounted at <state_dir>/disk
    insecure_trust_any_ak: bool = False  # accept variant qemu-vtpm (it trusts any AK); warned on every start
    insecure_unauthenticated_activation: bool = False  # start without init_secret_hash; warned on every start
    insecure_unsigned_measurements: bool = False  # start without measurements_pub_key; warned on every start
    deployment_mode: str = deployment.DEFAULT  # host: the agent runs on an ordinary host (host root is trusted)
    node_settings: Optional[str] = None  # read by ``load``: this node's public_endpoint, public_ip, init_secret_hash
    # Coordinator: any node that passes attestation joins, without the admin's admission; warned on every start.
    insecure_join_without_admission: bool = False
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
        for name in ("ek_ca", "amd_roots"):
            if isinstance(data.get(name), list) and not all(isinstance(item, str) for item in data[name]):
                raise InputError(name, _CONFIG_TYPES[name][1], "a list with a %s"
                                 % next(type(i).__name__ for i in data[name] if not isinstance(i, str)))
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
        value = config.unverified_eviction_after
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 <= value <= MAX_UNVERIFIED_EVICTION_AFTER:
            raise InputError("unverified_eviction_after", "seconds between 1 and %d (how long a Node may stay unreachable "
                             "before it is evicted)" % MAX_UNVERIFIED_EVICTION_AFTER, value)
        for name, low, high in (("reattest_unreachable_limit", 1, 1000), ("reattest_workers", 1, 64),
                                ("activation_workers", 1, MAX_ACTIVATION_WORKERS)):
            value = getattr(config, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise InputError(name, "an integer between %d and %d" % (low, high), value)
        validate_kubelet_cert_days(config.kubelet_cert_days)
        if config.node_settings is not None and (not config.node_settings.startswith("/") or "\0" in config.node_settings):
            raise InputError("node_settings", "the absolute path of a file or raw block device holding this node's "
                             "settings (JSON)", config.node_settings)
        _check_state_disk_keys(config)
        if config.ak_alg not in AK_ALGS:
            raise InputError("ak_alg", "one of %s" % ", ".join(AK_ALGS), config.ak_alg)
        for name in ("vpn_listen_port", "vpnapi_port"):
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
        if variant.needs_policy and not config.measurements:
            raise InputError("measurements", "the path of a measurements policy (JSON)")
        if variant.needs_policy and not config.measurements_pub_key and not config.insecure_unsigned_measurements:
            # An unsigned policy file is whatever the disk holds: nothing unsigned may decide what is accepted.
            raise InputError("measurements_pub_key", "the pinned measurements public key (PEM) the policy file is "
                             "signed with (measurements_signature; role variable node_agent_measurements_pub_key), or "
                             "insecure_unsigned_measurements: true to use an unsigned policy file (warned on every start)")
        deployment.check_mode(config.deployment_mode)
        if variant.needs_ek_ca and not config.ek_ca:
            raise InputError("ek_ca", "the PEM file or folder of the CAs that TPMs' EK certificates chain to (variant %s)"
                             % variant.name)
        if not variant.needs_amd_roots:
            for name in ("amd_roots", "snp_report_source", "amd_cert_cache", "amd_kds_fetch"):
                if getattr(config, name) is not None:
                    raise InputError(name, "no %s with variant %s (only the SEV-SNP variants read it)"
                                     % (name, variant.name), getattr(config, name))
        elif config.snp_report_source is not None:
            from ansible_collections.constellation.cluster.plugins.module_utils.attestation.snp import parse_report_source

            parse_report_source(config.snp_report_source, "snp_report_source")
        host = atls.parse_endpoint(config.public_endpoint)[0]
        if not config.public_ip:
            if host in ("0.0.0.0", "::"):
                raise InputError("public_ip", "this node's public IP (public_endpoint binds to all addresses)")
            config.public_ip = host
        # After the settings it is derived from (the role hashes the init secret with public_ip).
        config.init_secret_hash = require_init_secret_hash(config.init_secret_hash, config.insecure_unauthenticated_activation)
        config.verify_grpc_endpoint, config.verify_http_endpoint = verify_service.config_endpoints(
            config.verify_grpc_endpoint, config.verify_http_endpoint, config.public_endpoint, config.public_ip)
        config.deprecations = deprecations
        return config

    @classmethod
    def load(cls, path: str) -> "AgentConfig":
        """The agent's configuration file, with the per-node settings its ``node_settings`` names over it (on the
        node only: ``from_mapping`` reads no device, it also runs on the controller)."""
        # JSON is YAML: one bounded loader for both (encoding.load_yaml), UTF-8 only, string keys.
        data = load_yaml(read_text(path, "config", expected="a readable file"), "config")
        if not isinstance(data, Mapping) or not isinstance(data.get("node_settings"), str):
            return cls.from_mapping(data)
        settings = read_node_settings(data["node_settings"])
        try:
            return cls.from_mapping(dict(data, **settings))
        except InputError as err:
            if err.field not in settings:
                raise
            # A bad value from the per-node settings: say where it came from.
            raise InputError("node_settings", "%s %s in %s" % (err.field, err.expected, data["node_settings"]),
                             err.got) from None


# Per-node settings (docs/agent.md, "Per-node settings"): the node image's configuration is baked into its
# measured root; what differs between the nodes booted from one image comes from outside the measurement, so it
# may only be what decides where the node is reached and who may activate it - never what it trusts.
NODE_SETTINGS_KEYS = ("public_endpoint", "public_ip", "init_secret_hash")
MAX_NODE_SETTINGS = 64 * 1024


def read_node_settings(path: str) -> Dict[str, Any]:
    """The settings in ``path`` (a file or a raw block device: one JSON object, NUL bytes after it ignored, at
    most MAX_NODE_SETTINGS bytes); {} when ``path`` does not exist. Any key but NODE_SETTINGS_KEYS is refused
    (InputError naming ``node_settings``, the key and that it would change what this node trusts), as is a
    malformed document (InputError naming ``node_settings`` and ``path``)."""
    import collections
    import json

    def malformed(expected: str, got: object = None) -> InputError:
        return InputError("node_settings", "%s in %s" % (expected, path), got)

    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_NODE_SETTINGS + 1)
    except FileNotFoundError:
        return {}
    except OSError as err:
        raise malformed("a readable file or block device", err.strerror or str(err)) from None
    document, _nul, rest = data.partition(b"\0")
    if len(document) > MAX_NODE_SETTINGS:
        raise malformed("one JSON object of at most %d bytes" % MAX_NODE_SETTINGS)
    if rest.strip(b"\0"):
        raise malformed("one JSON object followed by NUL bytes only (something else follows a NUL)")

    def pairs(items):
        counts = collections.Counter(key for key, _value in items)
        duplicated = sorted(key for key, count in counts.items() if count > 1)
        if duplicated:
            raise malformed("each key once", duplicated)
        return dict(items)

    try:
        settings = json.loads(document.decode("utf-8"), object_pairs_hook=pairs)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        if isinstance(err, InputError):
            raise
        raise malformed("one JSON object (UTF-8)", str(err)[:200]) from None
    if not isinstance(settings, dict):
        raise malformed("one JSON object", type(settings).__name__)
    for key in sorted(settings):
        if key not in NODE_SETTINGS_KEYS:
            raise InputError("node_settings", "only the keys %s in %s: %r would change what this node trusts (it "
                             "is set by the measured image only)" % (", ".join(NODE_SETTINGS_KEYS), path, key), key)
        if not isinstance(settings[key], str):
            raise malformed("%s as a string (%s)" % (key, _CONFIG_TYPES[key][1]), type(settings[key]).__name__)
    return settings


_MAPPER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")


def _check_state_disk_keys(config: AgentConfig) -> None:
    """The values of the state disk's keys (no device is touched: this runs on the controller too)."""
    device = config.state_disk_device
    if device is not None and (not device.startswith("/") or "\0" in device):
        raise InputError("state_disk_device", "the absolute path of the state disk's block device", device)
    if not _MAPPER_NAME.match(config.state_disk_mapper_name or ""):
        raise InputError("state_disk_mapper_name", "a device-mapper name (letters, digits, _ . + -, at most 64)",
                         config.state_disk_mapper_name)
    if device is not None and config.store:
        raise InputError("store", "no store setting with state_disk_device (the agent keeps its file store on the "
                         "state disk, at <state_dir>/disk/store.json)", dict(config.store))


def require_dm_crypt(config: AgentConfig, available: Callable[[], Tuple[bool, str]] = dm_crypt_available) -> None:
    """At the agent's start, on the node: with ``state_disk_device`` this kernel must be able to open it."""
    if config.state_disk_device is None:
        return
    usable, reason = available()
    if not usable:
        raise InputError("state_disk_device", "a host whose kernel has dm-crypt to open %s (%s)"
                         % (config.state_disk_device, reason))
