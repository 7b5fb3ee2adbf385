# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where the image build keeps its cache and output, and the host files it pins (firmware, boot stub)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("CONSTELLATION_IMAGE_CACHE", "/var/cache/constellation-image"))
ROOTFS_CACHE = CACHE / "rootfs"
DEFAULT_OUT = CACHE / "out"
# Debian 12's systemd-boot-efi: the UKI's stub (its code is measured into PCR 4 with the UKI).
EFI_STUB = Path("/usr/lib/systemd/boot/efi/linuxx64.efi.stub")
SYSTEMD_MEASURE = Path("/usr/lib/systemd/systemd-measure")
# Debian 12's ovmf (2022.11): PCRs 0-2 and 7 depend on it.
OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")
# The serials QEMU gives the two extra disks: the guest sees /dev/disk/by-id/virtio-<serial>.
NODE_SETTINGS_SERIAL = "constellation-node"
STATE_DISK_SERIAL = "constellation-state"
