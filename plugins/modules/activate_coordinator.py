#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: activate_coordinator
short_description: Activate the Coordinator from the controller over aTLS (idempotent)
version_added: "0.1.0"
description:
  - Attests the peer, asks its state, and sends C(ActivateAsCoordinator) with the KMS URI, the measurement salt, the
    admin's public key and the cluster configuration, unless the peer already is this cluster's Coordinator.
  - Already activated means its attested PCR 15 holds the cluster ID derived on the controller from O(kms_uri)
    and O(measurement_salt); then nothing is sent but an admin-authenticated read of its VPN identity, and
    C(changed=false). A peer locked to another cluster, or in another state, is an error.
author:
  - constellation.cluster contributors (@constellation-cluster)
requirements:
  - The Python package cryptography on the controller (attested TLS and the signatures it checks)
extends_documentation_fragment:
  - constellation.cluster.attestation
options:
  endpoint:
    description: The Coordinator agent's public endpoint, C(host:port).
    type: str
    required: true
  kms_uri:
    description:
      - SECRET. The KMS URI, C(kms://cluster-kms?key=...&salt=...) (filter P(constellation.cluster.kms_uri#filter)).
      - Give O(kms_uri) and O(measurement_salt), or O(master_secret_file) and O(measurement_salt_file).
    type: str
  measurement_salt:
    description: SECRET. The cluster's measurement salt, standard base64 of 32 bytes (M(constellation.cluster.measurement_salt)).
    type: str
  master_secret_file:
    description:
      - The master secret file on the controller (M(constellation.cluster.master_secret)'s, vault-encrypted or not),
        instead of O(kms_uri). A vault-encrypted file is decrypted in memory.
      - Where neither it nor O(measurement_salt_file) exists yet, both are made in memory and written (0600,
        atomically, never overwritten; vault-encrypted with O(vault)) only once the Coordinator accepted the
        activation, so a failed activation writes neither. In check mode nothing is written.
      - Where only one of the two exists the task fails, naming both.
    type: path
    version_added: "0.4.0"
  measurement_salt_file:
    description:
      - The measurement salt file on the controller (M(constellation.cluster.measurement_salt)'s), instead of
        O(measurement_salt); made with O(master_secret_file).
    type: path
    version_added: "0.4.0"
  vault:
    description: Encrypt the secret files this task makes with Ansible Vault (the play's vault secrets).
    type: bool
    default: false
    version_added: "0.4.0"
  vault_id:
    description: The vault ID to encrypt with, when the play has several. Default is the first one.
    type: str
    version_added: "0.4.0"
  storage_uri:
    description: The storage URI; default C(storage://no-store).
    type: str
  admin_pub_key:
    description: The admin's public key (PEM or OpenSSH; Ed25519 or ECDSA P-256). Default derived from O(admin_priv_key_file).
    type: str
  admin_priv_key_file:
    description:
      - The admin's private key, to derive O(admin_pub_key) and to read an activated Coordinator's VPN identity.
      - It may be an Ansible Vault file (decrypted in memory with the play's vault secrets, never written
        decrypted) or passphrase-protected (the passphrase from the variable C(constellation_admin_key_passphrase),
        kept in Ansible Vault); C(playbooks/secrets.yml) makes it vault-encrypted.
    type: path
  cluster_name:
    description: The cluster's name.
    type: str
    default: ''
  vpn_cidr:
    description: The VPN network; must match the agent's.
    type: str
    default: 10.118.0.0/16
  cluster_pod_cidr:
    description:
      - The cluster's pod range. The Coordinator gives every Coordinator and Node a block of it next to its VPN IP,
        carried in the signed peer sets and in every other peer's WireGuard C(AllowedIPs) (docs/wireguard.md).
      - Must not overlap O(vpn_cidr) (nor the Kubernetes service range). An empty string hands out no pod CIDRs
        (bring your own CNI).
      - An activated Coordinator without pod CIDRs (a cluster activated before 0.5.0, or with an empty
        O(cluster_pod_cidr)) is given the range (every Coordinator and Node gets a block in one new peer set
        version; C(changed=true)); this needs O(admin_priv_key_file). Another range than the one in use is refused.
    type: str
    default: 10.244.0.0/16
    version_added: "0.5.0"
  node_pod_cidr_mask_size:
    description:
      - The prefix length of each peer's block of O(cluster_pod_cidr) (kube-controller-manager's
        C(--node-cidr-mask-size)); at most 30.
    type: int
    default: 24
    version_added: "0.5.0"
  init_secret:
    description:
      - SECRET. The cluster's init secret, standard base64 of 32 bytes (the file the lab or the operator made, Vault).
      - Required by a peer provisioned with C(init_secret_hash) (role constellation.cluster.node_agent); the peer
        checks it derives its own init secret before it takes the node lock, and the Coordinator keeps it to prove
        itself to the nodes it activates. Without it such a peer refuses the activation.
    type: str
  vpn_interface:
    description:
      - Not used any more (the agent's GetState reports its VPN IP and WireGuard public key); deprecated, will be
        removed in 2.0.0.
    type: str
attributes:
  check_mode:
    support: full
    description: Attests and reports whether it would activate; sends nothing else.
  diff_mode:
    support: none
    description: No file changes.
  idempotent:
    support: full
    description: A Coordinator of this cluster is left alone (C(changed=false)).
notes:
  - Use C(no_log) on the task; the result holds no secret, the arguments do.
"""

EXAMPLES = r"""
# The master secret and the salt as constellation.cluster.master_secret and measurement_salt made them, beside the
# inventory; the init secret whose hash every agent was provisioned with.
- name: Activate the Coordinator
  constellation.cluster.activate_coordinator:
    endpoint: "{{ constellation_public_endpoint }}"
    kms_uri: >-
      {{ lookup('ansible.builtin.file', inventory_dir ~ '/constellation-mastersecret.json') | constellation.cluster.kms_uri }}
    measurement_salt: >-
      {{ (lookup('ansible.builtin.file', inventory_dir ~ '/constellation-measurement-salt.json') | from_json).measurementSalt }}
    init_secret: "{{ lookup('ansible.builtin.file', constellation_init_secret_file) }}"
    admin_priv_key_file: "{{ constellation_admin_priv_key_file }}"
    measurements_file: "{{ constellation_measurements_file }}"
    ek_ca_path: "{{ constellation_ek_ca_path }}"
  no_log: true
  register: activation
"""

RETURN = r"""
cluster_id:
  description: The cluster ID (standard base64), derived on the controller and confirmed by the Coordinator.
  returned: success
  type: str
coordinator_vpn_ip:
  description: The Coordinator's VPN IP (none in check mode before activation).
  returned: success
  type: str
  sample: 10.118.0.1
coordinator_vpn_pub_key:
  description: The Coordinator's WireGuard public key.
  returned: success
  type: str
cluster_pod_cidr:
  description: The cluster's pod range (none without the pod network, or in check mode before activation).
  returned: success
  type: str
  sample: 10.244.0.0/16
  version_added: "0.5.0"
coordinator_pod_cidr:
  description: The Coordinator's own pod CIDR (none without the pod network, or in check mode before activation).
  returned: success
  sample: 10.244.0.0/24
  version_added: "0.5.0"
  type: str
pod_cidrs_allocated:
  description: The peers an activated Coordinator gave a pod CIDR now (O(cluster_pod_cidr) on a cluster without one).
  returned: when the pod network was turned on for an activated cluster
  type: list
  elements: dict
  sample: [{vpn_ip: 10.118.0.11, pod_cidr: 10.244.1.0/24}]
  version_added: "0.5.0"
state_before:
  description: The agent's state before this task.
  returned: success
  type: str
state:
  description: The agent's state after this task.
  returned: success
  type: str
secret_files_made:
  description:
    - The secret files this task made once the Coordinator accepted the activation (in check mode, would make);
      empty when they existed already.
  returned: with O(master_secret_file)
  type: list
  elements: str
  version_added: "0.4.0"
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import attested_options
from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import ACTIVATE_COORDINATOR_ARGS, stub_main


def main():
    stub_main(AnsibleModule, "activate_coordinator", **attested_options(ACTIVATE_COORDINATOR_ARGS))


if __name__ == "__main__":
    main()
