# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The peer registry: a peer's record, the versioned peer set and registry, its in-memory cache, the VPN IP
allocation and who gets what (``PeerAccess``)."""
