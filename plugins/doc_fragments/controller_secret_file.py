# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """Options and attributes shared by the write-once secret files on the controller (master_secret,
    measurement_salt, kubeadm_admin_kubeconfig: one action plugin base, WriteOnceSecretAction)."""

    DOCUMENTATION = r"""
options:
  path:
    description:
      - Where to write the file on the controller. A relative path is relative to the playbook's folder.
      - The folder must exist.
    type: path
    required: true
  vault:
    description: Encrypt the file with Ansible Vault using the play's vault secrets.
    type: bool
    default: false
  vault_id:
    description:
      - The vault ID to encrypt with, when the play has several. Default is the first one.
    type: str
attributes:
  action:
    description: Indicates this has a corresponding action plugin so some parts of the options can be executed on the controller.
    support: full
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: full
    details: The diff shows the path, mode and whether the file is vault-encrypted; never the secret.
  idempotent:
    description: When run twice in a row outside check mode, with the same arguments, the second run reports no change.
    support: full
    details: An existing file is never overwritten.
  platform:
    description: Target OS/families that can be operated against.
    support: N/A
    platforms: posix
    details: Runs on the controller whatever the host.
notes:
  - The file is written atomically with mode C(0600).
"""
