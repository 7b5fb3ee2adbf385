#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: admit_nodes
short_description: Admit nodes to join the cluster, by their TPM's EK (AdmitNodes)
version_added: "0.3.0"
description:
  - Attests the Coordinator, proves the admin key and asks it to admit the O(nodes) to join - the ADMIN-channel
    method C(AdmitNodes). A Coordinator gives a join ticket (C(IssueJoinTicket)) only to a node whose TPM's EK was
    admitted; the admission also names the node (its kubelet node name). See docs/security.md, "Consent to a join".
  - Each node's EK (the SHA-256 of its EK public key) is given (O(nodes[].ek_pub_sha256)), taken from its EK
    certificate (O(nodes[].ek_cert_file)), or read from its TPM as the controller attests the host
    (O(nodes[].endpoint); variant C(qemu-vtpm-ek), where the AK is trusted only through credential activation with
    that EK).
  - An admission is bound to the WireGuard key of the first node that joins with it; RemovePeer deletes it.
  - Runs on the controller (an action plugin); the module file only documents it.
author:
  - constellation.cluster contributors (@constellation-cluster)
requirements:
  - The Python package cryptography on the controller (attested TLS, the signatures it checks, EK certificates)
extends_documentation_fragment:
  - constellation.cluster.attestation
  - constellation.cluster.admin_key
options:
  coordinator_public_endpoint:
    description: The activated Coordinator's public endpoint (host:port).
    type: str
    required: true
  nodes:
    description: The nodes to admit (or, with O(nodes[].state=absent), whose admission to remove).
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description:
          - The node's name (its inventory name); also its only kubelet node name. A lower-case DNS-1123 subdomain.
        type: str
        required: true
      ek_pub_sha256:
        description: The hex SHA-256 of the TPM's EK public key (SubjectPublicKeyInfo DER).
        type: str
      ek_cert_file:
        description: The TPM's EK certificate (PEM or DER), for a host the controller cannot reach yet.
        type: path
      endpoint:
        description: The host's public endpoint (host:port); the controller attests it and reads its EK.
        type: str
      state:
        description: V(present) admits; V(absent) removes the admission (by EK, or by name when none is given).
        type: str
        default: present
        choices: [present, absent]
  cluster_id:
    description: The cluster ID (standard base64); the Coordinator's PCR 15 must hold it.
    type: str
attributes:
  check_mode:
    support: full
    description: The Coordinator predicts what would change and changes nothing.
  diff_mode:
    support: full
    description: The admissions before and after (name, EK, whether a node joined with it).
  idempotent:
    support: full
    description: An admission already there with the same name changes nothing.
"""

EXAMPLES = r"""
- name: Admit the new workers, reading each EK from its TPM
  constellation.cluster.admit_nodes:
    coordinator_public_endpoint: 192.0.2.10:9000
    nodes:
      - name: worker-3
        endpoint: 192.0.2.13:9000
      - name: worker-4
        ek_cert_file: inventories/prod/ek/worker-4.pem
    admin_priv_key_file: inventories/prod/admin_key
    measurements_file: measurements.json
    ek_ca_path: inventories/prod/ek_ca.pem

- name: Withdraw worker-4's admission
  constellation.cluster.admit_nodes:
    coordinator_public_endpoint: 192.0.2.10:9000
    nodes:
      - name: worker-4
        state: absent
    admin_priv_key_file: inventories/prod/admin_key
    measurements_file: measurements.json
    ek_ca_path: inventories/prod/ek_ca.pem
"""

RETURN = r"""
added:
  description: The names admitted now (or that would be, in check mode).
  returned: success
  type: list
  elements: str
removed:
  description: The names whose admission was removed.
  returned: success
  type: list
  elements: str
renamed:
  description: The names given to EKs admitted before under another name (and not joined yet).
  returned: success
  type: list
  elements: str
admissions:
  description: Every admission after the change ({ek_pub_sha256, name, joined}).
  returned: success
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import attested_options
from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import ADMIT_NODES_ARGS, stub_main


def main():
    stub_main(AnsibleModule, "admit_nodes", **attested_options(ADMIT_NODES_ARGS))


if __name__ == "__main__":
    main()
