# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter init_secret_hash: a thin adapter over module_utils/kms/init_secret.py.
Its documentation is in init_secret_hash.yml next to this file."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils.kms.init_secret import init_secret_hash as _hash


def init_secret_hash(init_secret, public_ip):
    """init_secret_b64 | init_secret_hash(public_ip) -> hex SHA-256 of that node's init secret."""
    try:
        return _hash(init_secret, str(public_ip))
    except (ConstellationError, ValueError) as err:
        # Never echo the secret: the errors of kms/init_secret.py name the field only.
        reason = err if isinstance(err, ConstellationError) else "public_ip: expected an IP address"
        raise AnsibleFilterError("init_secret_hash: %s" % reason) from None


class FilterModule:
    def filters(self):
        return {"init_secret_hash": init_secret_hash}
