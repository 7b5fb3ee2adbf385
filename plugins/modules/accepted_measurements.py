#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: accepted_measurements
short_description: Set the accepted measurement sets of a running cluster (rolling image upgrades)
version_added: "0.3.0"
description:
  - Attests the Coordinator from the controller, authenticates with the admin key (C(AdminAuth)) and gives it a
    measurements policy document with its named accepted sets (C(SetMeasurements)), that is the file's exact bytes
    and its detached signature (O(accepted_measurements_file)C(.sig)).
  - The Coordinator checks the signature with its pinned measurements key, refuses a version below the one in force,
    keeps the document in its store and applies it without a restart; every Node fetches it, checks it with its own
    pinned key, seals its storage key ahead to each set and reloads its validators.
  - Dropping a set that a peer still runs (the set it matched at its last re-attestation) is refused, naming the
    peers; RV(peers) says which set each peer runs.
  - The document's C(agents) (name to PCR 13 value, docs/attestation.md) are the agents every peer accepts; a document
    that lists none accepts only the Coordinator's own agent. A document that no longer accepts the agent a peer
    runs (its PCR 13 at its last re-attestation) is refused the same way, naming the peers; RV(agents) says which
    agent each peer runs.
  - Runs on the controller whatever the host (an action plugin).
author:
  - constellation.cluster contributors (@constellation-cluster)
requirements:
  - The Python package cryptography on the controller (attested TLS and the signatures it checks)
extends_documentation_fragment:
  - constellation.cluster.attestation
options:
  endpoint:
    description: The Coordinator's public endpoint, C(host:port).
    type: str
    required: true
  admin_priv_key_file:
    description:
      - The admin's private key (the one pinned at activation).
      - It may be an Ansible Vault file (decrypted in memory with the play's vault secrets, never written
        decrypted) or passphrase-protected (the passphrase from the variable C(constellation_admin_key_passphrase),
        kept in Ansible Vault); C(playbooks/secrets.yml) makes it vault-encrypted.
    type: path
    required: true
  accepted_measurements_file:
    description:
      - 'The policy document to set, JSON or YAML, in the named form C({"version": N, "accepted": {NAME: {PCR: ...}}}),
        optionally with the accepted agents C({"agents": {NAME: {"pcr": 13, "value": HEX, "events": [...]}}}).
        Each new document must raise C(version).'
      - Its detached signature (C(cosign sign-blob)) is read from the same path with C(.sig) appended; where the peers
        pin a measurements key an unsigned document is refused.
      - Without it nothing is set; RV(version), RV(sets) and RV(peers) report what is in force.
    type: path
attributes:
  check_mode:
    support: full
    description: The Coordinator checks the document and predicts whether it changes anything (and a refused
      retirement) without storing anything.
  diff_mode:
    support: full
    description: The accepted set names before and after.
  idempotent:
    support: full
    description: The same document again changes nothing.
"""

EXAMPLES = r"""
- name: Accept the new image's measurements beside the old one's
  constellation.cluster.accepted_measurements:
    endpoint: "{{ constellation_coordinator_public_endpoint }}"
    admin_priv_key_file: "{{ constellation_admin_priv_key_file }}"
    accepted_measurements_file: "{{ inventory_dir }}/measurements-upgrade.json"
    measurements_file: "{{ inventory_dir }}/measurements-upgrade.json"
"""

RETURN = r"""
version:
  description: The document's version (without O(accepted_measurements_file), the one in force).
  returned: success
  type: int
sets:
  description: The accepted set names of the document.
  returned: success
  type: list
  elements: str
added:
  description: The sets the document adds.
  returned: success
  type: list
  elements: str
removed:
  description: The sets the document retires.
  returned: success
  type: list
  elements: str
peers:
  description: By VPN IP, the set each peer matched at its last re-attestation (the Coordinator's own PCRs for itself).
  returned: success
  type: dict
  sample: {"10.118.0.1": "lab-v2", "10.118.0.2": "lab-v1"}
agents:
  description:
    - By VPN IP, the name of the accepted agent whose value the peer's PCR 13 held at its last re-attestation (the
      Coordinator's own agent for itself).
    - V(self) where the document in force lists no C(agents) (each validator then accepts its own agent only);
      "(not accepted)" for a Coordinator whose own agent the document does not list, "(image)" for a peer of the
      measured node image (its PCR 13 matched an image set's zero - its boot chain measures the agent), and "(not
      re-attested since the sets were last set)" for a peer not re-attested since.
  returned: success
  type: dict
  sample: {"10.118.0.1": "0.3.0", "10.118.0.2": "0.2.0"}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import attested_options
from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import ACCEPTED_MEASUREMENTS_ARGS, stub_main


def main():
    stub_main(AnsibleModule, "accepted_measurements", **attested_options(ACCEPTED_MEASUREMENTS_ARGS))


if __name__ == "__main__":
    main()
