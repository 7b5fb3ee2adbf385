# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Recover: a node whose TPM was reset (reboot) while its store holds a cluster's state proves,
with the KMS URI, that the cluster is its own, takes the node lock again and resumes."""

from __future__ import annotations

import hmac
from typing import Any, Dict

from ansible_collections.constellation.cluster.plugins.module_utils.core.base import CoreBase
from ansible_collections.constellation.cluster.plugins.module_utils.core.inputs import open_kms
from ansible_collections.constellation.cluster.plugins.module_utils.core.state import ROLE_NODE
from ansible_collections.constellation.cluster.plugins.module_utils.errors import REASON_NOT_WAITING_FOR_RECOVERY, StateError


class Recovery(CoreBase):
    def recover(self, kms_uri: str) -> Dict[str, Any]:
        method = "Recover"
        if not self.recovery_pending:
            raise StateError("%s is allowed only on a node whose stored state waits for recovery (PCR 15 reset); "
                             "this node is %s" % (method, self._state.wire_name)).with_reason(
                                 REASON_NOT_WAITING_FOR_RECOVERY)
        kms = open_kms(kms_uri)
        node = self._stored_node()
        cluster_id = kms.cluster_id(node.measurement_salt)
        if not hmac.compare_digest(cluster_id, node.cluster_id):
            raise StateError("%s: the KMS URI does not derive this node's cluster ID" % method)
        if node.role == ROLE_NODE:
            disk_key = self.read_disk_key()
            if disk_key is not None and not hmac.compare_digest(disk_key, kms.state_disk_key(node.disk_uuid)):
                raise StateError("%s: the KMS URI does not derive this node's disk key" % method)
        self._take_lock(cluster_id, method)
        try:
            self.recovery_pending = False
            self._resume()
        except BaseException as err:
            self._fail(method, err)
            raise
        return self.get_state()
