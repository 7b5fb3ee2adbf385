# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent's measurements policy file (its ``measurements`` and ``measurements_pub_key`` settings): read at
start through the one loader (attestation/policy.py: the signature first), written again when the accepted sets
change on a running cluster (core/accepted_measurements.py, docs/site.md "Upgrade the image").

Two files change together: the document and its detached signature. The signature waits at ``FILE.next.sig``
until the document is in ``FILE`` (each written atomically); a stop in between is finished at the next start
(``load``), so that a crash never leaves a document beside a signature of another one."""

from __future__ import annotations

import os
from typing import Any, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import MeasurementsMismatch
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import load_policy_file
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.tpm import open_tpm
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_write

NEXT_SIGNATURE = ".next.sig"


class PolicyFile:
    """``path``: the policy file; ``pub_key_path``: the pinned measurements key (PEM) or None."""

    def __init__(self, path: Optional[str], pub_key_path: Optional[str] = None):
        self.path = path
        self.pub_key_path = pub_key_path
        self.pub_key: Any = None  # the pinned key, loaded by ``load``

    def load(self):
        """The policy (a Measurements, or MeasurementSets); a signature left beside by a stop is put in place."""
        try:
            policy = load_policy_file(self.path, public_key_path=self.pub_key_path)
        except ConstellationError:
            if not self._finish():
                raise
            policy = load_policy_file(self.path, public_key_path=self.pub_key_path)
        if self.pub_key_path:
            from ansible_collections.constellation.cluster.plugins.module_utils.attestation import signature

            self.pub_key = signature.load_public_key_file(self.pub_key_path, "measurements_pub_key")
        return policy

    def write(self, document: bytes, signature: Optional[str]) -> None:
        if not self.path:
            return
        if signature:
            atomic_write(self.path + NEXT_SIGNATURE, signature.encode("ascii") + b"\n", 0o644)
        atomic_write(self.path, bytes(document), 0o644)
        self._finish()

    def _finish(self) -> bool:
        pending = (self.path or "") + NEXT_SIGNATURE
        if not self.path or not os.path.exists(pending):
            return False
        os.replace(pending, self.path + ".sig")
        return True


def own_measurement_set(policy, tcti: Optional[str]) -> Optional[str]:
    """The accepted set of ``policy`` (the agent's PCR included) this peer's own PCRs match, or None."""
    indices = sorted({i for m in policy.sets.values() for i in m.pcrs})
    pcrs = {}
    with open_tpm(tcti) as dev:
        for start in range(0, len(indices), 8):  # at most 8 PCRs per read
            pcrs.update(dev.pcr_read("sha256", indices[start:start + 8]))
    try:
        return policy.match(pcrs)[0]
    except MeasurementsMismatch:
        return None
