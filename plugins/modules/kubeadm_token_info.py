#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: kubeadm_token_info
short_description: List kubeadm bootstrap tokens without their secrets
version_added: "0.1.0"
author: constellation.cluster contributors (@constellation-cluster)
description:
  - Runs C(kubeadm token list -o json) on a control-plane host and returns the tokens' IDs and metadata.
    The secret half of each token is dropped before anything is returned.
extends_documentation_fragment:
  - constellation.cluster.kubeadm
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
  idempotent:
    description: When run twice in a row outside check mode, with the same arguments, the second invocation indicates no change.
    support: full
"""

EXAMPLES = r"""
- name: Which bootstrap tokens exist
  constellation.cluster.kubeadm_token_info:
  register: bootstrap_tokens
"""

RETURN = r"""
tokens:
  description: The bootstrap tokens, without their secret halves.
  returned: always
  type: list
  elements: dict
  contains:
    token_id:
      description: Public token ID.
      type: str
    description:
      description: The token's description.
      type: str
    expires:
      description: Expiry time (RFC 3339) or null.
      type: str
    usages:
      description: Usages.
      type: list
      elements: str
    groups:
      description: Extra groups.
      type: list
      elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm import (
    Kubeadm,
    common_argument_spec,
    list_tokens,
)


def main():
    module = AnsibleModule(argument_spec=common_argument_spec(), supports_check_mode=True)
    try:
        result = list_tokens(Kubeadm(module.params["kubeadm_path"], module.params["kubernetes_dir"]))
    except ConstellationError as err:
        module.fail_json(msg=str(err))
    module.exit_json(changed=False, tokens=result.tokens)


if __name__ == "__main__":
    main()
