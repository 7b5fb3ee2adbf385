# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """Attestation options of the controller-side cluster actions (module_utils/attestation/policy.py)."""

    # Documentation is read as a literal: the variant choices must equal attestation/choose.py's
    # VARIANT_NAMES, which the argument spec uses (the repository's test_choose.py checks it).
    DOCUMENTATION = r"""
options:
  measurements:
    description:
      - The measurements policy inline, in Constellation's JSON shape (PCR index to C(expected) hex and
        C(warnOnly)). Mutually exclusive with O(measurements_file). Must name at least one PCR.
    type: dict
  measurements_file:
    description:
      - A JSON or YAML file on the controller with the policy; relative to the playbook's folder.
      - The old name C(measurements_path) is deprecated and will be removed in 2.0.0.
    type: path
    aliases: [measurements_path]
  measurements_pub_key_file:
    description:
      - A pinned ECDSA P-256 public key (PEM, as C(cosign.pub)) that O(measurements_file) must be signed with.
        The detached signature C(<measurements_file>.sig) (the form C(cosign sign-blob --key) prints) is checked
        against the file's exact bytes before the policy is used; an unsigned or altered file is refused, naming it.
      - When set, inline O(measurements) are refused (they carry no signature). When unset, unsigned files are used
        as before. Relative to the playbook's folder.
      - The old name C(measurements_public_key_path) is deprecated and will be removed in 2.0.0.
    type: path
    aliases: [measurements_public_key_path]
  variant:
    description:
      - The attestation variant peers must present (the chooser in C(module_utils/attestation/choose.py)).
      - V(qemu-vtpm-ek) (the default) trusts the attestation key only after enrollment through the TPM's EK
        certificate chain (to O(ek_ca_path)) and credential activation.
      - V(qemu-vtpm) trusts any attestation key, as Constellation does (a software key that declares itself a TPM
        key passes); it is refused unless O(insecure_trust_any_ak=true), and then every run warns.
      - V(sev-snp) trusts the AMD SEV-SNP report of a guest without a vTPM (signed by the CPU's VCEK or VLEK,
        chained to O(amd_roots)); it quotes no PCRs, the measurements' C(snp) object is what it checks.
      - V(azure-sev-snp) and V(aws-sev-snp) (Constellation's) trust the vTPM's attestation key because the VM's
        SEV-SNP report (chained to O(amd_roots)) binds it; the PCRs and the measurements' C(snp) object are checked.
      - V(dummy) proves nothing and is refused outside the test suite.
    type: str
    choices: [qemu-vtpm, qemu-vtpm-ek, sev-snp, azure-sev-snp, aws-sev-snp, dummy]
    default: qemu-vtpm-ek
  insecure_trust_any_ak:
    description:
      - The explicit acknowledgement that V(qemu-vtpm) trusts ANY attestation key (playbooks set it from
        C(constellation_insecure_trust_any_ak)). Without it V(qemu-vtpm) is refused, naming this option.
    type: bool
    default: false
  ek_ca_path:
    description:
      - PEM file with the CA certificate(s) that TPMs' EK certificates must chain to (a bundle of several CAs, as TPM
        vendors and cloud vTPMs publish them), or a folder of such files; required for V(qemu-vtpm-ek). Only
        self-signed CAs are trust anchors; the other CA certificates are intermediates. Relative to the playbook's
        folder.
      - A peer whose AK is not yet certified is enrolled first (RPC C(EnrollAK)); a TPM whose EK certificate
        does not chain to these CAs is refused.
    type: path
  amd_roots:
    description:
      - PEM file with AMD's root certificates (the ARK, and the ASK or ASVK it signed) for the SEV-SNP variants, or a
        folder of such files; an SEV-SNP report must chain to one of them. Default AMD's own roots for Milan, Genoa
        and Turin, pinned in the collection; set it only to pin another root (the lab's AMD chain). Relative to the
        playbook's folder.
    type: path
    version_added: "0.4.0"
  netns:
    description:
      - B(Lab only.) Open the controller's TCP connections in this network namespace (C(/run/netns/NAME)).
    type: str
  timeout:
    description: Seconds for the TCP connect, the TLS handshake and each answer, each.
    type: float
    default: 10
  attestation_timeout:
    description: Seconds the validation of an attestation may take.
    type: float
    default: 30
requirements:
  - The Python package tpm2-pytss 3.0.0 or later on the controller, with the TPM2 TSS libraries (libtss2)
    it is built against, to validate the TPM quotes of the C(qemu-vtpm) and C(qemu-vtpm-ek) variants
notes:
  - Runs on the controller (an action plugin) whatever the host; the host's connection is not used.
  - Every peer is attested (fresh nonce, TPM quote, policy) before the first byte is sent to it.
"""
