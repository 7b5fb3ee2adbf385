#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: coordinator_restore
short_description: Restore the Coordinator's state from a backup onto a fresh, attested peer
version_added: "0.3.0"
description:
  - Opens the backup first, on the controller - its manifest's format, the data file's size and SHA-256, the cluster
    ID against the one derived from O(kms_uri) and O(measurement_salt), the AES-256-GCM decryption with the manifest
    as associated data, the state's fingerprint. A tampered, damaged or foreign backup is refused, naming the file
    and the reason, and nothing is sent.
  - Then attests the peer at O(endpoint) (aTLS); a fresh peer (AcceptingInit, PCR 15 unset, no stored state) gets
    C(ActivateAsCoordinator) with the backup's state (C(restore_state)), the KMS URI and the proof of the init
    secret. It checks all of it, takes the node lock and comes back with the backup's VPN IP, WireGuard key, peer
    registry and KMS settings; the Nodes reconnect by themselves.
  - A Coordinator of this cluster is left alone (C(changed=false)); any other peer is refused, naming its state.
author:
  - constellation.cluster contributors (@constellation-cluster)
requirements:
  - The Python package cryptography on the controller (attested TLS, AES-GCM, the signatures it checks)
extends_documentation_fragment:
  - constellation.cluster.attestation
options:
  endpoint:
    description: The fresh peer's public endpoint.
    type: str
    required: true
  kms_uri:
    description: SECRET. The cluster's KMS URI (C(kms://cluster-kms)).
    type: str
    required: true
  measurement_salt:
    description: SECRET. The cluster's measurement salt (standard base64).
    type: str
    required: true
  admin_priv_key_file:
    description:
      - The admin's private key (PEM); its public key must be the one the backup's Coordinator pinned.
      - It may be an Ansible Vault file (decrypted in memory with the play's vault secrets, never written
        decrypted) or passphrase-protected (the passphrase from the variable C(constellation_admin_key_passphrase),
        kept in Ansible Vault); C(playbooks/secrets.yml) makes it vault-encrypted.
    type: path
    required: true
  init_secret:
    description: SECRET. The cluster's init secret (standard base64), proven to a peer provisioned with an init secret hash.
    type: str
  backup:
    description:
      - The backup the admin names - its manifest file (C(*.manifest.json)), or its name in O(backup_dir) (C(backup-...),
        with or without C(.manifest.json)). A named backup is restored whatever its peer set's version.
    type: path
  backup_dir:
    description:
      - Without O(backup), the newest backup of this cluster in this folder, and only when its peer set is not older than
        the one the Nodes at O(node_endpoints) applied. Its newer backups deleted, the newest left would roll back every
        change of the peers since (an evicted peer would come back); it is refused, naming both versions and the Node,
        and nothing is sent. Name the backup in O(backup) to restore it anyway.
    type: path
  node_endpoints:
    description:
      - The Nodes' public endpoints. Each is attested and asked, after AdminAuth, for the peer set version it applied
        (GetState's details); a Node that does not answer is left out. When Nodes are given and none answers, the newest
        backup is refused (name it in O(backup)). The highest version they answer goes with the restore, and the restored
        peer set continues above it - the Nodes refuse an older set.
    type: list
    elements: str
    default: []
  kubernetes_etcd_snapshot:
    description:
      - Also return the backup's Kubernetes etcd snapshot (verified like the rest) in base64 as
        RV(kubernetes_etcd_snapshot), for M(constellation.cluster.kubernetes_etcd_snapshot) to write onto a control
        plane. It holds every Kubernetes Secret - run the task with C(no_log). A backup without one is refused.
      - Kubernetes' etcd itself is not restored by this module (docs/site.md says how).
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Verifies the backup, attests the peer and reports whether it would be restored; nothing is sent.
  diff_mode:
    support: none
    description: No file changes.
  idempotent:
    support: full
    description: A Coordinator of this cluster is left alone.
"""

EXAMPLES = r"""
- name: Restore the newest backup onto the fresh first Coordinator
  constellation.cluster.coordinator_restore:
    endpoint: 192.0.2.10:9000
    kms_uri: "{{ lookup('ansible.builtin.file', 'constellation-mastersecret.json') | constellation.cluster.kms_uri }}"
    measurement_salt: "{{ (lookup('ansible.builtin.file', 'constellation-measurement-salt.json') | from_json).measurementSalt }}"
    admin_priv_key_file: admin_key
    backup_dir: "{{ inventory_dir }}/backups"
    node_endpoints: [192.0.2.11:9000, 192.0.2.12:9000]
    measurements_file: measurements.json
  no_log: true
"""

RETURN = r"""
kubernetes_etcd_snapshot:
  description: SECRET. The backup's Kubernetes etcd snapshot in base64.
  returned: with O(kubernetes_etcd_snapshot)
  type: str
backup:
  description: The manifest of the backup that was verified (and restored).
  returned: success
  type: str
manifest:
  description: Its manifest (no secret in it).
  returned: success
  type: dict
named:
  description: Whether the backup was named (O(backup)) rather than the newest in O(backup_dir).
  returned: success
  type: bool
peer_resource_version:
  description: The version of the peer set in the backup (from its decrypted state).
  returned: success
  type: int
nodes_peer_resource_version:
  description: Each Node of O(node_endpoints) with the peer set version it applied (null where it did not answer).
  returned: success
  type: dict
state_before:
  description: The peer's state before.
  returned: success
  type: str
state:
  description: The peer's state after.
  returned: success
  type: str
coordinator_vpn_ip:
  description: The restored Coordinator's VPN IP (the backup's).
  returned: when restored
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import attested_options
from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import COORDINATOR_RESTORE_ARGS, stub_main


def main():
    stub_main(AnsibleModule, "coordinator_restore", **attested_options(COORDINATOR_RESTORE_ARGS))


if __name__ == "__main__":
    main()
