# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent's RPC: framing, the schema (one table of methods), servers and clients.

The API names live here, not in schema.py, so that the task workers of the atls connection plugin
(which import rpc/client.py once per task) need not build the schema's records.
"""

PUBAPI = "pubapi"
ADMIN = "admin"
VPNAPI = "vpnapi"
APIS = (PUBAPI, ADMIN, VPNAPI)
