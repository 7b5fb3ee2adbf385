#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: measurement_salt
short_description: Create the cluster's measurement salt file on the controller, once
version_added: "0.1.0"
description:
  - Writes a JSON object with one key, C(measurementSalt), standard base64 of 32 random bytes, with mode C(0600),
    atomically, optionally encrypted
    with Ansible Vault (the play's vault secrets). Never replaces an existing file; checks it instead.
  - The salt is made once per cluster (as Constellation's CLI does at init); the cluster ID is derived from it, so it
    must stay the same for the cluster's life.
author:
  - constellation.cluster contributors (@constellation-cluster)
extends_documentation_fragment:
  - constellation.cluster.controller_secret_file
"""

EXAMPLES = r"""
- name: Measurement salt, once per cluster
  constellation.cluster.measurement_salt:
    path: "{{ inventory_dir }}/constellation-measurement-salt.json"
    vault: true
  run_once: true
"""

RETURN = r"""
path:
  description: The file's absolute path.
  returned: always
  type: str
vault_encrypted:
  description: Whether the file is vault-encrypted.
  returned: always
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import SECRET_FILE_ARGS, stub_main


def main():
    stub_main(AnsibleModule, "measurement_salt", argument_spec=SECRET_FILE_ARGS)


if __name__ == "__main__":
    main()
