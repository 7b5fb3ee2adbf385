# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Real UKIs for the image prediction's tests, built as the image build makes them: objcopy adds the sections to
Debian's systemd-stub. ``skip_without_stub``: the tests' marks when binutils or systemd-boot-efi is absent."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

STUB = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub"
KERNEL_PE = "/usr/lib/systemd/boot/efi/systemd-bootx64.efi"  # a second real PE, standing in for a kernel
CMDLINE = "console=ttyS0 roothash=%s root=/dev/mapper/root" % ("ab" * 32)
OSREL = b'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n'
INITRD = b"initrd" * 20000

skip_without_stub = [
    pytest.mark.skipif(not shutil.which("objcopy"), reason="objcopy (binutils) is not installed"),
    pytest.mark.skipif(not os.path.exists(STUB), reason="systemd-boot-efi's stub %s is absent" % STUB),
]


def kernel() -> bytes:
    with open(KERNEL_PE if os.path.exists(KERNEL_PE) else STUB, "rb") as handle:
        return handle.read()


def build_uki(directory, name="uki.efi", cmdline=CMDLINE.encode("ascii"), initrd=INITRD, linux=None, osrel=OSREL,
              drop=()) -> str:
    """A UKI in ``directory`` (a pathlib.Path): the stub plus .osrel, .cmdline, .linux, .initrd (less ``drop``)."""
    parts = {".osrel": (osrel, 0x20000), ".cmdline": (cmdline, 0x30000),
             ".linux": (linux if linux is not None else kernel(), 0x2000000), ".initrd": (initrd, 0x3000000)}
    argv = ["objcopy"]
    for section, (content, vma) in parts.items():
        if section in drop:
            continue
        path = directory / ("part" + section)
        path.write_bytes(content)
        argv += ["--add-section", "%s=%s" % (section, path), "--change-section-vma", "%s=0x%x" % (section, vma)]
    out = directory / name
    subprocess.run(argv + [STUB, str(out)], check=True, capture_output=True)
    return str(out)
