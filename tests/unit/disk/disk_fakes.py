"""Test doubles of the state disk tests: the recording runner at the process boundary, cheap key slots."""

from __future__ import annotations

from ansible_collections.constellation.cluster.plugins.module_utils.command import CommandResult, CommandRunner
from ansible_collections.constellation.cluster.plugins.module_utils.disk.luks import LuksParams

UUID = "0f3e1c2a-1111-4222-8333-444455556666"
OTHER_UUID = "9a8b7c6d-5555-4666-8777-888899990000"
FAST = LuksParams(pbkdf="pbkdf2", iterations=1000)  # the tests' key slots: cheap to open


class RecordingRunner(CommandRunner):
    """Test double at the process boundary: records (argv, stdin). ``real``: runs cryptsetup and blkid for real
    (what works on a file without device-mapper) and records the rest (open, status, mkfs, mount) as succeeded."""

    DM_ONLY = {("cryptsetup", "open"), ("cryptsetup", "close"), ("cryptsetup", "status")}

    def __init__(self, real: bool = False, status_rc: int = 1):
        super().__init__()
        self.real = real
        self.status_rc = status_rc
        self.calls = []

    def run(self, argv, check=True, env=None, stdin=None, new_session=False, timeout=None):
        self.calls.append((list(argv), stdin))
        dm_only = tuple(argv[:2]) in self.DM_ONLY and "--test-passphrase" not in argv
        if self.real and not dm_only and argv[0] in ("cryptsetup", "blkid"):
            return super().run(argv, check=check, env=env, stdin=stdin, timeout=timeout)
        if tuple(argv[:2]) == ("cryptsetup", "status"):
            return CommandResult(self.status_rc, "", "", tuple(argv))
        if argv[0] == "blkid":
            return CommandResult(2, "", "", tuple(argv))  # nothing on the new mapping
        return CommandResult(0, "", "", tuple(argv))

    def programs(self):
        return [" ".join(argv[:2]) if argv[0] == "cryptsetup" else argv[0] for argv, _stdin in self.calls]
