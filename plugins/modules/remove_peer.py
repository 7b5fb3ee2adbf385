#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: remove_peer
short_description: Remove a Node from the cluster through its Coordinator (RemovePeer)
version_added: "0.3.0"
description:
  - Attests the Coordinator, proves the admin key and asks it to remove the Node with O(node_public_ip) (or
    O(node_vpn_ip)) - the ADMIN-channel method C(RemovePeer).
  - The Coordinator records the Node as removed (its rejoin is refused, C(add_nodes.yml) refuses it until it was
    reset and rebooted), deletes its Kubernetes Node object where it manages Kubernetes, forgets what the Node held
    (its kubelet node names, its control-plane designation, its disk UUID and that UUID's ownership), then takes
    its entry out of the peer registry and frees its VPN IP (every peer drops it from WireGuard on its next update;
    the next node activated gets the address).
  - Refused, naming the host, for a Coordinator - the last one, or any other. A dead one is taken out with
    M(constellation.cluster.coordinator_member) (C(remove_coordinator.yml)); removing a live further Coordinator is
    not supported.
  - Runs on the controller (an action plugin); the module file only documents it.
author:
  - constellation.cluster contributors (@constellation-cluster)
requirements:
  - The Python package cryptography on the controller (attested TLS and the signatures it checks)
extends_documentation_fragment:
  - constellation.cluster.attestation
  - constellation.cluster.admin_key
options:
  coordinator_public_endpoint:
    description: The activated Coordinator's public endpoint (host:port).
    type: str
    required: true
  node_public_ip:
    description: The Node's public IP, as the Coordinator recorded it. One of O(node_public_ip) and O(node_vpn_ip).
    type: str
  node_vpn_ip:
    description: The Node's VPN IP. One of O(node_public_ip) and O(node_vpn_ip).
    type: str
  cluster_id:
    description: The cluster ID (standard base64); the Coordinator's PCR 15 must hold it.
    type: str
attributes:
  check_mode:
    support: full
    description: The Coordinator reports what it would remove and changes nothing.
  diff_mode:
    support: none
    description: No file changes.
  idempotent:
    support: full
    description: A removed Node is no peer any more; a second run reports nothing to remove.
"""

EXAMPLES = r"""
- name: Remove the Node h4
  constellation.cluster.remove_peer:
    coordinator_public_endpoint: 192.0.2.10:9000
    node_public_ip: 192.0.2.14
    admin_priv_key_file: inventories/prod/admin_key
    measurements_file: measurements.json
    ek_ca_path: inventories/prod/ek_ca.pem
"""

RETURN = r"""
msg:
  description: What was (or would be) removed, or why nothing.
  returned: success
  type: str
peer:
  description: The removed Node's registry entry (vpn_ip, vpn_pub_key, public_ip, role); null when there was none.
  returned: success
  type: dict
kubernetes_node_names:
  description: The Kubernetes node names certified for the Node (their Node objects are deleted).
  returned: success
  type: list
  elements: str
disk_uuid:
  description: The disk UUID recorded for the Node (its ownership is released).
  returned: success
  type: str
control_plane:
  description: Whether the admin had designated the Node a control plane (the designation is dropped).
  returned: success
  type: bool
evicted:
  description: Whether the Node had been evicted (its eviction is forgotten, its reserved VPN IP freed).
  returned: success
  type: bool
resource_version:
  description: The peer set's version after the removal.
  returned: changed and not check mode
  type: int
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import attested_options
from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import REMOVE_PEER_ARGS, stub_main


def main():
    stub_main(AnsibleModule, "remove_peer", **attested_options(REMOVE_PEER_ARGS))


if __name__ == "__main__":
    main()
