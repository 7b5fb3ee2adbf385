# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""From a finished root folder to a bootable disk, without loop devices or mounts: an ext4 image of the folder
(fixed UUID, hash seed and times), its dm-verity hash tree (fixed salt and UUID), the UKI (systemd-stub with
the kernel, the initrd, os-release and a command line that carries the root hash, joined by objcopy), an EFI
system partition (mkfs.vfat + mtools) and a GPT disk (sfdisk on a file, dd). The same inputs give the same root
hash, so the same predicted PCRs."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

from image.paths import EFI_STUB
from image.run import ImageError, run

# Fixed values that keep the build reproducible (docs/image.md, "Reproducible").
EPOCH = int(os.environ.get("SOURCE_DATE_EPOCH", "1700000000"))
ROOT_FS_UUID = "6e0c2a2c-39a0-4f64-9a8f-2b5c0d6ad0c1"
VERITY_UUID = "0c7c9f46-60a2-4f0b-8f43-8a4c0ad07e5d"
VERITY_SALT = "636f6e7374656c6c6174696f6e2d6e6f64652d696d6167652d7665726974792e"  # "constellation-node-image-verity."
DISK_GUID = "a3a1c1f8-5b9e-4a57-9bb0-3d0b6c6b1a11"
ESP_UUID = "b9d6a7c4-2f1e-4c4b-8a6d-6a3a9d2c0e21"
ESP_VOLUME_ID = "C0DE1001"
# GPT partition types (the Discoverable Partitions Specification).
TYPE_ESP = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
TYPE_ROOT_X86_64 = "4F68BCE3-E8CD-4C1C-97E9-8A409F7A2D54"
TYPE_ROOT_VERITY_X86_64 = "2C7357ED-EBD2-46D9-AEC1-23D437EC2BF5"
MIB = 1024 * 1024
SECTOR = 512
ESP_MIB_MARGIN = 8
ESP_MIN_BYTES = 48 * 1024 * 1024  # FAT32 needs 65525 clusters or more


@dataclass
class Verity:
    root_hash: str
    data_size: int
    hash_size: int

    @property
    def data_partuuid(self) -> str:
        """The root partition's UUID: the root hash's first 128 bits (as systemd's tools choose it)."""
        return str(uuid.UUID(self.root_hash[:32]))

    @property
    def hash_partuuid(self) -> str:
        """The verity partition's UUID: the root hash's last 128 bits."""
        return str(uuid.UUID(self.root_hash[32:64]))


def _fixed_env() -> Dict[str, str]:
    return {"E2FSPROGS_FAKE_TIME": str(EPOCH), "SOURCE_DATE_EPOCH": str(EPOCH)}


def normalize_times(root: Path) -> None:
    """Every file's times set to EPOCH (mkfs.ext4 -d copies them)."""
    run(["find", str(root), "-exec", "touch", "-h", "-d", "@%d" % EPOCH, "{}", "+"], "fix file times")


def _round_up(value: int, unit: int) -> int:
    return (value + unit - 1) // unit * unit


def make_root_fs(root: Path, out: Path) -> int:
    """An ext4 image of ``root`` (no journal: it is never written), sized to its content plus room for metadata."""
    used = int(run(["du", "-s", "--block-size=1", "--apparent-size", str(root)], "measure the root file system")
               .split()[0])
    size = _round_up(int(used * 1.25) + 96 * MIB, 4 * MIB)
    if out.exists():
        out.unlink()
    # The times again right before mkfs.ext4 copies them: reading the folder may have moved access times since.
    # 128-byte inodes: no creation time, which mkfs.ext4 1.47.0 stamps with the clock (not E2FSPROGS_FAKE_TIME),
    # so two builds of one folder give one image. Their times end in 2038: the root is read-only, its times fixed.
    normalize_times(root)
    run(["mkfs.ext4", "-q", "-F", "-d", str(root), "-L", "root", "-U", ROOT_FS_UUID, "-b", "4096", "-m", "0",
         "-I", "128",
         "-O", "^has_journal", "-E", "hash_seed=%s,lazy_itable_init=0,nodiscard" % ROOT_FS_UUID,
         str(out), str(size // 1024) + "k"], "make the root file system (mkfs.ext4)", env=_fixed_env())
    _fix_change_times(out, out.parent)
    return size


def _used_inodes(image: Path) -> List[int]:
    """The inode numbers in use in the ext4 ``image`` (each group's range minus dumpe2fs's free ranges)."""
    out = run(["dumpe2fs", str(image)], "read the root file system's groups (dumpe2fs)")
    per_group = int(re.search(r"^Inodes per group:\s*(\d+)", out, re.M).group(1))
    used: List[int] = []
    for number, body in re.findall(r"^Group (\d+):(.*?)(?=^Group \d+:|\Z)", out, re.M | re.S):
        first = int(number) * per_group + 1
        free = set()
        match = re.search(r"^\s*Free inodes: ?(.*)$", body, re.M)
        for part in (match.group(1).split(",") if match else []):
            part = part.strip()
            if part:
                low, _dash, high = part.partition("-")
                free.update(range(int(low), int(high or low) + 1))
        used.extend(i for i in range(first, first + per_group) if i not in free)
    return used


def _fix_change_times(image: Path, work: Path) -> None:
    """Every used inode's change time set to EPOCH: mkfs.ext4 -d copies each file's ctime, which is the time the
    build touched it (debugfs, one command file)."""
    commands = work / "ctimes.debugfs"
    commands.write_text("".join("sif <%d> ctime @%d\n" % (i, EPOCH) for i in _used_inodes(image)), encoding="ascii")
    run(["debugfs", "-w", "-f", str(commands), str(image)], "fix the change times (debugfs)", env=_fixed_env())
    commands.unlink()


def make_verity(data: Path, hash_tree: Path) -> Verity:
    """dm-verity's hash tree of ``data`` (fixed salt and UUID); returns the root hash and sizes."""
    if hash_tree.exists():
        hash_tree.unlink()
    out = run(["veritysetup", "format", "--salt=" + VERITY_SALT, "--uuid=" + VERITY_UUID,
               "--data-block-size=4096", "--hash-block-size=4096", str(data), str(hash_tree)],
              "dm-verity hash tree (veritysetup format)")
    match = re.search(r"^Root hash:\s*([0-9a-f]{64})\s*$", out, re.M)
    if not match:
        raise ImageError("veritysetup format printed no root hash:\n%s" % out)
    return Verity(match.group(1), data.stat().st_size, hash_tree.stat().st_size)


def command_line(verity: Verity, debug: bool = False) -> str:
    """The kernel command line: systemd-veritysetup opens the root by the partitions' UUIDs and the root hash."""
    args = ["root=/dev/mapper/root", "ro", "roothash=" + verity.root_hash,
            "systemd.verity_root_data=PARTUUID=" + verity.data_partuuid,
            "systemd.verity_root_hash=PARTUUID=" + verity.hash_partuuid,
            "console=ttyS0,115200", "panic=30", "systemd.gpt_auto=0"]
    if debug:
        args.append("systemd.log_level=debug")
    return " ".join(args)


def os_release(root: Path, image_id: str, image_version: str) -> str:
    text = (root / "usr/lib/os-release").read_text(encoding="utf-8")
    return text.rstrip("\n") + '\nIMAGE_ID="%s"\nIMAGE_VERSION="%s"\n' % (image_id, image_version)


def _section_end(stub: Path) -> int:
    out = run(["objdump", "-h", str(stub)], "read the boot stub's sections")
    end = 0
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0].isdigit():
            end = max(end, int(parts[3], 16) + int(parts[2], 16))
    if not end:
        raise ImageError("no sections found in %s" % stub)
    return end


def make_uki(out: Path, linux: Path, initrd: Path, cmdline: str, osrel: str, work: Path) -> List[Tuple[str, int]]:
    """systemd-stub + .osrel, .cmdline, .initrd, .linux (in that order, the kernel last, each 4 KiB aligned,
    after the stub's own sections). Returns the sections and their addresses."""
    if not EFI_STUB.exists():
        raise ImageError("%s is missing: install systemd-boot-efi (scripts/setup.sh)" % EFI_STUB)
    (work / "osrel").write_text(osrel, encoding="utf-8")
    (work / "cmdline").write_text(cmdline, encoding="utf-8")
    sections = [(".osrel", work / "osrel"), (".cmdline", work / "cmdline"), (".initrd", initrd), (".linux", linux)]
    address = _round_up(_section_end(EFI_STUB), 0x10000)
    argv = ["objcopy"]
    placed = []
    for name, path in sections:
        argv += ["--add-section", "%s=%s" % (name, path), "--change-section-vma", "%s=0x%x" % (name, address)]
        placed.append((name, address))
        address = _round_up(address + path.stat().st_size, 0x10000)
    if out.exists():
        out.unlink()
    run(argv + [str(EFI_STUB), str(out)], "unified kernel image (objcopy)")
    _fix_pe_timestamp(out)
    return placed


def _fix_pe_timestamp(path: Path) -> None:
    """objcopy stamps the PE/COFF header's TimeDateStamp with the clock (binutils 2.40 has no option for it, nor
    does it read SOURCE_DATE_EPOCH there): set to EPOCH, so the same inputs give the same UKI and PCR 4."""
    with open(path, "r+b") as handle:
        handle.seek(0x3C)  # e_lfanew: where the "PE\0\0" signature is
        pe_offset = struct.unpack("<I", handle.read(4))[0]
        handle.seek(pe_offset)
        if handle.read(4) != b"PE\0\0":
            raise ImageError("%s: no PE signature where e_lfanew points" % path)
        handle.seek(pe_offset + 8)  # signature (4), Machine (2), NumberOfSections (2), then TimeDateStamp
        handle.write(struct.pack("<I", EPOCH))
        # The optional header's CheckSum (outside the Authenticode digest) was computed over the old stamp.
        checksum_at = pe_offset + 24 + 64
        handle.seek(0)
        data = bytearray(handle.read())
        data[checksum_at:checksum_at + 4] = bytes(4)
        handle.seek(checksum_at)
        handle.write(struct.pack("<I", _pe_checksum(bytes(data))))


def _pe_checksum(data: bytes) -> int:
    """The PE/COFF image checksum (the 16-bit one's-complement sum of the file, with its CheckSum field zero, plus
    the file's length), as the loaders that check it compute it."""
    length = len(data)
    if length % 2:
        data += b"\0"
    total = 0
    for (word,) in struct.iter_unpack("<H", data):
        total += word
        total = (total & 0xFFFF) + (total >> 16)
    return ((total & 0xFFFF) + (total >> 16) + length) & 0xFFFFFFFF


def make_esp(uki: Path, out: Path) -> int:
    """A FAT EFI system partition holding the UKI as the removable-media boot file /EFI/BOOT/BOOTX64.EFI."""
    size = max(_round_up(uki.stat().st_size + ESP_MIB_MARGIN * MIB, MIB), ESP_MIN_BYTES)
    if out.exists():
        out.unlink()
    env = _fixed_env()
    run(["mkfs.vfat", "-C", "-F", "32", "-i", ESP_VOLUME_ID, "-n", "ESP", str(out), str(size // 1024)],
        "EFI system partition (mkfs.vfat)", env=env)
    run(["mmd", "-i", str(out), "::/EFI", "::/EFI/BOOT"], "EFI system partition (mmd)", env=env)
    os.utime(uki, (EPOCH, EPOCH))
    run(["mcopy", "-m", "-i", str(out), str(uki), "::/EFI/BOOT/BOOTX64.EFI"], "EFI system partition (mcopy)", env=env)
    return size


def make_disk(out: Path, esp: Path, root: Path, verity_img: Path, verity: Verity) -> Dict[str, Dict[str, int]]:
    """A GPT disk with the ESP, the root and its verity partition (each at a MiB boundary)."""
    parts = [("esp", esp, TYPE_ESP, ESP_UUID), ("root", root, TYPE_ROOT_X86_64, verity.data_partuuid),
             ("root-verity", verity_img, TYPE_ROOT_VERITY_X86_64, verity.hash_partuuid)]
    offset = MIB
    layout: Dict[str, Dict[str, int]] = {}
    script = ["label: gpt", "label-id: " + DISK_GUID, "unit: sectors", "first-lba: 2048"]
    for name, path, ptype, puuid in parts:
        size = _round_up(path.stat().st_size, MIB)
        layout[name] = {"offset": offset, "size": size}
        script.append("start=%d, size=%d, type=%s, uuid=%s, name=\"%s\""
                      % (offset // SECTOR, size // SECTOR, ptype, puuid, name))
        offset += size
    total = offset + MIB  # the backup GPT
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        tmp.unlink()
    with open(tmp, "wb") as handle:
        handle.truncate(total)
    proc = subprocess.run(["sfdisk", "--no-reread", "--no-tell-kernel", "-q", str(tmp)],
                          input="\n".join(script) + "\n", capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ImageError("GPT (sfdisk) exited %d: %s" % (proc.returncode, proc.stderr.strip()))
    with open(tmp, "r+b") as disk:
        for name, path, _ptype, _puuid in parts:
            disk.seek(layout[name]["offset"])
            with open(path, "rb") as source:
                shutil.copyfileobj(source, disk, 4 * MIB)
    os.replace(tmp, out)
    return layout
