# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node lock (Constellation's nodelock) and the TPM it extends."""

from __future__ import annotations

import threading
from typing import Callable, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.core.ports import TPM


class TPMDevice:
    """The TPM operations the Core needs, on a TCTI (swtpm in the lab, /dev/tpmrm0 on a node).
    Implements ``ports.TPM``."""

    def __init__(self, tcti: Optional[str]):
        self.tcti = tcti

    def mark_initialized(self, cluster_id: bytes) -> None:
        from ansible_collections.constellation.cluster.plugins.module_utils.attestation import tpm

        tpm.mark_initialized(self.tcti, cluster_id)

    def pcr15(self) -> bytes:
        from ansible_collections.constellation.cluster.plugins.module_utils.attestation import tpm

        with tpm.open_tpm(self.tcti) as dev:
            return dev.pcr_read("sha256", [tpm.PCR_INDEX_CLUSTER_ID])[tpm.PCR_INDEX_CLUSTER_ID]


class NodeLock:
    """Constellation's nodelock: one transition, unlocked -> locked, that extends PCR 15.

    ``try_lock_once`` is a compare-and-swap: exactly one caller (thread) ever gets True, and only
    that caller extends PCR 15. A failed TPM call still leaves the lock taken (the node must then
    be reset, as Constellation's)."""

    def __init__(self, tpm: TPM):
        self._tpm = tpm
        self._mutex = threading.Lock()
        self._locked = False

    @property
    def locked(self) -> bool:
        return self._locked

    def try_lock_once(self, cluster_id: bytes, before_extend: Optional[Callable[[], None]] = None) -> bool:
        """``before_extend()`` runs for the winner only, before PCR 15 is extended: a node persists its
        activation there, so that a crash right after the extension finds it (docs/agent.md)."""
        with self._mutex:
            if self._locked:
                return False
            self._locked = True
        if before_extend is not None:
            before_extend()
        self._tpm.mark_initialized(cluster_id)
        return True

    def mark_taken(self) -> None:
        """At start-up, PCR 15 already holds a cluster ID: the lock was taken in an earlier life."""
        with self._mutex:
            self._locked = True
