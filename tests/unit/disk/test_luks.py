"""The cryptsetup seam and StateDisk with the REAL cryptsetup on a regular file (format, header UUID, key check:
no device-mapper needed), and the open/mkfs/mount sequence through a recorded-argv test double."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.command import CommandResult
from ansible_collections.constellation.cluster.plugins.module_utils.disk import luks
from ansible_collections.constellation.cluster.plugins.module_utils.disk.luks import Cryptsetup, dm_crypt_available
from ansible_collections.constellation.cluster.plugins.module_utils.disk.state_disk import StateDisk
from ansible_collections.constellation.cluster.plugins.module_utils.errors import StateDiskError
from ansible_collections.constellation.cluster.tests.unit.disk.disk_fakes import FAST, OTHER_UUID, UUID, RecordingRunner

pytestmark = pytest.mark.skipif(shutil.which("cryptsetup") is None, reason="cryptsetup is missing (apt-get install cryptsetup-bin)")

KEY = bytes(range(32))
WRONG_KEY = bytes(range(1, 33))


def _dump(path: str) -> str:
    return subprocess.run(["cryptsetup", "luksDump", path], capture_output=True, text=True, check=True).stdout


def test_format_on_a_file_writes_constellations_header(image):
    crypt = Cryptsetup()
    assert not crypt.is_luks(image)
    crypt.format(image, KEY, UUID, integrity=False)  # Constellation's PBKDF (argon2id); integrity needs dm
    assert crypt.is_luks(image)
    assert crypt.luks_uuid(image) == UUID
    dump = _dump(image)
    assert "Version:       \t2" in dump
    assert "cipher: aes-xts-plain64" in dump and "sector: 4096 [bytes]" in dump
    assert "PBKDF:      argon2id" in dump and "Memory:     65536" in dump and "Time cost:  4" in dump


def test_the_right_key_passes_and_a_wrong_key_is_refused(image):
    crypt = Cryptsetup()
    crypt.format(image, KEY, UUID, integrity=False, params=FAST)
    assert crypt.check_key(image, KEY)
    assert not crypt.check_key(image, WRONG_KEY)


def test_a_missing_device_is_an_error_naming_it(tmp_path):
    missing = str(tmp_path / "absent.img")
    with pytest.raises(StateDiskError, match="absent.img"):
        Cryptsetup().is_luks(missing)


def test_the_key_never_appears_on_argv(image):
    runner = RecordingRunner(real=True)
    Cryptsetup(runner).format(image, KEY, UUID, integrity=False, params=FAST)
    Cryptsetup(runner).check_key(image, KEY)
    for argv, stdin in runner.calls:
        assert KEY.hex() not in " ".join(argv) and "--key-file" in argv and argv[argv.index("--key-file") + 1] == "-"
        assert stdin == KEY


def test_integrity_formats_with_hmac_sha256_and_the_xts_key_size():
    # cryptsetup 2.6 takes --key-size as the XTS key (512) and adds the HMAC's 256 bits itself (a 768-bit volume
    # key); --key-size 768 is refused ("Key size in XTS mode must be 256 or 512 bits"), seen in the node image.
    runner = RecordingRunner()
    Cryptsetup(runner).format("/dev/vdb", KEY, UUID, integrity=True)
    argv = runner.calls[0][0]
    assert argv[argv.index("--integrity") + 1] == "hmac-sha256" and argv[argv.index("--key-size") + 1] == "512"
    assert argv[argv.index("--pbkdf") + 1] == "argon2id" and argv[argv.index("--pbkdf-parallel") + 1] == "4"
    assert argv[argv.index("--uuid") + 1] == UUID and argv[-1] == "/dev/vdb"


# --------------------------------------------------------------------------- StateDisk on a file


def _disk(image, tmp_path, runner=None):
    return StateDisk(image, "test-state", str(tmp_path / "mnt"), runner=runner, integrity=False, params=FAST)


def test_first_activation_formats_with_the_disk_uuid(image, tmp_path):
    disk = _disk(image, tmp_path)
    assert disk.prepare(KEY, UUID.upper(), first=True) is True
    assert Cryptsetup().luks_uuid(image) == UUID
    assert disk.prepare(KEY, UUID, first=False) is False  # a second time: nothing formatted


def test_no_header_and_not_first_is_refused(image, tmp_path):
    with pytest.raises(StateDiskError, match="expected a LUKS2 header with UUID %s, found none" % UUID):
        _disk(image, tmp_path).prepare(KEY, UUID, first=False)
    assert not Cryptsetup().is_luks(image)


def test_a_header_with_another_uuid_is_refused_naming_both(image, tmp_path):
    Cryptsetup().format(image, KEY, OTHER_UUID, integrity=False, params=FAST)
    with pytest.raises(StateDiskError) as err:
        _disk(image, tmp_path).prepare(KEY, UUID, first=True)
    assert OTHER_UUID in str(err.value) and UUID in str(err.value) and image in str(err.value)


def test_a_wrong_key_is_refused(image, tmp_path):
    Cryptsetup().format(image, KEY, UUID, integrity=False, params=FAST)
    with pytest.raises(StateDiskError, match="the disk key does not open it"):
        _disk(image, tmp_path).prepare(WRONG_KEY, UUID, first=False)


def test_a_device_holding_a_file_system_is_never_formatted(image, tmp_path):
    if shutil.which("mkfs.ext4") is None:
        pytest.skip("mkfs.ext4 is missing (e2fsprogs)")
    subprocess.run(["mkfs.ext4", "-q", "-F", image], check=True)
    with pytest.raises(StateDiskError, match="found ext4 on it; refusing to overwrite it"):
        _disk(image, tmp_path).prepare(KEY, UUID, first=True)
    assert not Cryptsetup().is_luks(image)


def test_a_missing_device_is_refused_naming_it(tmp_path):
    with pytest.raises(StateDiskError, match="does not exist"):
        _disk(str(tmp_path / "nothing"), tmp_path).prepare(KEY, UUID, first=True)


# --------------------------------------------------------------------------- the dm paths, recorded


def test_unlock_formats_opens_makes_a_file_system_and_mounts(image, tmp_path):
    runner = RecordingRunner(real=True)
    disk = _disk(image, tmp_path, runner)
    assert disk.unlock(KEY, UUID, first=True) is True
    assert runner.programs() == ["cryptsetup isLuks", "blkid", "cryptsetup luksFormat", "cryptsetup luksUUID",
                                 "cryptsetup open", "cryptsetup status", "cryptsetup open", "mkfs.ext4", "mount"]
    open_argv, open_stdin = runner.calls[6]
    assert open_argv == ["cryptsetup", "open", "--type", "luks2", "--key-file", "-", image, "test-state"]
    assert open_stdin == KEY
    assert runner.calls[7][0] == ["mkfs.ext4", "-q", "-L", "constellation-state", "/dev/mapper/test-state"]
    assert runner.calls[8][0] == ["mount", "-t", "ext4", "-o", "nodev,nosuid,noexec", "/dev/mapper/test-state",
                                  str(tmp_path / "mnt")]


def test_unlock_at_boot_opens_and_mounts_without_mkfs_when_a_file_system_is_there(image, tmp_path):
    Cryptsetup().format(image, KEY, UUID, integrity=False, params=FAST)
    runner = RecordingRunner(real=True)
    runner.run = _with_blkid_found(runner.run)
    assert _disk(image, tmp_path, runner).unlock(KEY, UUID, first=False) is False
    assert "mkfs.ext4" not in runner.programs() and runner.programs()[-1] == "mount"
    assert "cryptsetup luksFormat" not in runner.programs()


def test_an_open_mapping_is_not_opened_again(image, tmp_path):
    Cryptsetup().format(image, KEY, UUID, integrity=False, params=FAST)
    runner = RecordingRunner(real=True, status_rc=0)
    runner.run = _with_blkid_found(runner.run)
    _disk(image, tmp_path, runner).unlock(KEY, UUID, first=False)
    assert [argv for argv, _stdin in runner.calls if argv[:2] == ["cryptsetup", "open"] and "--test-passphrase" not in argv] == []


def _with_blkid_found(run):
    def wrapped(argv, check=True, env=None, stdin=None, new_session=False, timeout=None):
        if argv[0] == "blkid" and argv[-1].startswith("/dev/mapper/"):
            return CommandResult(0, "ext4\n", "", tuple(argv))
        return run(argv, check=check, env=env, stdin=stdin, new_session=new_session, timeout=timeout)
    return wrapped


def test_lock_closes_an_open_mapping():
    runner = RecordingRunner(status_rc=0)
    StateDisk("/dev/vdb", "test-state", "/nonexistent/mnt", runner=runner).lock()
    assert runner.calls[-1][0] == ["cryptsetup", "close", "test-state"]


def test_status_before_open_says_not_encrypted_yet(tmp_path):
    status = StateDisk("/dev/vdb", "test-state", str(tmp_path / "mnt")).status()
    assert status["encrypted"] is False and status["open"] is False and status["device"] == "/dev/vdb"
    assert "not on an encrypted disk" in status["message"]


def test_dm_crypt_available_names_the_reason(tmp_path):
    ok, reason = dm_crypt_available(control=str(tmp_path / "control"))
    assert not ok and reason == "no device-mapper in this kernel: %s missing" % (tmp_path / "control")
    control = tmp_path / "control"
    control.write_text("")
    misc = tmp_path / "misc"
    misc.write_text(" 236 device-mapper\n")
    assert dm_crypt_available(str(control), str(misc), str(tmp_path / "none"))[0]
    misc.write_text(" 229 fuse\n")
    ok, reason = dm_crypt_available(str(control), str(misc), str(tmp_path / "none"))
    assert not ok and "names device-mapper" in reason


# --------------------------------------------------------------------------- for real, where dm-crypt exists


def test_open_and_mount_for_real_on_a_loop_device(image, tmp_path):
    usable, reason = dm_crypt_available()
    if not usable:
        pytest.skip(reason)
    if os.geteuid() != 0 or shutil.which("losetup") is None:
        pytest.skip("opening a loop device needs root and losetup")
    loop = subprocess.run(["losetup", "--find", "--show", image], capture_output=True, text=True, check=True).stdout.strip()
    disk = StateDisk(loop, "ct-test-%d" % os.getpid(), str(tmp_path / "mnt"), integrity=False, params=FAST)
    try:
        assert disk.unlock(KEY, UUID, first=True) is True
        assert os.path.ismount(str(tmp_path / "mnt")) and disk.status()["encrypted"] is True
        (tmp_path / "mnt" / "store.json").write_text("{}")
        disk.lock()
        assert not os.path.ismount(str(tmp_path / "mnt"))
        assert disk.unlock(KEY, UUID, first=False) is False
        assert (tmp_path / "mnt" / "store.json").read_text() == "{}"
    finally:
        disk.lock()
        subprocess.run(["losetup", "-d", loop], check=False)


def test_no_device_mapper_reason_constant():
    assert luks.NO_DM_REASON == "no device-mapper in this kernel: /dev/mapper/control missing"
