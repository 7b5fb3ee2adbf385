# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent's state disk (docs/agent.md, "State disk"): ``AgentStateDisk`` is the Core's ``StateDiskPort``.

* Boot (agent start, before the store is read): a device with a LUKS2 header is opened with the key at rest
  (the Core's ``read_disk_key``) and mounted, and the file store is used from it. A device without a header is
  left alone: the store stays in the state directory until the first activation.
* The key arrives (the Core's ``_keep_disk_key``: activation, join; rejoin): the disk is formatted (first
  activation only: LUKS UUID = the node's disk UUID), opened and mounted, and the store moved onto it.
* A node that was activated before the disk was set up (a crash between the key and the format, or
  ``state_disk_device`` added later) sets it up at start with the key at rest, as on the first activation."""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.disk.state_disk import StateDisk
from ansible_collections.constellation.cluster.plugins.module_utils.errors import StateDiskError

STORE_NAME = "store.json"


class AgentStateDisk:
    """``store``: the agent's FileStore (moved with ``relocate``); ``read_key``: the Core's ``read_disk_key``;
    ``log``: the agent's JSON log."""

    def __init__(self, disk: StateDisk, store: Any, read_key: Optional[Callable[[], Optional[bytes]]] = None,
                 log: Optional[Callable[..., None]] = None):
        self.disk = disk
        self.store = store
        self.read_key = read_key or (lambda: None)
        self.log = log or (lambda *_args, **_fields: None)
        self.store_path = os.path.join(disk.mount_dir, STORE_NAME)
        self.mounted = False

    def header_uuid(self) -> Optional[str]:
        """The LUKS2 UUID of a formatted disk (the node's disk UUID), None before the first activation."""
        return self.disk.luks_uuid() if self.disk.is_formatted() else None

    def at_boot(self) -> bool:
        """Before the store is read: opens and mounts a formatted disk with the key at rest and moves to the store
        on it. Returns whether the disk is in use."""
        uuid = self.header_uuid()
        if uuid is None:
            self.log("state_disk_not_formatted", device=self.disk.device,
                     message="formatted at the first activation; until then the state is not on an encrypted disk")
            return False
        key = self.read_key()
        if key is None:
            raise StateDiskError("state disk %s: it is encrypted (LUKS2 UUID %s) and this node holds no disk key at "
                                 "rest to open it; the store on it cannot be read" % (self.disk.device, uuid))
        self._use(key, uuid, first=False)
        return True

    def after_load(self, activated: bool, disk_uuid: str) -> None:
        """After the Core restored its state: an activated node whose disk is not set up yet (a crash between the
        key and the format, or state_disk_device added later) sets it up now with the key at rest."""
        if self.mounted or not activated:
            return
        key = self.read_key()
        if key is not None:
            self._use(key, disk_uuid, first=True)

    def key_arrived(self, key: bytes, disk_uuid: str, first: bool) -> None:
        """The Core's StateDiskPort: the disk key of an activation, join or rejoin."""
        if self.mounted:
            return
        self._use(key, disk_uuid, first)

    def _use(self, key: bytes, disk_uuid: str, first: bool) -> None:
        formatted = self.disk.unlock(key, disk_uuid, first)
        moved = self.store.relocate(self.store_path)
        self.mounted = True
        self.log("state_disk_open", device=self.disk.device, mount_dir=self.disk.mount_dir, formatted=formatted,
                 store_moved=moved)

    def close(self) -> None:
        """Unmounts and closes (agent stop): the store must be closed first."""
        if self.mounted:
            self.disk.lock()
            self.mounted = False

    def status(self) -> Dict[str, Any]:
        return self.disk.status()
