#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: kubeadm_join
short_description: Join a node to a Kubernetes cluster with kubeadm, pinning the cluster CA
version_added: "0.1.0"
author: constellation.cluster contributors (@constellation-cluster)
description:
  - Renders a C(JoinConfiguration) (and a C(KubeletConfiguration) carrying the provider ID) and runs
    C(kubeadm join) as a worker or as a further control plane.
  - The cluster CA is always pinned with O(ca_cert_hash). There is no option to skip CA verification.
  - With O(coordinator_vpn_endpoint) the join arguments come from the Coordinator inside the chain of trust, as
    Constellation's JoinClient gets them. The node asks the Coordinator's vpnapi (C(GetJoinArgs)) through its
    WireGuard tunnel for a fresh bootstrap token, the pinned CA hash and the API server endpoint, sends the CSR
    of a new kubelet key and gets the kubelet serving certificate signed with the cluster CA (written to
    C(<kubernetes_dir>/pki/kubelet-serving.{crt,key})); a control plane gets the cluster PKI files and skips the
    download-certs phase. No secret passes through the controller.
  - Does nothing when C(<kubernetes_dir>/kubelet.conf) exists (the node already joined).
  - A control plane joins either with O(certificate_key) (it downloads the certificates uploaded by
    M(constellation.cluster.kubeadm_init)) or, as Constellation does, with the cluster PKI already placed under
    C(<kubernetes_dir>/pki); the module checks for those files and then skips the download-certs phase.
extends_documentation_fragment:
  - constellation.cluster.kubeadm
  - constellation.cluster.kubeadm.node
options:
  coordinator_vpn_endpoint:
    description:
      - C(host:port) of the Coordinator's vpnapi inside the VPN (C(<coordinator VPN IP>:9027)). The join
        arguments and the kubelet certificate come from there; mutually exclusive with O(token) and O(ca_cert_hash).
      - Nothing is asked when the node already joined, nor in check mode (each answer creates a bootstrap token).
    type: str
  vpn_priv_key_file:
    description:
      - With O(coordinator_vpn_endpoint), the node agent's WireGuard private key file (C(<agent state_dir>/<vpn_interface>.key),
        readable by root only). The Coordinator's vpnapi answers only a connection that proves the node's WireGuard
        key (C(PeerAuth)); an address inside the VPN is not enough, any process on the node has it.
      - Unset, the key is read from the node's interface O(vpn_interface) (C(wg show <interface> private-key), as root).
      - Read only when the Coordinator is asked (not when the node already joined, nor in check mode).
    type: path
    version_added: "0.3.0"
  vpn_interface:
    description: The node's WireGuard interface, whose private key proves the node to the Coordinator (without O(vpn_priv_key_file)).
    type: str
    default: wg0
    version_added: "0.3.0"
  api_server_endpoint:
    description:
      - C(host:port) of the cluster's API server. Required with O(token); with O(coordinator_vpn_endpoint) it
        overrides the Coordinator's (a load balancer, as Constellation's node does).
    type: str
  token:
    description: The bootstrap token, C([a-z0-9]{6}.[a-z0-9]{16}). Required unless O(coordinator_vpn_endpoint).
    type: str
  ca_cert_hash:
    description:
      - The pinned discovery hash of the cluster CA, C(sha256:<64 hex digits>), as returned by
        M(constellation.cluster.kubeadm_init) or computed with the P(constellation.cluster.ca_cert_hash#filter) filter.
      - Required with O(token).
    type: str
  control_plane:
    description: Join as a control plane.
    type: bool
    default: false
  certificate_key:
    description: Key that decrypts the uploaded control-plane certificates; only with O(control_plane).
    type: str
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: Returns the configuration it would use, with secrets redacted; runs nothing.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
  idempotent:
    description: When run twice in a row outside check mode, with the same arguments, the second invocation indicates no change.
    support: full
    details: A node with a kubelet kubeconfig is left untouched.
"""

EXAMPLES = r"""
- name: Join a worker with what the Coordinator hands out over the VPN (as Constellation's JoinClient)
  constellation.cluster.kubeadm_join:
    coordinator_vpn_endpoint: 10.118.0.1:9027
    node_name: worker-0
    node_vpn_ip: 10.118.0.11

# cluster_init: registered by constellation.cluster.kubeadm_init (return_secrets) on the first control plane
- name: Join a worker
  constellation.cluster.kubeadm_join:
    api_server_endpoint: 10.118.0.1:6443
    token: "{{ hostvars[groups['coordinators'][0]].cluster_init.token }}"
    ca_cert_hash: "{{ hostvars[groups['coordinators'][0]].cluster_init.ca_cert_hash }}"
    node_name: worker-0
    node_vpn_ip: 10.118.0.11

- name: Join a second control plane with uploaded certificates
  constellation.cluster.kubeadm_join:
    api_server_endpoint: 10.118.0.1:6443
    token: "{{ hostvars[groups['coordinators'][0]].cluster_init.token }}"
    ca_cert_hash: "{{ hostvars[groups['coordinators'][0]].cluster_init.ca_cert_hash }}"
    node_name: control-plane-1
    node_vpn_ip: 10.118.0.2
    control_plane: true
    certificate_key: "{{ hostvars[groups['coordinators'][0]].cluster_init.certificate_key }}"
"""

RETURN = r"""
joined:
  description: Whether the node belongs to a cluster after this run (false only in check mode).
  returned: always
  type: bool
kubelet_kubeconfig_file:
  description: The kubelet's kubeconfig.
  returned: always
  type: str
  sample: /etc/kubernetes/kubelet.conf
kubelet_kubeconfig_path:
  description: The same as RV(kubelet_kubeconfig_file); deprecated (its old name), will be removed in 2.0.0.
  returned: always
  type: str
  sample: /etc/kubernetes/kubelet.conf
config:
  description: The kubeadm configuration documents used (or that would be used), secrets redacted.
  returned: when kubeadm join ran or would run (with O(token))
  type: list
  elements: dict
kubelet_cert_file:
  description: The kubelet serving certificate the Coordinator signed for this node.
  returned: with O(coordinator_vpn_endpoint)
  type: str
  sample: /etc/kubernetes/pki/kubelet-serving.crt
kubelet_cert_path:
  description: The same as RV(kubelet_cert_file); deprecated (its old name), will be removed in 2.0.0.
  returned: with O(coordinator_vpn_endpoint)
  type: str
  sample: /etc/kubernetes/pki/kubelet-serving.crt
"""

import os

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.constellation.cluster.plugins.module_utils.command import CommandRunner
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm import (
    HAS_CRYPTOGRAPHY,
    HAS_YAML,
    JoinParams,
    Kubeadm,
    common_argument_spec,
    is_joined,
    join_node,
    node_argument_spec,
)
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.join_client import join_paths, join_via_coordinator
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient


def main():
    argument_spec = common_argument_spec()
    argument_spec.update(node_argument_spec())
    argument_spec.update(
        coordinator_vpn_endpoint=dict(type="str"),
        vpn_priv_key_file=dict(type="path"),
        vpn_interface=dict(type="str", default="wg0"),
        api_server_endpoint=dict(type="str"),
        token=dict(type="str", no_log=True),
        ca_cert_hash=dict(type="str"),
        control_plane=dict(type="bool", default=False),
        certificate_key=dict(type="str", no_log=True),
    )
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True,
                           mutually_exclusive=[("coordinator_vpn_endpoint", "token"),
                                               ("coordinator_vpn_endpoint", "ca_cert_hash"),
                                               ("coordinator_vpn_endpoint", "certificate_key")],
                           required_one_of=[("coordinator_vpn_endpoint", "token")],
                           required_by={"token": ("api_server_endpoint", "ca_cert_hash")})
    if not HAS_YAML:
        module.fail_json(msg=missing_required_lib("PyYAML"))
    if not HAS_CRYPTOGRAPHY:
        module.fail_json(msg=missing_required_lib("cryptography"))
    p = module.params
    if p["coordinator_vpn_endpoint"]:
        _join_via_coordinator(module)
    try:
        params = JoinParams(
            api_server_endpoint=p["api_server_endpoint"], token=p["token"], ca_cert_hash=p["ca_cert_hash"],
            node_name=p["node_name"], node_vpn_ip=p["node_vpn_ip"], control_plane=p["control_plane"],
            certificate_key=p["certificate_key"], cloud_provider=p["cloud_provider"], provider_id=p["provider_id"],
            cri_socket=p["cri_socket"], patches_dir=p["patches_dir"] or None, api_version=p["api_version"],
            kubernetes_dir=p["kubernetes_dir"],
        )
        result = join_node(Kubeadm(p["kubeadm_path"], params.kubernetes_dir), params, check_mode=module.check_mode)
    except ConstellationError as err:
        module.fail_json(msg=str(err))
    out = dict(changed=result.changed, joined=is_joined(params.kubernetes_dir), **_kubeconfig(params.kubernetes_dir))
    if result.config:
        out["config"] = result.config
    module.exit_json(**out)


def _kubeconfig(kubernetes_dir):
    # kubelet_kubeconfig_path: the old name (docs/names.md), returned too until 2.0.0.
    path = os.path.join(kubernetes_dir, "kubelet.conf")
    return {"kubelet_kubeconfig_file": path, "kubelet_kubeconfig_path": path}


def _join_via_coordinator(module):
    p = module.params

    def fetch(csr_pem, is_control_plane):
        vpn_priv_key = _vpn_priv_key(p)
        with AgentClient.connect_plain(p["coordinator_vpn_endpoint"], timeout=60) as client:
            client.peer_auth(vpn_priv_key)  # proof of the node's WireGuard key (docs/protocol.md, PeerAuth)
            return client.get_join_args(certificate_request=csr_pem, is_control_plane=is_control_plane)

    try:
        kubeadm = Kubeadm(p["kubeadm_path"], p["kubernetes_dir"])
        result = join_via_coordinator(
            kubeadm, fetch, p["node_name"], p["node_vpn_ip"], p["kubernetes_dir"], control_plane=p["control_plane"],
            api_server_endpoint=p["api_server_endpoint"] or None, check_mode=module.check_mode,
            cloud_provider=p["cloud_provider"], provider_id=p["provider_id"], cri_socket=p["cri_socket"],
            patches_dir=p["patches_dir"] or None, api_version=p["api_version"])
    except ConstellationError as err:
        module.fail_json(msg=str(err))
    except OSError as err:
        module.fail_json(msg="coordinator_vpn_endpoint %s: %s" % (p["coordinator_vpn_endpoint"], err))
    out = dict(changed=result.changed, joined=is_joined(kubeadm.kubernetes_dir), **_kubeconfig(kubeadm.kubernetes_dir))
    out["kubelet_cert_file"] = out["kubelet_cert_path"] = join_paths(kubeadm.kubernetes_dir)["kubelet_cert_path"]
    module.exit_json(**out)


def _vpn_priv_key(p):
    """The node's WireGuard private key: from ``vpn_priv_key_file``, else from its interface (root only)."""
    if p["vpn_priv_key_file"]:
        try:
            with open(p["vpn_priv_key_file"], encoding="ascii") as handle:
                return handle.read().strip()
        except (OSError, UnicodeDecodeError) as err:
            raise ConstellationError("vpn_priv_key_file %s: cannot read the agent's WireGuard key (%s); the "
                                     "Coordinator's vpnapi answers only its holder"
                                     % (p["vpn_priv_key_file"], getattr(err, "strerror", None) or err)) from None
    result = CommandRunner().run(["wg", "show", p["vpn_interface"], "private-key"], check=False)
    key = result.stdout.strip()
    if result.rc != 0 or not key or key == "(none)":
        raise ConstellationError("vpn_interface %s: cannot read the node's WireGuard private key (wg show: %s); "
                                 "give vpn_priv_key_file" % (p["vpn_interface"], result.stderr.strip()[:200] or "no key"))
    return key


if __name__ == "__main__":
    main()
