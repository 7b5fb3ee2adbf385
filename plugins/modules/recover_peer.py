#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: recover_peer
short_description: Send the KMS URI to a rebooted peer (Recover) over aTLS
version_added: "0.1.0"
description:
  - Attests the peer; if its PCR 15 was reset (a reboot) and it waits for recovery, sends C(Recover) with the KMS URI.
    The peer checks the URI derives its stored cluster ID and takes the node lock again.
  - A peer of this cluster (PCR 15 holds the cluster ID derived from O(kms_uri) and O(measurement_salt)) or a
    never-activated peer is left alone.
author:
  - constellation.cluster contributors (@constellation-cluster)
requirements:
  - The Python package cryptography on the controller (attested TLS and the signatures it checks)
extends_documentation_fragment:
  - constellation.cluster.attestation
options:
  endpoint:
    description: The peer's public endpoint.
    type: str
    required: true
  kms_uri:
    description: SECRET. The cluster's KMS URI.
    type: str
    required: true
  measurement_salt:
    description: SECRET. The cluster's measurement salt (standard base64), to derive the cluster ID.
    type: str
    required: true
attributes:
  check_mode:
    support: full
    description: Attests and reports whether it would recover.
  diff_mode:
    support: none
    description: No file changes.
  idempotent:
    support: full
    description: A recovered peer is left alone.
"""

EXAMPLES = r"""
- name: Recover a rebooted node
  constellation.cluster.recover_peer:
    endpoint: 192.0.2.11:9000
    kms_uri: "{{ lookup('ansible.builtin.file', 'constellation-mastersecret.json') | constellation.cluster.kms_uri }}"
    measurement_salt: "{{ (lookup('ansible.builtin.file', 'constellation-measurement-salt.json') | from_json).measurementSalt }}"
    measurements_file: measurements.json
    ek_ca_path: ek_ca.pem
  no_log: true
"""

RETURN = r"""
state_before:
  description: The peer's state before.
  returned: success
  type: str
state:
  description: The peer's state after.
  returned: success
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import attested_options
from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import RECOVER_PEER_ARGS, stub_main


def main():
    stub_main(AnsibleModule, "recover_peer", **attested_options(RECOVER_PEER_ARGS))


if __name__ == "__main__":
    main()
