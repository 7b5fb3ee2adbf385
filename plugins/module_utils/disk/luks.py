# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``cryptsetup`` seam (modelled on community.crypto's ``luks_device`` CryptHandler): every call goes
through an injected ``CommandRunner`` (command.py), keys only ever on stdin (``--key-file -``), never on argv
or in a file. Constellation's parameters (docs/agent.md, "State disk"): LUKS2, ``aes-xts-plain64``, integrity ``hmac(sha256)``,
sector 4096, PBKDF argon2id (4 threads, 64 MiB)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.command import CommandRunner
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ExternalCommandError, StateDiskError

CIPHER = "aes-xts-plain64"
INTEGRITY = "hmac-sha256"  # dm-integrity with HMAC-SHA256 (needs device-mapper: dm-crypt and dm-integrity)
SECTOR_SIZE = 4096
MAPPER_DIR = "/dev/mapper"
MAPPER_CONTROL = "/dev/mapper/control"
NO_DM_REASON = "no device-mapper in this kernel: %s missing" % MAPPER_CONTROL

# cryptsetup's exit codes (cryptsetup(8) "RETURN CODES").
RC_WRONG_PARAMS = 1  # also isLuks' "not LUKS"
RC_NO_PERMISSION = 2  # wrong passphrase
RC_NO_DEVICE = 4


@dataclass(frozen=True)
class LuksParams:
    """The key slot's PBKDF. The defaults are Constellation's (argon2id, 64 MiB, 4 threads); cryptsetup 2.6
    needs at least 4 iterations for argon2id. Tests may choose a cheaper one (e.g. pbkdf2)."""

    pbkdf: str = "argon2id"
    iterations: int = 4
    memory_kib: int = 65536
    parallel: int = 4

    def argv(self) -> List[str]:
        args = ["--pbkdf", self.pbkdf, "--pbkdf-force-iterations", str(self.iterations)]
        if self.pbkdf.startswith("argon2"):
            args += ["--pbkdf-memory", str(self.memory_kib), "--pbkdf-parallel", str(self.parallel)]
        return args


def dm_crypt_available(control: str = MAPPER_CONTROL, proc_misc: str = "/proc/misc",
                       proc_devices: str = "/proc/devices") -> Tuple[bool, str]:
    """(whether ``cryptsetup open`` can map a device here, the reason when not). Device-mapper shows as
    ``device-mapper`` in /proc/misc (its control node) or /proc/devices (its block major); the dm-crypt
    target itself is loaded by the kernel on the first open."""
    if not os.path.exists(control):
        return False, "no device-mapper in this kernel: %s missing" % control
    for path in (proc_misc, proc_devices):
        try:
            with open(path, encoding="ascii", errors="replace") as handle:
                if "device-mapper" in handle.read():
                    return True, "device-mapper is available (%s)" % path
        except OSError:
            continue
    return False, "no device-mapper in this kernel: %s exists, but neither %s nor %s names device-mapper" % (
        control, proc_misc, proc_devices)


class Cryptsetup:
    """``cryptsetup`` on one host. ``runner``: the process boundary (a lab host's prefix, a test double)."""

    def __init__(self, runner: Optional[CommandRunner] = None, binary: str = "cryptsetup", timeout: float = 600.0):
        self.runner = runner or CommandRunner()
        self.binary = binary
        self.timeout = timeout

    def _run(self, args: List[str], key: Optional[bytes] = None, check: bool = True):
        return self.runner.run([self.binary] + args, check=check, stdin=key, timeout=self.timeout)

    def is_luks(self, device: str) -> bool:
        """Whether ``device`` carries a LUKS2 header. A missing device is an error, not "no header"."""
        result = self._run(["isLuks", "--type", "luks2", device], check=False)
        if result.rc == 0:
            return True
        if result.rc == RC_WRONG_PARAMS:
            return False
        raise StateDiskError("state disk %s: cannot read it (cryptsetup isLuks exited with %d: %s)"
                             % (device, result.rc, result.stderr.strip()[-300:] or "no such device or access denied"))

    def luks_uuid(self, device: str) -> str:
        """The UUID in the LUKS2 header (lower-case)."""
        try:
            return self._run(["luksUUID", device]).stdout.strip().lower()
        except ExternalCommandError as err:
            raise StateDiskError("state disk %s: expected a LUKS2 header with a UUID: %s" % (device, err)) from None

    def format(self, device: str, key: bytes, uuid: str, integrity: bool = True,
               params: LuksParams = LuksParams()) -> None:
        """``luksFormat`` as Constellation's disk-mapper does (LUKS2, aes-xts-plain64, sector 4096, the PBKDF),
        with ``uuid`` in the header and ``key`` in key slot 0. ``integrity``: HMAC-SHA256 per sector (needs
        device-mapper: cryptsetup then wipes the device, which takes a while on a large disk)."""
        _check_key(key, device)
        args = ["luksFormat", "--batch-mode", "--type", "luks2", "--cipher", CIPHER, "--sector-size", str(SECTOR_SIZE),
                "--uuid", uuid, "--key-slot", "0"]
        # --key-size is the cipher's key (512 bits for XTS); with --integrity cryptsetup adds the HMAC's 256 bits
        # to the volume key itself (768 bits in all). cryptsetup 2.6 refuses --key-size 768 with aes-xts: it is
        # not the XTS key size (found booting the node image, docs/image.md).
        if integrity:
            args += ["--integrity", INTEGRITY]
        args += ["--key-size", "512"]
        args += params.argv() + ["--key-file", "-", device]
        try:
            self._run(args, key=key)
        except ExternalCommandError as err:
            raise StateDiskError("state disk %s: LUKS2 format failed: %s" % (device, err)) from None

    def check_key(self, device: str, key: bytes) -> bool:
        """Whether ``key`` opens a key slot of ``device`` (``open --test-passphrase``: nothing is mapped)."""
        _check_key(key, device)
        result = self._run(["open", "--type", "luks2", "--test-passphrase", "--key-file", "-", device], key=key,
                           check=False)
        if result.rc == 0:
            return True
        if result.rc == RC_NO_PERMISSION:
            return False
        raise StateDiskError("state disk %s: cannot test the key (cryptsetup exited with %d: %s)"
                             % (device, result.rc, result.stderr.strip()[-300:]))

    def open(self, device: str, name: str, key: bytes) -> str:
        """Maps ``device`` at /dev/mapper/``name``; returns that path."""
        _check_key(key, device)
        try:
            self._run(["open", "--type", "luks2", "--key-file", "-", device, name], key=key)
        except ExternalCommandError as err:
            raise StateDiskError("state disk %s: cannot open it as %s: %s" % (device, name, err)) from None
        return os.path.join(MAPPER_DIR, name)

    def close(self, name: str) -> None:
        try:
            self._run(["close", name])
        except ExternalCommandError as err:
            raise StateDiskError("state disk mapping %s: cannot close it: %s" % (name, err)) from None

    def is_open(self, name: str) -> bool:
        """Whether /dev/mapper/``name`` is an active mapping (``cryptsetup status``)."""
        return self._run(["status", name], check=False).rc == 0


def _check_key(key: bytes, device: str) -> None:
    if not isinstance(key, bytes) or not key:
        raise StateDiskError("state disk %s: expected the disk key as non-empty bytes" % device)
