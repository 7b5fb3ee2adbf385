#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: verify_attestation
short_description: Attest a host's aTLS endpoint from the controller against a measurements policy
version_added: "0.1.0"
description:
  - Connects from the controller to the host's aTLS endpoint with a fresh 32-byte nonce, verifies the
    attestation document in the server certificate (nonce binding, TPM quote, binding to the certificate's key,
    certificate validity and self-signature) and compares the quoted SHA-256 PCRs with the measurements policy.
  - Sends no application data; the connection is closed right after the check.
  - Fails when the host is refused, naming the reason (for a PCR mismatch, which PCR, what was expected and what was
    found); mismatches of warn-only PCRs are reported as warnings.
  - Runs on the controller (it is an action plugin); the host's connection is not used.
author:
  - constellation.cluster contributors (@constellation-cluster)
requirements:
  - The Python package cryptography on the controller (attested TLS and the signatures it checks)
extends_documentation_fragment:
  - constellation.cluster.attestation
options:
  endpoint:
    description:
      - The host's aTLS endpoint as C(host:port) (C([v6]:port) for IPv6), for example the node agent's public
        endpoint C(192.0.2.10:9000).
    type: str
    required: true
attributes:
  check_mode:
    support: full
    description: Verification changes nothing; it runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing changes, so there is nothing to show.
  idempotent:
    support: full
    description: Always reports C(changed=false).
notes:
  - Every run uses a fresh nonce and the host makes a fresh TPM quote for it; a recorded answer cannot be replayed.
  - The C(qemu-vtpm) variant trusts the attestation key as Constellation does (unconditionally - a software key that
    declares itself a TPM key passes); it needs O(insecure_trust_any_ak=true) and then warns on every run. The
    default C(qemu-vtpm-ek) trusts it only through the TPM's EK certificate chain to O(ek_ca_path).
seealso:
  - module: constellation.cluster.attestation_info
"""

EXAMPLES = r"""
- name: Attest the coordinator before anything is sent to it
  constellation.cluster.verify_attestation:
    endpoint: "{{ hostvars[groups['coordinators'][0]].constellation_public_endpoint }}"
    measurements_file: "{{ inventory_dir }}/measurements.json"
    ek_ca_path: "{{ constellation_ek_ca_path }}"

- name: Attest a node against an inline policy
  constellation.cluster.verify_attestation:
    endpoint: "{{ ansible_host }}:9000"
    measurements:
      "4": {expected: "5198fd549fc9f44a49168b788f58e366af624866647dbe7e917388a0b1673c1d", warnOnly: false}
      "8": "0000000000000000000000000000000000000000000000000000000000000000"
      "14": {expected: "0000000000000000000000000000000000000000000000000000000000000000", warnOnly: true}
    ek_ca_path: "{{ constellation_ek_ca_path }}"
  register: attestation
"""

RETURN = r"""
endpoint:
  description: The endpoint that was attested.
  returned: always
  type: str
  sample: 192.0.2.10:9000
variant:
  description: The attestation variant required.
  returned: always
  type: str
  sample: qemu-vtpm
oid:
  description: The OID of the attestation found in the host's certificate.
  returned: success
  type: str
  sample: 1.3.9900.5.1
pcrs:
  description:
    - One row per PCR of the policy, in ascending order. On failure, the table of the refused attestation when the
      refusal was a PCR mismatch (empty otherwise).
  returned: always
  type: list
  elements: dict
  contains:
    index:
      description: PCR index.
      type: int
    expected:
      description: Expected value (hex).
      type: str
    found:
      description: Quoted value (hex), empty if the quote did not cover it.
      type: str
    warn_only:
      description: Whether a mismatch only warns.
      type: bool
    ok:
      description: Whether the value matched.
      type: bool
  sample: [{"index": 4, "expected": "5198fd54...", "found": "5198fd54...", "warn_only": false, "ok": true}]
measurements:
  description: All verified SHA-256 PCR values of the host, PCR index (as a string) to hex.
  returned: success
  type: dict
  sample: {"4": "5198fd549fc9f44a49168b788f58e366af624866647dbe7e917388a0b1673c1d"}
warnings:
  description: Mismatches of warn-only PCRs.
  returned: when there are any
  type: list
  elements: str
  sample: ["PCR 14: expected 00..., found 11... (warn-only)"]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import attested_options
from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import VERIFY_ATTESTATION_ARGS, stub_main


def main():
    stub_main(AnsibleModule, "verify_attestation", **attested_options(VERIFY_ATTESTATION_ARGS))


if __name__ == "__main__":
    main()
