#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: admin_key
short_description: Create the cluster's admin key on the controller, once, vault-encrypted
version_added: "0.4.0"
description:
  - Generates an Ed25519 private key in memory and writes it (PKCS#8 PEM) with mode C(0600), atomically; with
    O(vault=true) encrypted with Ansible Vault (the play's vault secrets), so the key never lies on disk in the
    clear. Never replaces an existing file; checks that it holds an Ed25519 or ECDSA P-256 private key instead.
  - An existing key may be vault-encrypted, passphrase-protected (the passphrase from the variable
    C(constellation_admin_key_passphrase), kept in Ansible Vault) or plain; the cluster actions and the
    C(constellation.cluster.atls) connection read all three, decrypting in memory on the controller.
  - The public half is pinned on every peer at activation; the private half never leaves the controller.
  - It makes the key itself rather than with C(community.crypto.openssh_keypair), which writes the private key
    unencrypted before it could be vault-encrypted.
author:
  - constellation.cluster contributors (@constellation-cluster)
extends_documentation_fragment:
  - constellation.cluster.controller_secret_file
"""

EXAMPLES = r"""
- name: The admin key, once per cluster, vault-encrypted
  constellation.cluster.admin_key:
    path: "{{ inventory_dir }}/admin_key"
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
public_key:
  description: The public half in OpenSSH form; not returned for a passphrase-protected key the play has no passphrase for.
  returned: when known
  type: str
  sample: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGXL3pJmXWq0c0dWK2w0x8zQ1y3nGJtz3pG0VQ1kq3tQ
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import SECRET_FILE_ARGS, stub_main


def main():
    stub_main(AnsibleModule, "admin_key", argument_spec=SECRET_FILE_ARGS)


if __name__ == "__main__":
    main()
