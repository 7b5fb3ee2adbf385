#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: activate_nodes
short_description: Have the Coordinator activate the fresh nodes and Coordinators (ActivateAdditionalNodes)
version_added: "0.1.0"
description:
  - Attests every node in O(node_public_endpoints) from the controller and reads its state. Nodes of this cluster
    (PCR 15 holds O(cluster_id)) are left alone; fresh nodes are activated by the Coordinator, which the controller
    asks over an admin-authenticated aTLS connection. The Coordinator attests each node again with its own policy.
  - A node locked to another cluster or in another state fails the task before anything is asked.
  - With O(coordinator_public_endpoints), the same request also names further Coordinators (each runs an etcd
    member, agent config C(etcd_member)); the Coordinator activates them first, one at a time, and then the nodes.
    A further Coordinator that is one of this cluster's already is left alone.
author:
  - constellation.cluster contributors (@constellation-cluster)
requirements:
  - The Python package cryptography on the controller (attested TLS and the signatures it checks)
extends_documentation_fragment:
  - constellation.cluster.attestation
options:
  coordinator_public_endpoint:
    description:
      - The Coordinator agent's public endpoint (host:port).
      - The alias O(coordinator_endpoint) is deprecated and will be removed in 2.0.0.
    type: str
    required: true
    aliases: [coordinator_endpoint]
  node_public_endpoints:
    description:
      - The nodes' public endpoints (host:port).
      - The alias O(node_endpoints) is deprecated and will be removed in 2.0.0.
    type: list
    elements: str
    required: true
    aliases: [node_endpoints]
  coordinator_public_endpoints:
    description:
      - Further Coordinators' public endpoints (host:port), for example every host of the inventory's
        C(coordinators) group but the first. O(coordinator_public_endpoint) itself is ignored in this list.
      - Each is attested from the controller first; a fresh one is activated by the Coordinator (in the chain of
        trust, C(ActivateAsAdditionalCoordinator)); one of this cluster's Coordinators already is left alone; any
        other fails the task before anything is asked.
    type: list
    elements: str
    default: []
    version_added: "0.3.0"
  control_plane_public_endpoints:
    description:
      - Those of O(node_public_endpoints) the admin designates Kubernetes control planes. The Coordinator records
        the designation with each node's WireGuard key at its activation (or resumption); only a designated node
        gets control-plane material (the cluster PKI files, a certificate key) from the Coordinator's vpnapi, and
        a node can never designate itself (the join service refuses C(is_control_plane)).
      - An endpoint not in O(node_public_endpoints) fails the task. Nodes already activated keep what they had
        (the designation is recorded at activation).
    type: list
    elements: str
    default: []
    version_added: "0.3.0"
  node_names:
    description:
      - O(node_public_endpoints) -> the node's name (its inventory name). The Coordinator records it at the node's
        activation (or resumption) as the node's only kubelet node name; a name another node holds refuses that
        node's activation (it stays fresh). Nodes not named keep the first name they are certified in.
    type: dict
    default: {}
    version_added: "0.3.0"
  admin_priv_key_file:
    description:
      - The admin's private key; signs the Coordinator's admin challenge (never sent).
      - It may be an Ansible Vault file (decrypted in memory with the play's vault secrets, never written
        decrypted) or passphrase-protected (the passphrase from the variable C(constellation_admin_key_passphrase),
        kept in Ansible Vault); C(playbooks/secrets.yml) makes it vault-encrypted.
    type: path
    required: true
  cluster_id:
    description: This cluster's ID (standard base64), as M(constellation.cluster.activate_coordinator) returns it.
    type: str
attributes:
  check_mode:
    support: full
    description: Attests and reports which nodes and Coordinators would be activated.
  diff_mode:
    support: none
    description: No file changes.
  idempotent:
    support: full
    description: C(changed) only when some node or Coordinator was activated.
"""

EXAMPLES = r"""
- name: The Coordinator activates the fresh nodes
  constellation.cluster.activate_nodes:
    coordinator_public_endpoint: 192.0.2.10:9000
    node_public_endpoints: [192.0.2.11:9000, 192.0.2.12:9000]
    admin_priv_key_file: ~/.constellation/admin.key
    cluster_id: "{{ activation.cluster_id }}"
    measurements_file: measurements.json
  run_once: true

- name: The Coordinator activates two further Coordinators, then the fresh nodes
  constellation.cluster.activate_nodes:
    coordinator_public_endpoint: 192.0.2.10:9000
    coordinator_public_endpoints: [192.0.2.20:9000, 192.0.2.21:9000]
    node_public_endpoints: [192.0.2.11:9000]
    admin_priv_key_file: ~/.constellation/admin.key
    cluster_id: "{{ activation.cluster_id }}"
    measurements_file: measurements.json
  run_once: true
"""

RETURN = r"""
nodes:
  description:
    - One row per node and further Coordinator (these first), endpoint, role (node, coordinator), state_before,
      action (none, activate; for nodes also resume, readmit), node_vpn_ip.
  returned: success
  type: list
  elements: dict
activated:
  description: The endpoints (nodes and Coordinators) activated by this task.
  returned: success
  type: list
  elements: str
resource_version:
  description: The Coordinator's peer list version after the activation.
  returned: success
  type: int
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import attested_options
from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import ACTIVATE_NODES_ARGS, stub_main


def main():
    stub_main(AnsibleModule, "activate_nodes", **attested_options(ACTIVATE_NODES_ARGS))


if __name__ == "__main__":
    main()
