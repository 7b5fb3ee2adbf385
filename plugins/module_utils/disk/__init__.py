# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The encrypted state disk, as Constellation's disk-mapper sets it up (docs/agent.md, "State disk").

Rooms: ``luks.py`` (the ``cryptsetup`` seam: LUKS2 format, header UUID, key check, open, close; whether this
kernel has dm-crypt), ``state_disk.py`` (``StateDisk``: format on the first activation, open and mount with the
disk key, unmount and close; its status for GetState) and ``attach.py`` (the agent's use of it: the disk at boot,
on the key's arrival, the file store moved onto it). Plain Python: no Ansible, no RPC."""

from __future__ import annotations

from ansible_collections.constellation.cluster.plugins.module_utils.disk.luks import (  # noqa: F401 pylint: disable=unused-import
    Cryptsetup,
    LuksParams,
    dm_crypt_available,
)
from ansible_collections.constellation.cluster.plugins.module_utils.disk.state_disk import (  # noqa: F401 pylint: disable=unused-import
    NOT_ENCRYPTED,
    StateDisk,
)
