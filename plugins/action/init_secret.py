# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin init_secret: makes the cluster's init secret file on the controller once (std base64 of 32
random bytes), with the master secret's file handling (WriteOnceSecretAction: 0600, atomic, never
overwritten, optionally Ansible Vault). Documentation in plugins/modules/init_secret.py."""

from __future__ import annotations

import base64
import secrets

from ansible_collections.constellation.cluster.plugins.action.master_secret import WriteOnceSecretAction
from ansible_collections.constellation.cluster.plugins.module_utils.kms.init_secret import (
    INIT_SECRET_LENGTH, parse_init_secret)


class ActionModule(WriteOnceSecretAction):
    WHAT = "init secret file (std base64 of %d bytes)" % INIT_SECRET_LENGTH
    READ_LIMIT = 65536

    def _generate(self) -> bytes:
        return base64.b64encode(secrets.token_bytes(INIT_SECRET_LENGTH)) + b"\n"

    def _check_content(self, data: bytes) -> None:
        parse_init_secret(data.decode("ascii", "replace"), "path")
