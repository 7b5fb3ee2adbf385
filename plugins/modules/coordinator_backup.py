#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: coordinator_backup
short_description: Back up the Coordinator's state, encrypted on the controller
version_added: "0.3.0"
description:
  - Attests the Coordinator (aTLS), checks that its PCR 15 holds this cluster's ID, proves the admin key
    (C(AdminAuth)) and reads its whole store with the admin channel's C(ExportState) - node state with its
    WireGuard key and VPN IP, KMS settings, init secret, peer registry, disk UUIDs, evictions.
  - Encrypts it on the controller with AES-256-GCM under a key derived from the master secret (HKDF-SHA256 with
    its own info label, docs/kms.md; never the secret itself) and writes it with a manifest (what, when,
    cluster ID, digests, format version) into O(backup_dir), atomically, mode 0600. The manifest is the
    associated data of the AEAD.
  - A backup is a new artifact each time the state changed. When the state has the same keyed fingerprint as the
    newest intact backup of this cluster in O(backup_dir), nothing is written and the task reports C(changed=false).
  - Where Kubernetes is managed (O(kubernetes)), Kubernetes' etcd snapshot taken by
    M(constellation.cluster.kubernetes_etcd_snapshot) on the first control plane (O(kubernetes_etcd_snapshot)) goes
    into the same encrypted data; the manifest's C(contents) lists it with its size, SHA-256 and where it was taken,
    and the state's fingerprint covers its SHA-256. Its integrity (the SHA-256 etcd appends) is checked before
    anything is written. With O(kubernetes) and no snapshot, the manifest says none is included, and a warning too.
author:
  - constellation.cluster contributors (@constellation-cluster)
requirements:
  - The Python package cryptography on the controller (attested TLS, AES-GCM, the signatures it checks)
extends_documentation_fragment:
  - constellation.cluster.attestation
options:
  endpoint:
    description: The Coordinator's public endpoint.
    type: str
    required: true
  kms_uri:
    description: SECRET. The cluster's KMS URI (C(kms://cluster-kms)); the backup key is derived from its master secret.
    type: str
    required: true
  measurement_salt:
    description: SECRET. The cluster's measurement salt (standard base64), to derive the cluster ID.
    type: str
    required: true
  admin_priv_key_file:
    description:
      - The admin's private key (PEM), for C(AdminAuth).
      - It may be an Ansible Vault file (decrypted in memory with the play's vault secrets, never written
        decrypted) or passphrase-protected (the passphrase from the variable C(constellation_admin_key_passphrase),
        kept in Ansible Vault); C(playbooks/secrets.yml) makes it vault-encrypted.
    type: path
    required: true
  backup_dir:
    description: The controller's backup folder (made with mode 0700).
    type: path
    required: true
  kubernetes:
    description: Kubernetes is managed by the inventory; its etcd snapshot (O(kubernetes_etcd_snapshot)) is backed up too.
    type: bool
    default: false
  kubernetes_etcd_snapshot:
    description:
      - SECRET. Kubernetes' etcd snapshot in base64 (the C(snapshot) that M(constellation.cluster.kubernetes_etcd_snapshot) returns),
        with O(kubernetes). It holds every Kubernetes Secret; it is written only encrypted.
    type: str
  kubernetes_etcd_source:
    description:
      - Where the snapshot was taken, for the manifest - C(control_plane), C(endpoint), C(revision), C(etcd_version)
        (other keys are ignored).
    type: dict
attributes:
  check_mode:
    support: full
    description: Attests, reads the state and reports whether a new backup would be written; writes nothing.
  diff_mode:
    support: none
    description: The backup is a new file; no diff.
  idempotent:
    support: full
    description: An unchanged state writes no new backup.
"""

EXAMPLES = r"""
- name: Back up the Coordinator
  constellation.cluster.coordinator_backup:
    endpoint: 192.0.2.10:9000
    kms_uri: "{{ lookup('ansible.builtin.file', 'constellation-mastersecret.json') | constellation.cluster.kms_uri }}"
    measurement_salt: "{{ (lookup('ansible.builtin.file', 'constellation-measurement-salt.json') | from_json).measurementSalt }}"
    admin_priv_key_file: admin_key
    backup_dir: "{{ inventory_dir }}/backups"
    measurements_file: measurements.json
  no_log: true
"""

RETURN = r"""
path:
  description: The manifest of the backup written, or of the newest backup when the state is unchanged (null in check mode).
  returned: success
  type: str
manifest:
  description: The backup's manifest (no secret in it).
  returned: success
  type: dict
cluster_id:
  description: The cluster ID (standard base64).
  returned: success
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import attested_options
from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import COORDINATOR_BACKUP_ARGS, stub_main


def main():
    stub_main(AnsibleModule, "coordinator_backup", **attested_options(COORDINATOR_BACKUP_ARGS))


if __name__ == "__main__":
    main()
