#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: agent_measurement
short_description: Compute an agent's PCR 13 and keep it in the signed measurements document
version_added: "0.3.0"
description:
  - Computes the value the node agent extends into PCR 13 (docs/attestation.md, "The agent's PCR") from its code and
    its trust configuration, the way the agent measures itself. The code is O(archive) (the node_agent role's code
    archive), O(src) (a source tree) or, with neither, this collection's own agent code (what the node_agent role
    deploys from this collection).
  - The trust configuration is O(variant) and the EK CA certificates of O(ek_ca_path), as the agent is given them;
    a play's C(module_defaults) for C(group/constellation.cluster.attestation) give both, as to every attesting
    action.
  - With O(name), the document O(measurements_file) lists the agent under that name (O(state=present)) or no
    longer lists it (O(state=absent), a retirement), in its C(agents) mapping. Each change raises the document's
    C(version) by one (a plain policy becomes the named form, its PCRs the set C(default)) and the document is
    re-signed with O(priv_key_file) (its detached signature C(<measurements_file>.sig)). Validators accept on PCR 13
    the value of any agent the document lists.
  - The document and its signature are replaced atomically; on any failure both stay as they were. A signed
    document is checked against the key's public half (or O(measurements_pub_key_file)) before it is changed, and a
    signed document that would change without O(priv_key_file) is refused.
  - Runs on the controller whatever the host (an action plugin); it attests nothing and connects to nothing.
author:
  - constellation.cluster contributors (@constellation-cluster)
requirements:
  - The Python package cryptography on the controller
options:
  archive:
    description:
      - The agent's code as the node_agent role builds it, a gzipped tar archive whose members are the C(*.py) files
        of C(plugins/module_utils) with paths relative to that folder. It is read, never unpacked; absolute paths,
        C(..), links, devices and folders are refused. Relative to the playbook's folder.
      - Mutually exclusive with O(src).
    type: path
  src:
    description:
      - The agent's code as a source tree, a collection's root (holding C(plugins/module_utils)) or a
        C(module_utils) folder. Relative to the playbook's folder.
      - Without O(archive) and O(src), this collection's own agent code.
    type: path
  name:
    description:
      - The agent's name in the document (1-64 characters C([A-Za-z0-9._+-]), starting with a letter or digit),
        usually the collection's version. Without it the value is only computed and no document is read.
    type: str
  state:
    description: V(present) lists the agent with its computed entry; V(absent) retires it.
    type: str
    choices: [present, absent]
    default: present
  priv_key_file:
    description:
      - The ECDSA P-256 private key (PEM, PKCS#8 or SEC1) that signs the changed document, as for
        M(constellation.cluster.measurements_signature). Required when the document is signed and changes.
    type: path
  priv_key_passphrase:
    description: The passphrase of an encrypted PEM private key.
    type: str
  measurements_file:
    description:
      - The measurements document (JSON or YAML) to keep the agent in, with O(name); written back as JSON.
        Relative to the playbook's folder.
      - The old name C(measurements_path) is deprecated and will be removed in 2.0.0.
    type: path
    aliases: [measurements_path]
  measurements_pub_key_file:
    description:
      - The pinned public key (PEM) the document must be signed with; O(priv_key_file) must be its private half.
      - The old name C(measurements_public_key_path) is deprecated and will be removed in 2.0.0.
    type: path
    aliases: [measurements_public_key_path]
  measurements:
    description: Inline measurements cannot be kept; given with O(name), the task fails. Accepted for the action group.
    type: dict
  variant:
    description: The attestation variant the agent is configured with (part of its measured trust configuration).
    type: str
    choices: [qemu-vtpm, qemu-vtpm-ek, sev-snp, azure-sev-snp, aws-sev-snp, dummy]
    default: qemu-vtpm-ek
  insecure_trust_any_ak:
    description: The acknowledgement the variant V(qemu-vtpm) needs (as for the attesting actions).
    type: bool
    default: false
  ek_ca_path:
    description:
      - The EK CA certificate file(s) or folder (PEM) the agent is given (its role variable C(node_agent_ek_ca));
        required for V(qemu-vtpm-ek). Relative to the playbook's folder.
    type: path
  amd_roots:
    description:
      - Unused; accepted for the action group. V(sev-snp) quotes no PCRs, so its agent has no PCR 13 value (the
        launch measurement covers it), so the task is skipped.
    type: path
    version_added: "0.4.0"
  netns:
    description: Unused (nothing is connected to); accepted for the action group.
    type: str
  timeout:
    description: Unused; accepted for the action group.
    type: float
    default: 10
  attestation_timeout:
    description: Unused; accepted for the action group.
    type: float
    default: 30
attributes:
  check_mode:
    support: full
    description: Computes the value and reports whether the document would change; writes nothing.
  diff_mode:
    support: full
    description: The document before and after.
  idempotent:
    support: full
    description: A document that lists the agent as asked is not written again.
notes:
  - Part of the action group C(constellation.cluster.attestation), so the play's attestation defaults give the
    trust configuration and the document the validators use.
"""

EXAMPLES = r"""
- name: The PCR 13 value of this collection's agent with the inventory's trust configuration
  constellation.cluster.agent_measurement:
    variant: qemu-vtpm-ek
    ek_ca_path: "{{ inventory_dir }}/ek_ca.pem"
  delegate_to: localhost
  register: agent

- name: List a new release's agent (its code archive) in the signed measurements document
  constellation.cluster.agent_measurement:
    archive: "{{ playbook_dir }}/constellation-agent-0.3.0.tar.gz"
    variant: qemu-vtpm-ek
    ek_ca_path: "{{ inventory_dir }}/ek_ca.pem"
    measurements_file: "{{ inventory_dir }}/measurements.json"
    name: "0.3.0"
    priv_key_file: "{{ lookup('ansible.builtin.env', 'HOME') }}/keys/measurements.key"
  delegate_to: localhost

- name: Retire the agent of a finished upgrade
  constellation.cluster.agent_measurement:
    ek_ca_path: "{{ inventory_dir }}/ek_ca.pem"
    measurements_file: "{{ inventory_dir }}/measurements.json"
    name: "0.2.0"
    state: absent
    priv_key_file: "{{ lookup('ansible.builtin.env', 'HOME') }}/keys/measurements.key"
  delegate_to: localhost
"""

RETURN = r"""
value:
  description: The agent's PCR 13 value (hex), what validators expect of it.
  returned: success
  type: str
events:
  description: The two events that replay to RV(value), each C({event, digest}) (C(agent_code), C(agent_config)).
  returned: success
  type: list
  elements: dict
code_digest:
  description: SHA-256 (hex) of the agent's code listing (the C(agent_code) event).
  returned: success
  type: str
config_digest:
  description: SHA-256 (hex) of the agent's measured trust configuration (the C(agent_config) event).
  returned: success
  type: str
archive_sha256:
  description: SHA-256 (hex) of the O(archive) file.
  returned: when O(archive) is given
  type: str
entry:
  description:
    - The agent's entry, C({pcr, value, events}) as the document lists it. With O(state=absent), the entry retired
      (null when the document did not list it).
  returned: success
  type: dict
version:
  description: The document's version after the task.
  returned: with O(name)
  type: int
measurements_file:
  description: The document's path.
  returned: with O(name)
  type: str
signature_file:
  description: Its detached signature's path; null for an unsigned document.
  returned: with O(name)
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import attested_options
from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import AGENT_MEASUREMENT_ARGS, stub_main


def main():
    stub_main(AnsibleModule, "agent_measurement", **attested_options(AGENT_MEASUREMENT_ARGS))


if __name__ == "__main__":
    main()
