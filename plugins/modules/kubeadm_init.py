#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: kubeadm_init
short_description: Initialise a Kubernetes control plane with kubeadm, hardened as Constellation does
version_added: "0.1.0"
author: constellation.cluster contributors (@constellation-cluster)
description:
  - Renders C(InitConfiguration), C(ClusterConfiguration) and C(KubeletConfiguration) with Constellation's
    hardening (audit policy and audit log flags, profiling off, kubelet serving certificates verified against the
    cluster CA, restricted kubelet cipher suites, the VPN IP as node IP and certificate SAN).
  - Initialises as Constellation's bootstrapper does, step by step, and reports each step in RV(phases) -
    the audit policy, written where the API server's C(audit-policy-file) points;
    C(kubeadm init phase preflight); C(kubeadm init phase certs all); the kubelet's serving certificate
    (ECDSA P-256 key, C(system:node:<node_name>) in C(system:nodes), the node name and O(node_vpn_ip) as SANs),
    signed locally with the new cluster CA and written where the C(KubeletConfiguration) C(tlsCertFile) and
    C(tlsPrivateKeyFile) point; an emptied C(manifests) directory;
    C(kubeadm init --skip-phases=preflight,certs,addon/coredns,addon/kube-proxy) (C(addon/kube-proxy) only
    without O(kube_proxy)); and C(kubeadm kubeconfig user --client-name <cluster_name>-admin --org system:masters),
    the admin kubeconfig, kept with mode 0600 as C(<kubernetes_dir>/<cluster_name>-admin.conf).
  - Does nothing when the control plane is already initialised, that is when C(<kubernetes_dir>/admin.conf) and
    C(<kubernetes_dir>/pki/ca.crt) exist, except making the admin kubeconfig again when it is missing or not
    the cluster's; it then still returns the CA hash (and, with O(return_secrets), the admin kubeconfig). Use
    M(constellation.cluster.kubeadm_token) for fresh join tokens later.
  - Store the admin kubeconfig on the controller with M(constellation.cluster.kubeadm_admin_kubeconfig)
    (Ansible Vault, beside the master secret).
  - Returns the discovery hash of the new cluster CA, which joining nodes pin.
extends_documentation_fragment:
  - constellation.cluster.kubeadm
  - constellation.cluster.kubeadm.node
options:
  kubernetes_version:
    description: The Kubernetes version, C(vMAJOR.MINOR.PATCH).
    type: str
    required: true
  cluster_name:
    description: The cluster name (an RFC 1123 subdomain).
    type: str
    default: constellation
  control_plane_endpoint:
    description:
      - C(host) or C(host:port) under which the API server is reached (a load balancer when there is one).
      - Defaults to O(node_vpn_ip) on port 6443.
    type: str
  service_cidr:
    description: The service network.
    type: str
    default: 10.96.0.0/12
  pod_cidr:
    description: The pod network, when the CNI needs kubeadm to know it.
    type: str
  allocate_node_cidrs:
    description:
      - Whether the controller-manager allocates each node's pod CIDR from O(pod_cidr) (kubeadm turns it on with a
        pod network). V(false) renders C(allocate-node-cidrs) V(false), for a cluster whose node pod CIDRs are
        allocated elsewhere (the Coordinator, with the collection's pod network).
    type: bool
    default: true
    version_added: 0.5.0
  apiserver_cert_sans:
    description: Extra subject alternative names for the API server certificate (IPs or DNS names).
    type: list
    elements: str
    default: []
  skip_phases:
    description:
      - Further kubeadm init phases the final C(kubeadm init) skips (kubeadm's phase names, for example
        V(addon/kube-proxy) or V(show-join-command)); unknown names are refused.
      - C(preflight), C(certs) and C(addon/coredns) are always skipped there (they ran before or are not wanted).
    type: list
    elements: str
    default: []
  kube_proxy:
    description:
      - Install the kube-proxy addon. Constellation leaves it out (Cilium replaces it) unless in conformance mode.
    type: bool
    default: false
  kubelet_tls_cert_file:
    description:
      - Where the kubelet's serving certificate, signed with the cluster CA, is written (set together with
        O(kubelet_tls_key_file)).
      - Defaults to C(<kubernetes_dir>/pki/kubelet-serving.crt).
    type: path
  kubelet_tls_key_file:
    description:
      - Where the kubelet's serving key is written (mode 0600; set together with O(kubelet_tls_cert_file)).
      - Defaults to C(<kubernetes_dir>/pki/kubelet-serving.key).
    type: path
  token:
    description:
      - The first bootstrap token, C([a-z0-9]{6}.[a-z0-9]{16}). Generated with a CSPRNG when not given.
    type: str
  token_ttl:
    description: Lifetime of the first bootstrap token (C(15m), C(1h30m), ...).
    type: str
    default: 15m
  upload_certs:
    description:
      - Upload the control-plane certificates encrypted with a certificate key, so further control planes can join
        with O(constellation.cluster.kubeadm_join#module:certificate_key).
    type: bool
    default: false
  certificate_key:
    description:
      - Certificate key for O(upload_certs), 64 hex digits. Generated with a CSPRNG when not given.
    type: str
  return_secrets:
    description:
      - Return the admin kubeconfig (C(<cluster_name>-admin)), the bootstrap token and the certificate key.
      - They are secrets. Set C(no_log) on the task when this is V(true).
    type: bool
    default: false
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
    details: A host that is already a control plane is left untouched.
"""

EXAMPLES = r"""
- name: Initialise the first control plane
  constellation.cluster.kubeadm_init:
    kubernetes_version: v1.31.1
    node_name: "{{ inventory_hostname }}"
    node_vpn_ip: 10.118.0.1
    upload_certs: true
    return_secrets: true
  register: cluster_init
  no_log: true

- name: Join a worker with the pinned CA
  constellation.cluster.kubeadm_join:
    api_server_endpoint: 10.118.0.1:6443
    token: "{{ hostvars[groups['coordinators'][0]].cluster_init.token }}"
    ca_cert_hash: "{{ hostvars[groups['coordinators'][0]].cluster_init.ca_cert_hash }}"
    node_name: "{{ inventory_hostname }}"
    node_vpn_ip: "{{ wireguard_vpn_ip }}"
"""

RETURN = r"""
ca_cert_hash:
  description: Discovery hash of the cluster CA, C(sha256:) + hex SHA-256 of its SubjectPublicKeyInfo.
  returned: success, unless in check mode on a new host
  type: str
  sample: sha256:0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9
kubeconfig_file:
  description: The admin kubeconfig kubeadm wrote.
  returned: always
  type: str
  sample: /etc/kubernetes/admin.conf
kubeconfig_path:
  description: The same as RV(kubeconfig_file); deprecated (its old name), will be removed in 2.0.0.
  returned: always
  type: str
  sample: /etc/kubernetes/admin.conf
admin_kubeconfig_file:
  description: The kubeconfig of C(<cluster_name>-admin) in C(system:masters) on the node (mode 0600).
  returned: always
  type: str
  sample: /etc/kubernetes/constellation-admin.conf
admin_kubeconfig_path:
  description: The same as RV(admin_kubeconfig_file); deprecated (its old name), will be removed in 2.0.0.
  returned: always
  type: str
  sample: /etc/kubernetes/constellation-admin.conf
phases:
  description:
    - Each step of the init in order, with C(status) V(ran), V(done before) or V(would run) (check mode), and the
      kubeadm C(command) it runs (without C(-v) and C(--config)), or null for a step done without kubeadm.
  returned: always
  type: list
  elements: dict
  sample:
    - {name: preflight, status: ran, command: kubeadm init phase preflight}
    - {name: kubelet-serving-cert, status: ran, command: null}
token_id:
  description: Public ID of the bootstrap token created by this run.
  returned: when a control plane was initialised
  type: str
  sample: abcdef
initialised:
  description: Whether the host is a control plane after this run (false only in check mode).
  returned: always
  type: bool
config:
  description: The kubeadm configuration documents used (or, in check mode, that would be used), secrets redacted.
  returned: when kubeadm init ran or would run
  type: list
  elements: dict
kubeconfig:
  description: The admin kubeconfig, user C(<cluster_name>-admin) in C(system:masters) (a secret).
  returned: with O(return_secrets), unless in check mode on a new host
  type: str
token:
  description: The bootstrap token created by this run (a secret).
  returned: with O(return_secrets), when a control plane was initialised
  type: str
certificate_key:
  description: The certificate key of the uploaded control-plane certificates (a secret).
  returned: with O(return_secrets) and O(upload_certs), when a control plane was initialised
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm import (
    HAS_CRYPTOGRAPHY,
    HAS_YAML,
    InitParams,
    Kubeadm,
    common_argument_spec,
    init_control_plane,
    is_initialised,
    node_argument_spec,
)


def main():
    argument_spec = common_argument_spec()
    argument_spec.update(node_argument_spec())
    argument_spec.update(
        kubernetes_version=dict(type="str", required=True),
        cluster_name=dict(type="str", default="constellation"),
        control_plane_endpoint=dict(type="str"),
        service_cidr=dict(type="str", default="10.96.0.0/12"),
        pod_cidr=dict(type="str"),
        allocate_node_cidrs=dict(type="bool", default=True),
        apiserver_cert_sans=dict(type="list", elements="str", default=[]),
        skip_phases=dict(type="list", elements="str", default=[]),
        kube_proxy=dict(type="bool", default=False),
        kubelet_tls_cert_file=dict(type="path"),
        kubelet_tls_key_file=dict(type="path"),
        token=dict(type="str", no_log=True),
        token_ttl=dict(type="str", default="15m", no_log=False),
        upload_certs=dict(type="bool", default=False),
        certificate_key=dict(type="str", no_log=True),
        return_secrets=dict(type="bool", default=False),
    )
    module = AnsibleModule(
        argument_spec=argument_spec,
        supports_check_mode=True,
        required_together=[("kubelet_tls_cert_file", "kubelet_tls_key_file")],
    )
    if not HAS_YAML:
        module.fail_json(msg=missing_required_lib("PyYAML"))
    if not HAS_CRYPTOGRAPHY:
        module.fail_json(msg=missing_required_lib("cryptography"))
    p = module.params
    try:
        params = InitParams(
            kubernetes_version=p["kubernetes_version"], node_name=p["node_name"], node_vpn_ip=p["node_vpn_ip"],
            cluster_name=p["cluster_name"], control_plane_endpoint=p["control_plane_endpoint"],
            service_cidr=p["service_cidr"], pod_cidr=p["pod_cidr"],
            allocate_node_cidrs=p["allocate_node_cidrs"], apiserver_cert_sans=p["apiserver_cert_sans"],
            cloud_provider=p["cloud_provider"], provider_id=p["provider_id"], cri_socket=p["cri_socket"],
            patches_dir=p["patches_dir"] or None, kubelet_tls_cert_file=p["kubelet_tls_cert_file"],
            kubelet_tls_key_file=p["kubelet_tls_key_file"], skip_phases=p["skip_phases"], kube_proxy=p["kube_proxy"], token=p["token"],
            token_ttl=p["token_ttl"], certificate_key=p["certificate_key"], api_version=p["api_version"],
            kubernetes_dir=p["kubernetes_dir"],
        )
        kubeadm = Kubeadm(p["kubeadm_path"], params.kubernetes_dir)
        result = init_control_plane(kubeadm, params, upload_certs=p["upload_certs"], check_mode=module.check_mode)
    except ConstellationError as err:
        module.fail_json(msg=str(err))

    initialised = is_initialised(params.kubernetes_dir)
    kubeconfig = os.path.join(params.kubernetes_dir, "admin.conf")
    # *_path: the old names of the *_file values (docs/names.md), returned too until 2.0.0.
    out = dict(changed=result.changed, initialised=initialised, kubeconfig_file=kubeconfig, kubeconfig_path=kubeconfig,
               admin_kubeconfig_file=params.admin_kubeconfig_path, admin_kubeconfig_path=params.admin_kubeconfig_path,
               phases=result.phases)
    if result.ca_cert_hash:
        out["ca_cert_hash"] = result.ca_cert_hash
    if result.config:
        out["config"] = result.config
    if result.token and initialised:
        out["token_id"] = result.token.split(".", 1)[0]
    if p["return_secrets"] and initialised:
        if result.kubeconfig is not None:
            out["kubeconfig"] = result.kubeconfig
        if result.token:
            out["token"] = result.token
        if result.certificate_key:
            out["certificate_key"] = result.certificate_key
    module.exit_json(**out)


if __name__ == "__main__":
    main()
