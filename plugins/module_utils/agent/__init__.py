# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node agent: the daemon (``daemon``) and its configuration (``config``), the adapters that put
the Core on the wire (``pubapi``, ``vpnapi``, ``admin``), module execution for the admin channel
(``execution``) and the verification service (``verify_service``). Only the daemon wires the Core
to the servers; nothing in ``core/`` imports this package."""
