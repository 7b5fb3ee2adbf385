# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Re-attestation and eviction: ``PeerTrust`` (re-attestation, eviction, rejoin tickets), its ports, the
evictions as shared state and their store records, the re-attestation loop and the certified AKs kept."""
