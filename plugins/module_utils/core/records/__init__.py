# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The records the Core keeps and hands out: the store's key layout (``state_store``), the node state,
what the Coordinator records about nodes, the sealed storage key's file, the activation records and tickets."""
