# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fakes of the Core's ports (``core/ports.py``) that the agent tests share. A module of its
own (not conftest.py): test files import it by a name no other test folder uses."""

from __future__ import annotations

import hashlib
from typing import List

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import extend_digest
from ansible_collections.constellation.cluster.plugins.module_utils.core import ports


class RecordingVPN(ports.VPN):
    """Stands in for WireGuard in Core unit tests: remembers what it was told (``ports.VPN``)."""

    vpn_cidr = "10.118.0.0/16"

    def __init__(self):
        self.address = None
        self.priv_key = None
        self.peers: List = []
        self.setups = 0

    def setup(self, vpn_ip, priv_key):
        self.address, self.priv_key = vpn_ip, priv_key
        self.setups += 1

    def set_peers(self, records, own_pub_key):
        self.peers = [r for r in records if r.vpn_pub_key != own_pub_key]
        return True


class MemoryTPM(ports.TPM):
    """A PCR 15 in memory (``ports.TPM``), for Core tests that need no real TPM."""

    def __init__(self):
        self.pcr = bytes(32)
        self.extends = 0

    def mark_initialized(self, cluster_id: bytes) -> None:
        self.pcr = extend_digest(self.pcr, hashlib.sha256(cluster_id).digest())
        self.extends += 1

    def pcr15(self) -> bytes:
        return self.pcr
