#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: master_secret
short_description: Create a Constellation master secret file on the controller, optionally vault-encrypted
version_added: "0.1.0"
description:
  - Generates a 32-byte master key and a 32-byte salt, as Constellation's CLI does, and writes them as
    C(constellation-mastersecret.json) (with the fields C(key) and C(salt), both base64) with mode 0600.
  - Never overwrites an existing file. An existing file is checked (decrypted with the play's vault
    secrets if it is vault-encrypted) and the task fails if it is not a master secret.
  - With O(vault=true) the file is encrypted with Ansible Vault, using the play's vault secrets.
  - Runs on the controller (it is an action plugin), whatever the host; with several hosts exactly one
    file is created, the other hosts report it unchanged.
  - Read it back with C(lookup('ansible.builtin.file', path) | constellation.cluster.kms_uri); the file lookup
    decrypts vault files.
author:
  - constellation.cluster contributors (@constellation-cluster)
extends_documentation_fragment:
  - constellation.cluster.controller_secret_file
seealso:
  - plugin: constellation.cluster.kms_uri
    plugin_type: filter
"""

EXAMPLES = r"""
- name: Create the master secret once, vault-encrypted
  constellation.cluster.master_secret:
    path: "{{ inventory_dir }}/constellation-mastersecret.json"
    vault: true
  run_once: true

- name: Use it as a KMS URI
  ansible.builtin.set_fact:
    cluster_kms_uri: "{{ lookup('ansible.builtin.file', inventory_dir ~ '/constellation-mastersecret.json')
                         | constellation.cluster.kms_uri }}"
  no_log: true
"""

RETURN = r"""
path:
  description: The absolute path of the file.
  returned: always
  type: str
  sample: /home/admin/cluster/constellation-mastersecret.json
vault_encrypted:
  description: Whether the file is vault-encrypted.
  returned: always
  type: bool
  sample: true
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import SECRET_FILE_ARGS, stub_main


def main():
    stub_main(AnsibleModule, "master_secret", argument_spec=SECRET_FILE_ARGS)


if __name__ == "__main__":
    main()
