# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Options shared by the kubeadm_* modules (argument specs in module_utils/kubeadm/validate.py)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):

    DOCUMENTATION = r"""
options:
  kubeadm_path:
    description:
      - Path of the C(kubeadm) executable.
      - When not set, C(kubeadm) is looked up on E(PATH); the module fails with a clear message when there is none.
    type: path
  kubernetes_dir:
    description:
      - The directory kubeadm writes to (C(admin.conf), C(kubelet.conf), C(pki/)).
      - The module pins it in the configuration it renders (C(certificatesDir), C(caCertPath)) and checks it to
        decide whether anything must change. A real kubeadm keeps its kubeconfig files in C(/etc/kubernetes), so
        leave the default on real hosts; other values serve test roots.
    type: path
    default: /etc/kubernetes
  api_version:
    description:
      - The C(kubeadm.k8s.io) configuration version to render.
      - V(v1beta4) (kubeadm v1.31 and later) writes C(extraArgs) as a list of C(name)/C(value) pairs;
        V(v1beta3) writes them as a map.
    type: str
    choices: [v1beta4, v1beta3]
    default: v1beta4
requirements:
  - kubeadm on the managed host
  - PyYAML
  - cryptography
notes:
  - Secrets (bootstrap tokens, certificate keys) are passed to kubeadm in a private C(0600) configuration file,
    never on its command line, and every configuration the module returns is redacted.
"""

    NODE = r"""
options:
  node_name:
    description:
      - The Kubernetes node name; an RFC 1123 subdomain (lower-case letters, digits, C(-) and C(.)).
    type: str
    required: true
  node_vpn_ip:
    description:
      - The node's VPN IP. It becomes the kubelet's C(node-ip) and, on control planes, the API server's
        advertise address and a certificate SAN.
    type: str
    required: true
  cloud_provider:
    description:
      - Value of the kubelet's (and controller manager's) C(cloud-provider) flag. Empty on QEMU and OpenStack.
    type: str
    default: ""
  provider_id:
    description:
      - The node's provider ID, if the platform has one.
    type: str
  cri_socket:
    description: The container runtime socket.
    type: str
    default: unix:///run/containerd/containerd.sock
  patches_dir:
    description:
      - Directory of kubeadm patches; created when missing. Set to an empty string to render no C(patches).
    type: path
    default: /opt/kubernetes/patches
"""
