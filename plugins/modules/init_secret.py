#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: init_secret
short_description: Create the cluster's init secret file on the controller, once
version_added: "0.4.0"
description:
  - Writes the cluster's init secret, standard base64 of 32 random bytes, with mode C(0600), atomically, optionally
    encrypted with Ansible Vault (the play's vault secrets). Never replaces an existing file; checks it instead.
  - The role M(constellation.cluster.node_agent) provisions every agent with the hash of the init secret derived
    from it for that host, and site.yml proves it to the Coordinator; so it must exist before the agents are
    installed. C(playbooks/secrets.yml) makes it with the other secrets.
author:
  - constellation.cluster contributors (@constellation-cluster)
extends_documentation_fragment:
  - constellation.cluster.controller_secret_file
seealso:
  - plugin: constellation.cluster.init_secret_hash
    plugin_type: filter
"""

EXAMPLES = r"""
- name: The init secret, once per cluster
  constellation.cluster.init_secret:
    path: "{{ inventory_dir }}/init_secret"
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
    stub_main(AnsibleModule, "init_secret", argument_spec=SECRET_FILE_ARGS)


if __name__ == "__main__":
    main()
