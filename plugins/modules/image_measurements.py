#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: image_measurements
short_description: Predict a node image's PCRs from its UKI and write its signed measurements document
version_added: "0.4.0"
description:
  - Computes, from the node image's UKI (O(uki)), the values of PCRs 4, 7, 9 and 11 (SHA-256) the image quotes when
    the firmware O(firmware) boots it, each with the events that extend it (docs/image.md, "Predicted measurements") - the
    Authenticode digests of the UKI and its kernel, the Secure Boot policy variables, the command line and initrd,
    and the UKI's sections and boot phases through C(systemd-measure).
  - Writes O(dest), a measurements document with one accepted set named O(name) that enforces those four PCRs and
    PCR 13 at 32 zero bytes (the image's agent does not extend it), signed with O(priv_key_file) into
    C(<dest>.sig) (the form C(cosign sign-blob) prints, as M(constellation.cluster.measurements_signature)).
  - With O(base_file) (the document in force) its sets and agents are kept beside the new set and the version is
    raised by one - the document C(upgrade_image.yml) takes. With O(pub_key_file) the base is taken only when its
    signature verifies.
  - Idempotent - an O(dest) that already holds the same document, signed by the same key, is kept. The document
    and its signature are each replaced atomically; a failed task changes neither.
  - Runs on the controller whatever the host (an action plugin); it connects to nothing. The controller needs
    C(systemd-measure) (Debian 12's C(systemd), C(/usr/lib/systemd/systemd-measure)).
author:
  - constellation.cluster contributors (@constellation-cluster)
requirements:
  - The Python package cryptography and C(systemd-measure) on the controller
options:
  uki:
    description: The image's UKI (systemd-stub with C(.linux), C(.osrel), C(.cmdline) and C(.initrd) sections).
    type: path
    required: true
  name:
    description: The accepted set's name, the image's version (1-64 characters C([A-Za-z0-9._+-])).
    type: str
    required: true
  dest:
    description: Where the document is written (and C(<dest>.sig) with O(priv_key_file)).
    type: path
    required: true
  base_file:
    description:
      - The measurements document in force. Its sets and agents are kept and the new set added; a set of the same
        name must hold the same values.
    type: path
  version:
    description:
      - The document's version. Default 0, or the version of O(base_file) plus one. With O(base_file) it must be
        above the base's when the sets change.
    type: int
  firmware:
    description: The firmware profile PCR 7 is predicted for (OVMF 2022.11, Secure Boot off, no keys enrolled).
    type: str
    choices: [ovmf-2022.11]
    default: ovmf-2022.11
  priv_key_file:
    description:
      - The ECDSA P-256 private key (PEM) that signs the document. Without it the document is written unsigned, and
        an existing C(<dest>.sig) is refused (it would no longer match).
    type: path
  priv_key_passphrase:
    description: The passphrase of an encrypted O(priv_key_file).
    type: str
  pub_key_file:
    description:
      - The pinned public key (PEM). O(base_file) must be signed by it, and O(priv_key_file) must be its private half.
    type: path
attributes:
  check_mode:
    support: full
    description: Predicts and reports whether O(dest) would change; writes nothing.
  diff_mode:
    support: none
    description: The document is returned in RV(pcrs) and RV(prediction), not as a diff.
  idempotent:
    support: full
    description: The same document signed by the same key is kept.
"""

EXAMPLES = r"""
- name: Predict the new image's measurements and sign them beside the running image's
  constellation.cluster.image_measurements:
    uki: "{{ playbook_dir }}/images/2026.11/uki.efi"
    name: debian-12-2026.11
    base_file: "{{ inventory_dir }}/measurements.json"
    dest: "{{ inventory_dir }}/measurements-upgrade.json"
    priv_key_file: "{{ lookup('ansible.builtin.env', 'HOME') }}/keys/measurements.key"
    pub_key_file: "{{ inventory_dir }}/measurements.pub"
  register: image_measurements
"""

RETURN = r"""
pcrs:
  description: The predicted PCR values (hex) by index (C("4"), C("7"), C("9"), C("11")).
  returned: success
  type: dict
prediction:
  description:
    - What the values were computed from and each PCR's events, C({pcr, type, digest, description, data}) in order -
      the firmware profile, the stub's version, the UKI's SHA-256 and Authenticode digests, each section's SHA-256.
  returned: success
  type: dict
version:
  description: The document's version.
  returned: success
  type: int
sets:
  description: The names of the document's accepted sets.
  returned: success
  type: list
  elements: str
measurements_file:
  description: The document's path (O(dest)).
  returned: success
  type: str
signature_file:
  description: Its detached signature's path; null when unsigned.
  returned: success
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import IMAGE_MEASUREMENTS_ARGS, stub_main


def main():
    stub_main(AnsibleModule, "image_measurements", argument_spec=IMAGE_MEASUREMENTS_ARGS)


if __name__ == "__main__":
    main()
