# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The joining node's kubeadm side of the chain of trust (Constellation's JoinClient; docs/kubeadm.md): it asks its
Coordinator, through the WireGuard tunnel that authenticates it, for what it needs, and joins.

``join_via_coordinator`` does Constellation's join steps on the node: a kubelet key and CSR
(``CN=system:node:<name>``, ``O=system:nodes``, its name and VPN IP) -> the Coordinator's answer (a fresh
token, the pinned CA hash, the API server endpoint, the kubelet certificate; for a control plane the PKI
files) -> the control-plane files under ``pki/`` -> the kubelet serving key and certificate where the
cluster's KubeletConfiguration points -> ``kubeadm join`` (a control plane skips
``control-plane-prepare/download-certs``) -> the kubelet certificate must chain to the CA that kubeadm's
discovery pinned. The secrets never pass through the controller.

The transport is a port: ``fetch(csr_pem, is_control_plane) -> answer`` (the module gives it the vpnapi's
GetJoinArgs). A joined node (``kubelet.conf``) asks nothing and changes nothing; check mode asks nothing
either (each answer creates a bootstrap token)."""

from __future__ import annotations

import base64
import os
from typing import Any, Callable, Dict, Mapping, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import write_if_changed
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.command import Kubeadm
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.config import JoinParams
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.operations import (
    JoinResult,
    is_joined,
    join_node,
)
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.pki import issued_by, kubelet_csr
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.validate import (
    CONTROL_PLANE_PKI_FILES,
    KUBELET_TLS_CERT_FILE,
    KUBELET_TLS_KEY_FILE,
    _validate_path,
    validate_endpoint,
    validate_ip,
    validate_node_name,
)

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
except ImportError:  # pragma: no cover - reported by the modules via HAS_CRYPTOGRAPHY
    pass

Fetch = Callable[[bytes, bool], Mapping[str, Any]]


def _same_key(cert, key_pem: bytes) -> bool:
    key = serialization.load_pem_private_key(key_pem, None)
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    return (key.public_key().public_bytes(serialization.Encoding.DER, spki)
            == cert.public_key().public_bytes(serialization.Encoding.DER, spki))


def _write_control_plane_files(pki: str, files: Any) -> None:
    """The eight files of docs/kubeadm.md "Control-plane PKI files", and nothing else: keys 0600, certificates and sa.pub 0644."""
    if not isinstance(files, list):
        raise StateError("the Coordinator sent no control_plane_files for a control-plane join")
    by_name = {}
    for item in files:
        name = item.get("name") if isinstance(item, Mapping) else None
        if name not in CONTROL_PLANE_PKI_FILES:
            raise StateError("the Coordinator sent an unexpected control-plane file %r" % str(name)[:64])
        by_name[name] = base64.b64decode(item.get("data") or "", validate=True)
    missing = [n for n in CONTROL_PLANE_PKI_FILES if n not in by_name]
    if missing:
        raise StateError("the Coordinator's control_plane_files lack %s" % ", ".join(missing))
    for name, data in by_name.items():
        path = os.path.join(pki, name)
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        write_if_changed(path, data, 0o600 if name.endswith(".key") else 0o644)


def join_via_coordinator(kubeadm: Kubeadm, fetch: Fetch, node_name: str, node_vpn_ip: str,
                         kubernetes_dir: str, control_plane: bool = False, api_server_endpoint: Optional[str] = None,
                         check_mode: bool = False, **join_options: Any) -> JoinResult:
    """Joins this node with what its Coordinator hands out (see the module docstring). ``join_options``:
    the other ``JoinParams`` fields (cloud_provider, provider_id, cri_socket, patches_dir, api_version)."""
    kubernetes_dir = _validate_path(kubernetes_dir, "kubernetes_dir")
    node_name = validate_node_name(node_name)
    node_vpn_ip = validate_ip(node_vpn_ip, "node_vpn_ip")
    if api_server_endpoint:  # checked before anything is asked (an answer makes a token)
        api_server_endpoint = validate_endpoint(api_server_endpoint, "api_server_endpoint")
    if is_joined(kubernetes_dir):
        return JoinResult(changed=False, config=[])
    kubeadm.path  # no kubeadm: fail before anything is asked or written  # noqa: B018
    if check_mode:
        return JoinResult(changed=True, config=[])
    pair = kubelet_csr(node_name, [node_vpn_ip])
    answer = fetch(pair.csr_pem, bool(control_plane))
    for name in ("api_server_endpoint", "token", "discovery_token_ca_cert_hash", "kubelet_cert"):
        if not isinstance(answer.get(name), str) or not answer.get(name):
            raise StateError("the Coordinator's join arguments lack %s" % name)
    try:
        cert = x509.load_pem_x509_certificate(answer["kubelet_cert"].encode("ascii"))
    except (ValueError, UnicodeEncodeError):
        raise StateError("the Coordinator's kubelet_cert is not a PEM certificate") from None
    if not _same_key(cert, pair.key_pem):
        raise StateError("the Coordinator's kubelet_cert is not for this node's key")
    params = JoinParams(api_server_endpoint=api_server_endpoint or answer["api_server_endpoint"], token=answer["token"],
                        ca_cert_hash=answer["discovery_token_ca_cert_hash"], node_name=node_name,
                        node_vpn_ip=node_vpn_ip, control_plane=bool(control_plane), kubernetes_dir=kubernetes_dir,
                        **join_options)
    pki = os.path.join(kubernetes_dir, "pki")
    if control_plane:
        _write_control_plane_files(pki, answer.get("control_plane_files"))
    key_path, cert_path = os.path.join(kubernetes_dir, KUBELET_TLS_KEY_FILE), os.path.join(kubernetes_dir, KUBELET_TLS_CERT_FILE)
    os.makedirs(pki, mode=0o755, exist_ok=True)
    write_if_changed(key_path, pair.key_pem, 0o600)
    write_if_changed(cert_path, answer["kubelet_cert"].encode("ascii"), 0o644)
    result = join_node(kubeadm, params)
    # kubeadm's discovery pinned the CA by its hash: the kubelet certificate must be that CA's.
    with open(os.path.join(pki, "ca.crt"), "rb") as handle:
        ca = x509.load_pem_x509_certificate(handle.read())
    if not issued_by(cert, ca):
        raise StateError("the kubelet certificate from the Coordinator is not signed by the cluster CA kubeadm pinned")
    return result


def join_paths(kubernetes_dir: str) -> Dict[str, str]:
    """Where the kubelet serving key and certificate of a joined node are."""
    if not isinstance(kubernetes_dir, str):
        raise InputError("kubernetes_dir", "an absolute path", kubernetes_dir)
    return {"kubelet_cert_path": os.path.join(kubernetes_dir, KUBELET_TLS_CERT_FILE),
            "kubelet_key_path": os.path.join(kubernetes_dir, KUBELET_TLS_KEY_FILE)}
