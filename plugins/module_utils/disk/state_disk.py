# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``StateDisk``: the node's state disk as Constellation's disk-mapper keeps it (docs/agent.md, "State disk"). A device without a
LUKS2 header is formatted only on the first activation, with the disk UUID the Coordinator derives the disk key
for as its LUKS UUID; a header with another UUID, a wrong key or a device that holds anything else is refused,
naming the device and what was expected. Then it is opened at /dev/mapper/<name>, given an ext4 file system when
it has none, and mounted."""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.command import CommandRunner
from ansible_collections.constellation.cluster.plugins.module_utils.disk.luks import (
    MAPPER_DIR,
    Cryptsetup,
    LuksParams,
)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ExternalCommandError, StateDiskError

DEFAULT_MAPPER_NAME = "constellation-state"
# What GetState says of a node without ``state_disk_device``.
NOT_ENCRYPTED = {"encrypted": False, "device": None, "luks_uuid": None, "open": False,
                 "message": "the state is not on an encrypted disk (no state_disk_device is configured)"}
BLKID_NOTHING_FOUND = 2  # blkid -p: no signature on the device


class StateDisk:
    """One LUKS2 state disk. ``runner``: the process boundary for cryptsetup, blkid, mkfs.ext4, mount and
    umount; ``integrity``: dm-integrity (HMAC-SHA256) as Constellation formats it; ``params``: the PBKDF."""

    def __init__(self, device: str, mapper_name: str = DEFAULT_MAPPER_NAME, mount_dir: str = "",
                 runner: Optional[CommandRunner] = None, integrity: bool = True, params: LuksParams = LuksParams(),
                 cryptsetup: Optional[Cryptsetup] = None):
        if not device or not mount_dir:
            raise StateDiskError("state disk: expected a device and a mount directory, got %r and %r" % (device, mount_dir))
        self.device = device
        self.mapper_name = mapper_name
        self.mount_dir = os.path.abspath(mount_dir)
        self.runner = runner or CommandRunner(timeout=600.0)
        self.crypt = cryptsetup or Cryptsetup(self.runner)
        self.integrity = integrity
        self.params = params
        self._luks_uuid: Optional[str] = None  # the header's, once read
        self._open = False

    @property
    def mapper_path(self) -> str:
        return os.path.join(MAPPER_DIR, self.mapper_name)

    def _require_device(self) -> None:
        if not os.path.exists(self.device):
            raise StateDiskError("state disk %s: expected a block device (or file) at this path: it does not exist"
                                 % self.device)

    def is_formatted(self) -> bool:
        """Whether the device carries a LUKS2 header."""
        self._require_device()
        return self.crypt.is_luks(self.device)

    def luks_uuid(self) -> str:
        if self._luks_uuid is None:
            self._luks_uuid = self.crypt.luks_uuid(self.device)
        return self._luks_uuid

    def _signature(self, path: str) -> Optional[str]:
        """The type of what ``blkid -p`` finds on ``path`` (a file system, a partition table), or None."""
        result = self.runner.run(["blkid", "-p", "-o", "value", "-s", "TYPE", path], check=False)
        if result.rc == BLKID_NOTHING_FOUND:
            return None
        if result.rc != 0:
            raise StateDiskError("state disk %s: cannot probe %s (blkid exited with %d: %s)"
                                 % (self.device, path, result.rc, result.stderr.strip()[-300:]))
        return result.stdout.strip() or "a partition table or unknown signature"

    def prepare(self, key: bytes, disk_uuid: str, first: bool) -> bool:
        """Formats (``first`` only, on a device without any signature), then checks the header's UUID and the
        key, without mapping anything. Returns whether the device was formatted now."""
        self._require_device()
        disk_uuid = disk_uuid.lower()
        formatted = False
        if not self.crypt.is_luks(self.device):
            if not first:
                raise StateDiskError("state disk %s: expected a LUKS2 header with UUID %s, found none; only the first "
                                     "activation formats the state disk" % (self.device, disk_uuid))
            found = self._signature(self.device)
            if found is not None:
                raise StateDiskError("state disk %s: expected an empty device to format, found %s on it; refusing to "
                                     "overwrite it (wipe it with wipefs -a if it is the state disk)" % (self.device, found))
            self.crypt.format(self.device, key, disk_uuid, integrity=self.integrity, params=self.params)
            formatted = True
        self._luks_uuid = None
        found_uuid = self.luks_uuid()
        if found_uuid != disk_uuid:
            raise StateDiskError("state disk %s: its LUKS2 UUID is %s, expected this node's disk UUID %s; refusing it"
                                 % (self.device, found_uuid, disk_uuid))
        if not self.crypt.check_key(self.device, key):
            raise StateDiskError("state disk %s: the disk key does not open it (no key slot takes it); refusing it"
                                 % self.device)
        return formatted

    def unlock(self, key: bytes, disk_uuid: str, first: bool) -> bool:
        """``prepare``, then open at /dev/mapper/<mapper_name>, ``mkfs.ext4`` when it holds no file system yet,
        and mount at ``mount_dir``. Idempotent: an open mapping and a mounted directory are kept. Returns whether
        the device was formatted now."""
        formatted = self.prepare(key, disk_uuid, first)
        if not self.crypt.is_open(self.mapper_name):
            self.crypt.open(self.device, self.mapper_name, key)
        self._open = True
        if not os.path.ismount(self.mount_dir):
            if formatted or self._signature(self.mapper_path) is None:
                self._run(["mkfs.ext4", "-q", "-L", "constellation-state", self.mapper_path], "make a file system on")
            os.makedirs(self.mount_dir, mode=0o700, exist_ok=True)
            self._run(["mount", "-t", "ext4", "-o", "nodev,nosuid,noexec", self.mapper_path, self.mount_dir], "mount")
        return formatted

    def lock(self) -> None:
        """Unmounts and closes (what is not mounted or open is left alone)."""
        if os.path.ismount(self.mount_dir):
            self._run(["umount", self.mount_dir], "unmount")
        if self.crypt.is_open(self.mapper_name):
            self.crypt.close(self.mapper_name)
        self._open = False

    def _run(self, argv, what: str) -> None:
        try:
            self.runner.run(argv)
        except ExternalCommandError as err:
            raise StateDiskError("state disk %s: cannot %s %s: %s" % (self.device, what, self.mapper_path, err)) from None

    def status(self) -> Dict[str, Any]:
        """For GetState: whether the state is on the opened encrypted disk, the device, its LUKS2 UUID. Cheap:
        no program is run (the UUID is the one read when it was opened)."""
        is_open = self._open and os.path.exists(self.mapper_path) and os.path.ismount(self.mount_dir)
        message = ("the state is on the encrypted disk %s (LUKS2, opened with the disk key)" % self.device if is_open
                   else "the state disk %s is not open: the state is not on an encrypted disk yet" % self.device)
        return {"encrypted": is_open, "device": self.device, "luks_uuid": self._luks_uuid, "open": is_open,
                "message": message}
