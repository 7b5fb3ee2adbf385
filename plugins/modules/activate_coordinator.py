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
    description: SECRET. The KMS URI, C(kms://cluster-kms?key=...&salt=...) (filter M(constellation.cluster.kms_uri)).
    type: str
    required: true
  measurement_salt:
    description: SECRET. The cluster's measurement salt, standard base64 of 32 bytes (M(constellation.cluster.measurement_salt)).
    type: str
    required: true
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
- name: Activate the Coordinator
  constellation.cluster.activate_coordinator:
    endpoint: "{{ constellation_public_endpoint }}"
    kms_uri: "{{ lookup('ansible.builtin.file', 'constellation-mastersecret.json') | constellation.cluster.kms_uri }}"
    measurement_salt: "{{ (lookup('ansible.builtin.file', 'constellation-measurement-salt.json') | from_json).measurementSalt }}"
    admin_priv_key_file: "{{ constellation_admin_priv_key_file }}"
    measurements: "{{ constellation_measurements }}"
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
state_before:
  description: The agent's state before this task.
  returned: success
  type: str
state:
  description: The agent's state after this task.
  returned: success
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import attested_options
from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import ACTIVATE_COORDINATOR_ARGS, stub_main


def main():
    stub_main(AnsibleModule, "activate_coordinator", **attested_options(ACTIVATE_COORDINATOR_ARGS))


if __name__ == "__main__":
    main()
