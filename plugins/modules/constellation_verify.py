#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: constellation_verify
short_description: Attest an endpoint of Constellation's verification service against a measurements policy
version_added: "0.3.0"
description:
  - Asks the verification service at O(endpoint) for an attestation over a fresh random 32-byte nonce, as
    C(constellation verify) does, and validates the answer with this collection's validator of O(variant) -
    the TPM quote, its binding to the nonce and to the user data C(VerifyService), and the quoted SHA-256 PCRs
    against the measurements policy.
  - Speaks the service of every node agent of this collection (C(verify_grpc_endpoint),
    C(verify_http_endpoint)) and of a real Constellation node (C(qemu-vtpm) variant), over gRPC
    C(verify.API/GetAttestation) (Constellation's default port 9090, NodePort 30081) or
    HTTP C(GET /?nonce=<URL-safe base64>) (8080, NodePort 30080), both without TLS.
  - The transport is not trusted. A recorded answer replayed for another nonce, an answer issued for other
    user data and a host whose PCRs differ from the policy are refused, naming the reason (for a PCR mismatch,
    which PCR, what was expected and what was found); warn-only mismatches are reported as warnings.
  - Runs where the task runs; to verify from the controller, as Constellation's CLI does, delegate it to
    C(localhost).
author:
  - constellation.cluster contributors (@constellation-cluster)
requirements:
  - The Python packages grpcio and protobuf for O(transport=grpc) (Debian 12 - python3-grpcio python3-protobuf)
  - The Python package cryptography
  - The Python package tpm2-pytss 3.0.0 or later, with the TPM2 TSS libraries (libtss2) it is built against,
    to validate the TPM quotes of the C(qemu-vtpm) variant
options:
  endpoint:
    description:
      - The verification service as C(host:port) (C([v6]:port) for IPv6), for example C(192.0.2.10:9090) for gRPC
        or C(192.0.2.10:8080) for HTTP.
    type: str
    required: true
  transport:
    description: How to ask the service, V(grpc) (C(verify.API/GetAttestation)) or V(http) (C(GET /?nonce=...)).
    type: str
    choices: [grpc, http]
    default: grpc
  measurements:
    description:
      - The measurements policy inline, in Constellation's JSON shape (PCR index to C(expected) hex and
        C(warnOnly)). Mutually exclusive with O(measurements_file). Must name at least one PCR.
    type: dict
  measurements_file:
    description:
      - A JSON or YAML file with the policy, on the host the task runs on.
      - The old name C(measurements_path) is deprecated and will be removed in 2.0.0.
    type: path
    aliases: [measurements_path]
  measurements_pub_key_file:
    description:
      - A pinned ECDSA P-256 public key (PEM, as C(cosign.pub)) that O(measurements_file) must be signed with
        (C(<measurements_file>.sig), the form C(cosign sign-blob --key) prints); an unsigned or altered file is
        refused. When set, inline O(measurements) are refused.
      - The old name C(measurements_public_key_path) is deprecated and will be removed in 2.0.0.
    type: path
    aliases: [measurements_public_key_path]
  variant:
    description:
      - The attestation variant the document must be (the chooser in C(module_utils/attestation/choose.py)).
      - V(qemu-vtpm) trusts any attestation key, as Constellation does (a software key that declares itself a TPM
        key passes); it needs O(insecure_trust_any_ak=true) and then warns. V(dummy) proves nothing and is refused
        outside the test suite.
      - V(qemu-vtpm-ek) (the collection's default) is refused here - it trusts an attestation key only after
        enrollment over the agent's aTLS endpoint, which the verification service does not offer; use
        M(constellation.cluster.verify_attestation), or V(qemu-vtpm) with O(insecure_trust_any_ak).
    type: str
    choices: [qemu-vtpm, qemu-vtpm-ek, sev-snp, azure-sev-snp, aws-sev-snp, dummy]
    default: qemu-vtpm-ek
  insecure_trust_any_ak:
    description: The explicit acknowledgement that V(qemu-vtpm) trusts any attestation key; required for it.
    type: bool
    default: false
  ek_ca_path:
    description: Accepted for the C(attestation) action group's defaults; unused (V(qemu-vtpm-ek) is refused).
    type: path
  amd_roots:
    description:
      - PEM file or folder of AMD's root certificates (ARK, ASK/ASVK) an SEV-SNP report must chain to (V(sev-snp));
        default AMD's own roots, pinned in the collection.
    type: path
    version_added: "0.4.0"
  netns:
    description:
      - B(Lab only.) Run the request in this network namespace (C(/run/netns/NAME)); the module process enters it.
    type: str
  timeout:
    description: Seconds for the connection and the answer.
    type: float
    default: 10
  attestation_timeout:
    description: Seconds the validation of the attestation may take.
    type: float
    default: 30
attributes:
  check_mode:
    support: full
    description: Read-only; it asks and verifies the same in check mode.
  diff_mode:
    support: none
    description: Nothing changes, so there is nothing to show.
  idempotent:
    support: full
    description: Always reports C(changed=false).
notes:
  - Every run uses a fresh nonce and the host makes a fresh TPM quote for it.
  - Member of the action group C(constellation.cluster.attestation), so a play's C(module_defaults) for it apply.
seealso:
  - module: constellation.cluster.verify_attestation
  - module: constellation.cluster.attestation_info
"""

EXAMPLES = r"""
- name: Verify a node through Constellation's verification service, from the controller
  constellation.cluster.constellation_verify:
    endpoint: "{{ ansible_host }}:9090"
    measurements_file: "{{ inventory_dir }}/measurements.json"
    ek_ca_path: "{{ constellation_ek_ca_path }}"
  delegate_to: localhost
  register: verified

- name: The same over HTTP, on a Constellation cluster's NodePort
  constellation.cluster.constellation_verify:
    endpoint: "192.0.2.10:30080"
    transport: http
    measurements:
      "4": {expected: "5198fd549fc9f44a49168b788f58e366af624866647dbe7e917388a0b1673c1d", warnOnly: false}
      "9": {expected: "2dee5d9c597a9098821e73214b9347b8e5e448c09ebd3375143855be72e33058", warnOnly: false}
      "15": {expected: "0000000000000000000000000000000000000000000000000000000000000000", warnOnly: false}
    ek_ca_path: ek_ca.pem
  delegate_to: localhost

- name: Print the per-PCR table
  ansible.builtin.debug:
    msg: "{{ verified.table }}"
"""

RETURN = r"""
endpoint:
  description: The endpoint that was asked.
  returned: always
  type: str
  sample: 192.0.2.10:9090
transport:
  description: The transport used.
  returned: always
  type: str
  sample: grpc
variant:
  description: The attestation variant required.
  returned: always
  type: str
  sample: qemu-vtpm
nonce:
  description: The fresh nonce the attestation was asked for (hex).
  returned: when the service was asked
  type: str
  sample: 0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20
pcrs:
  description:
    - One row per PCR of the policy, in ascending order (the rows of C(playbooks/verify.yml)'s table). On failure,
      the table of the refused attestation when the refusal was a PCR mismatch (empty otherwise).
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
table:
  description: The same rows as text, in the columns of C(playbooks/verify.yml)'s table.
  returned: always
  type: list
  elements: str
  sample: ["endpoint               PCR  expected       found          match verdict", "10.42.0.11:9090 ..."]
measurements:
  description: All verified SHA-256 PCR values of the host, PCR index (as a string) to hex.
  returned: success
  type: dict
  sample: {"4": "5198fd549fc9f44a49168b788f58e366af624866647dbe7e917388a0b1673c1d"}
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils import netns
from ansible_collections.constellation.cluster.plugins.module_utils.agent import verify_service
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.choose import QEMU_VTPM_EK_NAME
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import (
    ATTESTATION_ARGUMENT_SPEC, ATTESTATION_MUTUALLY_EXCLUSIVE, pcr_rows, settings_from_args)
# Ships every variant the chooser may import with this module (AnsiballZ packs what it sees imported).
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import all_variants  # noqa: F401 pylint: disable=unused-import
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    AttestationError, ConstellationError, InputError)

_FMT = "%-22s %-4s %-14s %-14s %-5s %s"


def pcr_table(endpoint, rows, verdict):
    """The rows of playbooks/verify.yml's table (templates/cluster_table.j2) for one endpoint."""
    lines = [_FMT % ("endpoint", "PCR", "expected", "found", "match", "verdict")]
    for row in rows:
        lines.append(_FMT % (endpoint, row["index"], row["expected"][:10] + "..",
                             (row["found"][:10] + "..") if row["found"] else "-",
                             "yes" if row["ok"] else ("warn" if row["warn_only"] else "NO"), verdict))
    return lines


def main():
    module = AnsibleModule(
        argument_spec=dict(
            ATTESTATION_ARGUMENT_SPEC,
            endpoint=dict(type="str", required=True),
            transport=dict(type="str", choices=list(verify_service.TRANSPORTS), default="grpc"),
        ),
        mutually_exclusive=ATTESTATION_MUTUALLY_EXCLUSIVE,
        supports_check_mode=True,
    )
    p = module.params
    result = dict(changed=False, endpoint=p["endpoint"], transport=p["transport"], variant=p["variant"], pcrs=[],
                  table=[])
    try:
        if p["variant"] == QEMU_VTPM_EK_NAME:
            raise InputError("variant", "qemu-vtpm (with insecure_trust_any_ak: true) or dummy: %s trusts an "
                             "attestation key only after enrollment over the agent's aTLS endpoint, which the "
                             "verification service does not offer (use verify_attestation)" % QEMU_VTPM_EK_NAME,
                             p["variant"])
        # Packed by Ansible, this module cannot read the collection's files to compute the agent's PCR 13:
        # the verification service's quote is checked against the policy as given (verify_attestation checks 13).
        settings = settings_from_args(p, agent_pcr=False)
        for warning in settings.warnings:  # qemu-vtpm, acknowledged: said on every run
            module.warn(warning)
        if settings.netns:
            # A process of its own: every socket it (and gRPC's threads) opens is in the lab namespace.
            netns.enter(settings.netns)
        nonce = os.urandom(verify_service.NONCE_SIZE)
        result["nonce"] = nonce.hex()
        document = verify_service.fetch_attestation(p["endpoint"], nonce, p["transport"], settings.timeout)
        validation = verify_service.check_attestation(settings.validators()[0], document, nonce,
                                                      settings.attestation_timeout)
    except AttestationError as err:
        rows = pcr_rows(getattr(err, "checks", []))
        result.update(pcrs=rows, table=pcr_table(p["endpoint"], rows, "FAIL"))
        module.fail_json(msg="attestation of %s refused: %s" % (p["endpoint"], err), **result)
    except ConstellationError as err:
        module.fail_json(msg=str(err), **result)
    except OSError as err:  # netns.enter
        module.fail_json(msg="%s: %s" % (type(err).__name__, err), **result)
    rows = pcr_rows(validation.checks)
    result.update(pcrs=rows, table=pcr_table(p["endpoint"], rows, "ok"),
                  measurements={str(i): v.hex() for i, v in sorted(validation.pcrs.items())})
    for warning in validation.warnings:
        module.warn(warning)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
