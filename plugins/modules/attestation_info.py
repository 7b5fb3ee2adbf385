#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: attestation_info
short_description: Read a host's TPM PCRs and produce an attestation document for a nonce
version_added: "0.1.0"
description:
  - Reads the SHA-256 PCR bank (PCRs 0 to 23) of the host's TPM.
  - Given O(nonce), also produces an attestation document for that nonce, in the format of the
    chosen O(variant). For C(qemu-vtpm) that is the JSON document Constellation's verifiers accept, a TPM quote
    over every allocated PCR bank bound to SHA-256(SHA-256(user data || nonce)).
  - To check a host against a measurements policy from the controller, use
    M(constellation.cluster.verify_attestation), which verifies the document instead of just returning it.
  - On an AMD SEV-SNP host (a variant that verifies SEV-SNP reports), given O(nonce), also returns the report
    inside the document, verified to AMD's roots, with its fields and the measurements document's C(snp) object
    that this report passes (RV(snp)), what an operator starts a policy from (docs/attestation.md, "Reading a
    host's report"). Variants that quote no PCRs (C(sev-snp)) do not read the TPM; RV(pcrs) is then empty.
author:
  - constellation.cluster contributors (@constellation-cluster)
options:
  tcti:
    description:
      - The TPM to use, as a TCTI string as tpm2-tools spells it, for example C(device:/dev/tpmrm0) or
        C(swtpm:host=127.0.0.1,port=2321).
      - Defaults to the TPM resource manager C(device:/dev/tpmrm0).
    type: str
  variant:
    description:
      - The attestation variant of the document (the chooser in C(module_utils/attestation/choose.py)).
        C(qemu-vtpm-ek) documents have the C(qemu-vtpm) format under their own OID (their AK is trusted
        after EK enrollment; the default). C(dummy) is an unsigned test document that proves nothing (refused
        outside the test suite).
    type: str
    choices: [qemu-vtpm, qemu-vtpm-ek, sev-snp, azure-sev-snp, aws-sev-snp, dummy]
    default: qemu-vtpm-ek
  nonce:
    description:
      - The verifier's nonce, as hex or as standard base64. Without it no document is produced.
    type: str
  user_data:
    description:
      - Data bound into the document next to the nonce, as UTF-8 text (Constellation's verification service
        uses C(VerifyService)).
    type: str
    default: ""
  snp_report_source:
    description:
      - Where an SEV-SNP variant's issuer gets the report, as the agent's C(snp_report_source) key says it
        (C(configfs-tsm:/sys/kernel/config/tsm/report), the default, or C(unix:<socket>), the lab's platform).
    type: str
    version_added: "0.4.0"
  amd_roots:
    description:
      - AMD root key (ARK) certificates the SEV-SNP report must chain to, PEM file(s) or a folder on the managed
        host. Default AMD's real ARKs, pinned in the collection (the lab gives its own AMD's).
    type: list
    version_added: "0.4.0"
    elements: path
  amd_cert_cache:
    description:
      - A folder on the managed host of AMD certificates for a report that comes without them (docs/attestation.md,
        "Certificates at hand").
    type: path
    version_added: "0.4.0"
  amd_kds_fetch:
    description:
      - Fetch a missing VCEK or AMD chain from AMD's KDS into O(amd_cert_cache).
    type: bool
    version_added: "0.4.0"
    default: false
  event_log_file:
    description:
      - The raw TCG event log put into the document. A missing file (as with swtpm) means no event log.
      - The old name C(event_log_path) is deprecated and will be removed in 2.0.0.
    type: path
    aliases: [event_log_path]
    default: /sys/kernel/security/tpm0/binary_bios_measurements
attributes:
  check_mode:
    support: full
    description: Reads the TPM and quotes exactly as without check mode; PCRs are never changed.
  diff_mode:
    support: none
    description: Nothing changes, so there is nothing to show.
  idempotent:
    support: full
    description: >-
      Always reports C(changed=false). The first quote on a TPM creates the attestation key and persists it
      at handle 0x81008F01, as Constellation's issuer does; later quotes reuse it.
requirements:
  - The Python package tpm2-pytss on the managed host, with the TPM2 TSS libraries (libtss2) it is built
    against, and a TPM reachable through O(tcti)
seealso:
  - module: constellation.cluster.verify_attestation
"""

EXAMPLES = r"""
- name: Read the PCRs of the node
  constellation.cluster.attestation_info:
  register: node_attestation

- name: Attest a swtpm-backed lab host for a verifier's nonce
  constellation.cluster.attestation_info:
    tcti: swtpm:host=127.0.0.1,port=2321
    nonce: "{{ lookup('ansible.builtin.password', '/dev/null', chars=['hexdigits'], length=64) }}"
    user_data: VerifyService
  register: doc
"""

RETURN = r"""
pcrs:
  description: The SHA-256 PCR bank, PCR index (as a string) to lower-case hex.
  returned: always
  type: dict
  sample: {"0": "0000000000000000000000000000000000000000000000000000000000000000"}
initialized:
  description:
    - Whether PCR 15 is non-zero, that is whether the node has been bound to a cluster.
    - Always false for a variant that quotes no PCRs (C(sev-snp)); its agent's GetState tells.
  returned: always
  type: bool
  sample: false
variant:
  description: The attestation variant.
  returned: always
  type: str
  sample: qemu-vtpm
oid:
  description: The OID of the variant, as carried in aTLS certificates.
  returned: always
  type: str
  sample: 1.3.9900.5.1
nonce:
  description: The nonce the document was made for, as lower-case hex.
  returned: when O(nonce) is set
  type: str
  sample: 0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f20
document:
  description: The attestation document (JSON text).
  returned: when O(nonce) is set
  type: str
  sample: '{"Attestation": {"ak_pub": "...", "quotes": []}, "InstanceInfo": null, "UserData": "VmVyaWZ5U2VydmljZQ=="}'
snp:
  description:
    - The SEV-SNP report of the document, verified to AMD's roots, by AMD's field names (bytes as lower-case hex,
      TCBs as bootloader, tee, snp and microcode), with C(product) and C(signing_key).
    - Its C(snp_policy) is the measurements document's C(snp) object this report passes exactly (its reported TCB
      as minimums, its launch measurement, debug and the migration agent refused); C(policy) is the guest policy
      the report carries.
  returned: when O(nonce) is set and the variant verifies SEV-SNP reports
  type: dict
  sample: {"measurement": "1f2e...", "reported_tcb": {"bootloader": 3, "tee": 0, "snp": 8, "microcode": 115},
           "product": "Milan", "signing_key": "vcek", "snp_policy": {"launchMeasurement": "1f2e...", "snpVersion": 8}}
"""

import base64
import binascii
import re

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import tpm
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import amd_certs, sev_snp, snp_inspect
# Ships every variant the chooser may import with this module (AnsiballZ packs what it sees imported).
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import all_variants  # noqa: F401 pylint: disable=unused-import
from ansible_collections.constellation.cluster.plugins.module_utils.constants import deprecated_alias
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError

_HEX = re.compile(r"^(?:[0-9a-fA-F]{2})+$")


def _decode_nonce(text):
    """Hex first (a hex string never contains base64 padding), then standard base64."""
    text = text.strip()
    if _HEX.match(text):
        return bytes.fromhex(text)
    try:
        nonce = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        nonce = b""
    if not nonce:
        raise InputError("nonce", "a non-empty hex or standard base64 string", text)
    return nonce


def main():
    module = AnsibleModule(
        argument_spec=dict(
            tcti=dict(type="str"),
            variant=dict(type="str", choices=list(choose.VARIANT_NAMES), default=choose.DEFAULT_VARIANT),
            nonce=dict(type="str"),
            user_data=dict(type="str", default=""),
            snp_report_source=dict(type="str"),
            amd_roots=dict(type="list", elements="path"),
            amd_cert_cache=dict(type="path"),
            amd_kds_fetch=dict(type="bool", default=False),
            # Renamed (docs/names.md: one suffix for files); the old name works until 2.0.0.
            event_log_file=dict(type="path", default="/sys/kernel/security/tpm0/binary_bios_measurements", aliases=["event_log_path"],
                                deprecated_aliases=[deprecated_alias("event_log_path")]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        variant = choose.spec(p["variant"])
        pcrs = {}
        if variant.quotes_pcrs:  # sev-snp quotes no PCRs: its host needs no TPM for this
            tpm.require_tpm2_pytss()
            pcrs = tpm.read_pcrs(p["tcti"], "sha256")
        result = dict(
            changed=False,
            variant=variant.name,
            oid=variant.oid,
            pcrs={str(i): pcrs[i].hex() for i in sorted(pcrs)},
            initialized=pcrs.get(tpm.PCR_INDEX_CLUSTER_ID, bytes(32)) != bytes(32),
        )
        if p["nonce"] is not None:
            nonce = _decode_nonce(p["nonce"])
            options = dict(event_log_path=p["event_log_file"])
            cache = None
            if variant.needs_amd_roots:
                options.update(amd_cert_cache=p["amd_cert_cache"], amd_kds_fetch=p["amd_kds_fetch"])
                if p["snp_report_source"]:
                    options["snp_report_source"] = p["snp_report_source"]
                if p["amd_cert_cache"]:
                    cache = amd_certs.CertCache(p["amd_cert_cache"], p["amd_kds_fetch"])
            issuer = choose.issuer(variant.name, p["tcti"], **options)
            try:
                document = issuer.issue(p["user_data"].encode("utf-8"), nonce)
            finally:
                close = getattr(issuer, "close", None)
                if close is not None:
                    close()
            result.update(nonce=nonce.hex(), document=document.decode("utf-8"))
            if variant.needs_amd_roots:
                roots = sev_snp.load_roots(p["amd_roots"]) if p["amd_roots"] else None
                result["snp"] = snp_inspect.inspect(document, roots=roots, cache=cache)
    except ConstellationError as err:
        module.fail_json(msg=str(err))
    except Exception as err:  # pylint: disable=broad-except
        # tpm2-pytss errors (no TPM, TCTI unreachable) are not ours; name the TPM we tried.
        module.fail_json(msg="tcti %s: cannot use the TPM: %s" % (p["tcti"] or tpm.DEFAULT_TCTI, err))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
