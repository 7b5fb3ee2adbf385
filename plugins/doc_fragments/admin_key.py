# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """The admin key option of the day-2 actions that authenticate as the admin (AdminAuth): admit_nodes,
    remove_peer, reset_agent (module_utils/rpc/admin_key.py loads the key)."""

    DOCUMENTATION = r"""
options:
  admin_priv_key_file:
    description:
      - The admin's private key file (the key pinned at activation).
      - It may be an Ansible Vault file (decrypted in memory with the play's vault secrets, never written
        decrypted) or passphrase-protected (the passphrase from the variable C(constellation_admin_key_passphrase),
        kept in Ansible Vault); C(playbooks/secrets.yml) makes it vault-encrypted.
    type: path
    required: true
"""
