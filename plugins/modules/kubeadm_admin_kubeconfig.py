#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kubeadm_admin_kubeconfig
short_description: Keep the cluster's admin kubeconfig on the controller, optionally vault-encrypted
version_added: "0.2.0"
description:
  - Writes the admin kubeconfig that M(constellation.cluster.kubeadm_init) returns (user C(<cluster_name>-admin) in
    C(system:masters), as Constellation's CLI keeps C(constellation-admin.conf)) to a file on the controller with
    mode 0600, encrypted with Ansible Vault when O(vault=true), the same way
    M(constellation.cluster.master_secret) keeps the master secret.
  - Never overwrites an existing file. An existing file (decrypted with the play's vault secrets if it is
    vault-encrypted) is kept when it is a kubeconfig of the same user and cluster CA; a kubeconfig of another
    cluster makes the task fail, naming the file.
  - Runs on the controller (it is an action plugin), whatever the host. Never returns the kubeconfig; put
    C(no_log) on the task, since its argument is a secret.
author:
  - constellation.cluster contributors (@constellation-cluster)
extends_documentation_fragment:
  - constellation.cluster.controller_secret_file
options:
  content:
    description: The admin kubeconfig (a secret), for example RV(constellation.cluster.kubeadm_init#module:kubeconfig).
    type: str
    required: true
seealso:
  - module: constellation.cluster.kubeadm_init
  - module: constellation.cluster.master_secret
"""

EXAMPLES = r"""
- name: Initialise the control plane
  constellation.cluster.kubeadm_init:
    kubernetes_version: v1.31.1
    node_name: "{{ inventory_hostname }}"
    node_vpn_ip: 10.118.0.1
    return_secrets: true
  register: cluster_init
  no_log: true

- name: Keep the admin kubeconfig beside the master secret, vault-encrypted
  constellation.cluster.kubeadm_admin_kubeconfig:
    path: "{{ inventory_dir }}/constellation-admin.conf"
    content: "{{ cluster_init.kubeconfig }}"
    vault: true
  no_log: true
"""

RETURN = r"""
path:
  description: The absolute path of the file.
  returned: always
  type: str
  sample: /home/admin/cluster/constellation-admin.conf
vault_encrypted:
  description: Whether the file is vault-encrypted.
  returned: always
  type: bool
  sample: true
user:
  description: The kubeconfig's user (not a secret).
  returned: always
  type: str
  sample: constellation-admin
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import KUBEADM_ADMIN_KUBECONFIG_ARGS, stub_main


def main():
    stub_main(AnsibleModule, "kubeadm_admin_kubeconfig", argument_spec=KUBEADM_ADMIN_KUBECONFIG_ARGS)


if __name__ == "__main__":
    main()
