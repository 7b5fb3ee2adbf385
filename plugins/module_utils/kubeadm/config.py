# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The configuration documents Constellation generates (InitConfiguration, ClusterConfiguration,
JoinConfiguration, KubeletConfiguration, the audit policy), from validated parameters; redaction of
what is reported."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.validate import (  # noqa: F401
    AUDIT_API_VERSION,
    CONSTELLATION_SKIP_PHASES,
    KUBE_PROXY_PHASE,
    AUDIT_LOG_DIR,
    AUDIT_POLICY_FILE,
    CRI_SOCKET,
    DEFAULT_API_VERSION,
    DEFAULT_CLUSTER_NAME,
    DEFAULT_SERVICE_CIDR,
    DEFAULT_TOKEN_TTL,
    DOWNLOAD_CERTS_PHASE,
    FLEX_VOLUME_PLUGIN_DIR,
    KUBEADM_GROUP,
    KUBELET_API_VERSION,
    KUBELET_LOCAL_MODE_MIN_VERSION,
    KUBELET_TLS_CERT_FILE,
    KUBELET_TLS_CIPHER_SUITES,
    KUBELET_TLS_KEY_FILE,
    KUBERNETES_DIR,
    KUBERNETES_PORT,
    PATCHES_DIR,
    REDACTED,
    REGISTER_WITH_TAINTS,
    TOKEN_DESCRIPTION,
    TOKEN_GROUP,
    TOKEN_USAGES,
    V1BETA4_MIN_VERSION,
    _validate_path,
    _validate_str_list,
    validate_api_version,
    validate_ca_cert_hash,
    validate_certificate_key,
    validate_cidr,
    validate_endpoint,
    validate_host,
    validate_ip,
    validate_kubernetes_version,
    validate_node_name,
    validate_skip_phases,
    validate_token,
    validate_ttl,
)

try:
    import yaml
except ImportError:  # pragma: no cover - reported by the modules via HAS_YAML
    HAS_YAML = False
else:
    HAS_YAML = True


# --------------------------------------------------------------------------- parameters


@dataclass
class InitParams:
    """What ``kubeadm init`` needs; validated on construction (each error names its field)."""

    kubernetes_version: str
    node_name: str
    node_vpn_ip: str
    cluster_name: str = DEFAULT_CLUSTER_NAME
    control_plane_endpoint: Optional[str] = None
    service_cidr: str = DEFAULT_SERVICE_CIDR
    pod_cidr: Optional[str] = None
    allocate_node_cidrs: bool = True
    apiserver_cert_sans: Sequence[str] = ()
    cloud_provider: str = ""
    provider_id: Optional[str] = None
    cri_socket: str = CRI_SOCKET
    patches_dir: Optional[str] = PATCHES_DIR
    kubelet_tls_cert_file: Optional[str] = None
    kubelet_tls_key_file: Optional[str] = None
    skip_phases: Sequence[str] = ()
    kube_proxy: bool = False
    token: Optional[str] = field(default=None, repr=False)
    token_ttl: str = DEFAULT_TOKEN_TTL
    certificate_key: Optional[str] = field(default=None, repr=False)
    api_version: str = DEFAULT_API_VERSION
    kubernetes_dir: str = KUBERNETES_DIR

    def __post_init__(self):
        self.version_tuple = validate_kubernetes_version(self.kubernetes_version)
        self.api_version = validate_api_version(self.api_version)
        if self.api_version == "v1beta4" and self.version_tuple < V1BETA4_MIN_VERSION:
            raise InputError("api_version", "v1beta3 for Kubernetes older than v1.31.0 (kubeadm reads v1beta4 from "
                             "v1.31 on)", self.api_version)
        self.node_name = validate_node_name(self.node_name)
        self.node_vpn_ip = validate_ip(self.node_vpn_ip, "node_vpn_ip")
        self.cluster_name = validate_node_name(self.cluster_name, "cluster_name")
        if self.control_plane_endpoint:
            self.control_plane_endpoint = validate_endpoint(self.control_plane_endpoint, "control_plane_endpoint",
                                                            default_port=KUBERNETES_PORT)
        self.service_cidr = validate_cidr(self.service_cidr, "service_cidr")
        if self.pod_cidr:
            self.pod_cidr = validate_cidr(self.pod_cidr, "pod_cidr")
        if not isinstance(self.allocate_node_cidrs, bool):
            raise InputError("allocate_node_cidrs", "true or false", self.allocate_node_cidrs)
        self.apiserver_cert_sans = [validate_host(san, "apiserver_cert_sans")
                                    for san in _validate_str_list(self.apiserver_cert_sans, "apiserver_cert_sans")]
        if not isinstance(self.cloud_provider, str):
            raise InputError("cloud_provider", "a string (empty on QEMU)", self.cloud_provider)
        self.skip_phases = validate_skip_phases(self.skip_phases)
        if not isinstance(self.kube_proxy, bool):
            raise InputError("kube_proxy", "true or false", self.kube_proxy)
        if self.token is not None:
            validate_token(self.token)
        self.token_ttl = validate_ttl(self.token_ttl, "token_ttl")
        if self.certificate_key is not None:
            validate_certificate_key(self.certificate_key)
        self.kubernetes_dir = _validate_path(self.kubernetes_dir, "kubernetes_dir")
        if self.patches_dir:
            self.patches_dir = _validate_path(self.patches_dir, "patches_dir")
        if bool(self.kubelet_tls_cert_file) != bool(self.kubelet_tls_key_file):
            raise InputError("kubelet_tls_key_file", "both kubelet_tls_cert_file and kubelet_tls_key_file, or neither",
                             self.kubelet_tls_key_file)
        if not self.kubelet_tls_cert_file:
            # The first kubelet's serving certificate is signed with the cluster CA at init (docs/kubeadm.md, "Init, step by step as Constellation does it").
            self.kubelet_tls_cert_file = os.path.join(self.kubernetes_dir, KUBELET_TLS_CERT_FILE)
            self.kubelet_tls_key_file = os.path.join(self.kubernetes_dir, KUBELET_TLS_KEY_FILE)
        for name in ("kubelet_tls_cert_file", "kubelet_tls_key_file"):
            setattr(self, name, _validate_path(getattr(self, name), name))

    @property
    def admin_client_name(self) -> str:
        """The user of the admin kubeconfig init returns (Constellation: ``<clusterName>-admin``)."""
        return "%s-admin" % self.cluster_name

    @property
    def admin_kubeconfig_path(self) -> str:
        """Where the node keeps that kubeconfig (0600, like admin.conf and super-admin.conf)."""
        return os.path.join(self.kubernetes_dir, "%s.conf" % self.admin_client_name)

    @property
    def init_skip_phases(self) -> list:
        """--skip-phases of the final ``kubeadm init``: Constellation's, kube-proxy unless asked for, and the
        caller's own."""
        skip = list(CONSTELLATION_SKIP_PHASES)
        if not self.kube_proxy:
            skip.append(KUBE_PROXY_PHASE)
        return skip + [phase for phase in self.skip_phases if phase not in skip]


@dataclass
class JoinParams:
    """What ``kubeadm join`` needs. ``ca_cert_hash`` is mandatory: the CA is always pinned."""

    api_server_endpoint: str
    token: str = field(repr=False)
    ca_cert_hash: str
    node_name: str
    node_vpn_ip: str
    control_plane: bool = False
    certificate_key: Optional[str] = field(default=None, repr=False)
    cloud_provider: str = ""
    provider_id: Optional[str] = None
    cri_socket: str = CRI_SOCKET
    patches_dir: Optional[str] = PATCHES_DIR
    api_version: str = DEFAULT_API_VERSION
    kubernetes_dir: str = KUBERNETES_DIR

    def __post_init__(self):
        self.ca_cert_hash = validate_ca_cert_hash(self.ca_cert_hash)
        self.api_server_endpoint = validate_endpoint(self.api_server_endpoint, "api_server_endpoint")
        validate_token(self.token)
        self.node_name = validate_node_name(self.node_name)
        self.node_vpn_ip = validate_ip(self.node_vpn_ip, "node_vpn_ip")
        self.api_version = validate_api_version(self.api_version)
        if not isinstance(self.cloud_provider, str):
            raise InputError("cloud_provider", "a string (empty on QEMU)", self.cloud_provider)
        if self.certificate_key is not None:
            if not self.control_plane:
                raise InputError("certificate_key", "only with control_plane=true (workers download no certificates)")
            validate_certificate_key(self.certificate_key)
        self.kubernetes_dir = _validate_path(self.kubernetes_dir, "kubernetes_dir")
        if self.patches_dir:
            self.patches_dir = _validate_path(self.patches_dir, "patches_dir")


# --------------------------------------------------------------------------- rendering


def _extra_args(args: Sequence[tuple], api_version: str):
    """v1beta3: a string map; v1beta4: a list of {name, value} (it allows repeated flags)."""
    if api_version == "v1beta3":
        return dict(args)
    return [{"name": name, "value": value} for name, value in args]


def _kubeadm_api(api_version: str) -> str:
    return "%s/%s" % (KUBEADM_GROUP, api_version)


def _pki_dir(kubernetes_dir: str) -> str:
    return os.path.join(kubernetes_dir, "pki")


def audit_policy_path(kubernetes_dir: str = KUBERNETES_DIR) -> str:
    return os.path.join(kubernetes_dir, AUDIT_POLICY_FILE)


def audit_policy() -> dict:
    """Constellation's audit policy: one rule, level Metadata."""
    return {"apiVersion": AUDIT_API_VERSION, "kind": "Policy", "rules": [{"level": "Metadata"}]}


def _kubelet_extra_args(params, with_provider_id: bool) -> list:
    args = [("cloud-provider", params.cloud_provider), ("node-ip", params.node_vpn_ip)]
    if with_provider_id and params.provider_id:
        args.append(("provider-id", params.provider_id))
    return args


def _node_cidr_args(params: InitParams) -> list:
    """The controller-manager's node CIDRs: kubeadm turns ``allocate-node-cidrs`` on with a pod network; off where
    another allocator owns them (the Coordinator, docs/kubeadm.md, "The pod network")."""
    return [] if params.allocate_node_cidrs else [("allocate-node-cidrs", "false")]


def render_init(params: InitParams) -> list:
    """InitConfiguration, ClusterConfiguration and KubeletConfiguration as plain dicts."""
    api = params.api_version
    k8s_dir = params.kubernetes_dir
    ca_crt = os.path.join(_pki_dir(k8s_dir), "ca.crt")
    policy = audit_policy_path(k8s_dir)

    init = {
        "apiVersion": _kubeadm_api(api),
        "kind": "InitConfiguration",
        "nodeRegistration": {
            "name": params.node_name,
            "criSocket": params.cri_socket,
            "kubeletExtraArgs": _extra_args(_kubelet_extra_args(params, True), api),
        },
        "localAPIEndpoint": {"advertiseAddress": params.node_vpn_ip, "bindPort": KUBERNETES_PORT},
    }
    if params.patches_dir:
        init["patches"] = {"directory": params.patches_dir}
    if params.skip_phases:
        init["skipPhases"] = list(params.skip_phases)
    if params.token:
        init["bootstrapTokens"] = [{
            "token": params.token,
            "description": TOKEN_DESCRIPTION,
            "ttl": params.token_ttl,
            "usages": list(TOKEN_USAGES),
            "groups": [TOKEN_GROUP],
        }]
    if params.certificate_key:
        init["certificateKey"] = params.certificate_key

    networking = {"serviceSubnet": params.service_cidr}
    if params.pod_cidr:
        networking["podSubnet"] = params.pod_cidr
    cert_sans = []
    for san in ["127.0.0.1", params.node_vpn_ip] + list(params.apiserver_cert_sans):
        if san not in cert_sans:
            cert_sans.append(san)
    cluster = {
        "apiVersion": _kubeadm_api(api),
        "kind": "ClusterConfiguration",
        "clusterName": params.cluster_name,
        "kubernetesVersion": params.kubernetes_version,
        "controlPlaneEndpoint": params.control_plane_endpoint or "%s:%d" % (
            params.node_vpn_ip if ":" not in params.node_vpn_ip else "[%s]" % params.node_vpn_ip, KUBERNETES_PORT),
        "certificatesDir": _pki_dir(k8s_dir),
        "networking": networking,
        "apiServer": {
            "certSANs": cert_sans,
            "extraArgs": _extra_args([
                ("audit-policy-file", policy),
                ("audit-log-path", os.path.join(AUDIT_LOG_DIR, "audit.log")),
                ("audit-log-maxage", "30"),
                ("audit-log-maxbackup", "10"),
                ("audit-log-maxsize", "100"),
                ("profiling", "false"),
                ("kubelet-certificate-authority", ca_crt),
            ], api),
            "extraVolumes": [
                {"name": "audit-log", "hostPath": AUDIT_LOG_DIR, "mountPath": AUDIT_LOG_DIR,
                 "readOnly": False, "pathType": "DirectoryOrCreate"},
                {"name": "audit", "hostPath": policy, "mountPath": policy, "readOnly": True, "pathType": "File"},
            ],
        },
        "controllerManager": {"extraArgs": _extra_args([
            ("flex-volume-plugin-dir", FLEX_VOLUME_PLUGIN_DIR),
            ("cloud-provider", params.cloud_provider),
            ("configure-cloud-routes", "false"),
            ("profiling", "false"),
            ("terminated-pod-gc-threshold", "1000"),
        ] + _node_cidr_args(params), api)},
        "scheduler": {"extraArgs": _extra_args([("profiling", "false")], api)},
    }
    if params.version_tuple >= KUBELET_LOCAL_MODE_MIN_VERSION:
        cluster["featureGates"] = {"ControlPlaneKubeletLocalMode": True}

    kubelet = {
        "apiVersion": KUBELET_API_VERSION,
        "kind": "KubeletConfiguration",
        "protectKernelDefaults": True,
        "tlsCipherSuites": list(KUBELET_TLS_CIPHER_SUITES),
        "staticPodPath": os.path.join(k8s_dir, "manifests"),
        "registerWithTaints": [dict(t) for t in REGISTER_WITH_TAINTS],
    }
    kubelet["tlsCertFile"] = params.kubelet_tls_cert_file
    kubelet["tlsPrivateKeyFile"] = params.kubelet_tls_key_file
    return [init, cluster, kubelet]


def render_join(params: JoinParams) -> list:
    """JoinConfiguration (+ KubeletConfiguration carrying only the provider ID) as plain dicts."""
    api = params.api_version
    join = {
        "apiVersion": _kubeadm_api(api),
        "kind": "JoinConfiguration",
        "caCertPath": os.path.join(_pki_dir(params.kubernetes_dir), "ca.crt"),
        "nodeRegistration": {
            "name": params.node_name,
            "criSocket": params.cri_socket,
            # On join the provider ID goes into the KubeletConfiguration document instead (docs/kubeadm.md, "What is rendered").
            "kubeletExtraArgs": _extra_args(_kubelet_extra_args(params, False), api),
        },
        "discovery": {"bootstrapToken": {
            "apiServerEndpoint": params.api_server_endpoint,
            "token": params.token,
            "caCertHashes": [params.ca_cert_hash],
        }},
    }
    if params.patches_dir:
        join["patches"] = {"directory": params.patches_dir}
    if params.control_plane:
        join["controlPlane"] = {"localAPIEndpoint": {"advertiseAddress": params.node_vpn_ip,
                                                     "bindPort": KUBERNETES_PORT}}
        if params.certificate_key:
            join["controlPlane"]["certificateKey"] = params.certificate_key
        else:
            # Constellation ships the control-plane PKI in the join ticket instead of a certificate key.
            join["skipPhases"] = [DOWNLOAD_CERTS_PHASE]
    kubelet = {"apiVersion": KUBELET_API_VERSION, "kind": "KubeletConfiguration"}
    if params.provider_id:
        kubelet["providerID"] = params.provider_id
    return [join, kubelet]


def render_token_config(token: str, ttl: str, description: str, usages: Sequence[str], groups: Sequence[str],
                        api_version: str = DEFAULT_API_VERSION) -> list:
    """The InitConfiguration ``kubeadm token create --config`` reads (keeps the token off the command line)."""
    return [{
        "apiVersion": _kubeadm_api(api_version),
        "kind": "InitConfiguration",
        "bootstrapTokens": [{"token": token, "description": description, "ttl": ttl,
                             "usages": list(usages), "groups": list(groups)}],
    }]


def dump_documents(docs: Sequence[Mapping]) -> str:
    """Multi-document YAML separated by ``---``."""
    return yaml.safe_dump_all(list(docs), sort_keys=False, default_flow_style=False, explicit_start=True)


def redact(docs: Sequence[Mapping]) -> list:
    """A copy with every bootstrap token and certificate key replaced by ``<redacted>``."""
    out = copy.deepcopy(list(docs))
    for doc in out:
        for tok in doc.get("bootstrapTokens") or []:
            tok["token"] = REDACTED
        if "certificateKey" in doc:
            doc["certificateKey"] = REDACTED
        bootstrap = (doc.get("discovery") or {}).get("bootstrapToken")
        if bootstrap and "token" in bootstrap:
            bootstrap["token"] = REDACTED
        control_plane = doc.get("controlPlane")
        if control_plane and "certificateKey" in control_plane:
            control_plane["certificateKey"] = REDACTED
    return out
