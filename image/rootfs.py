# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The image's root file system before the agent goes in: Debian 12 (bookworm) from apt's configured mirror by
mmdebstrap, with the kernel and an initrd made by dracut inside it. It is cached as a tarball named after the
SHA-256 of everything that goes into it (suite, packages, dracut configuration, hooks): a second build with the
same inputs unpacks the tarball instead of downloading again."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

from image.paths import ROOTFS_CACHE
from image.run import ImageError, run

SUITE = "bookworm"
VARIANT = "minbase"
# Boot, the verity root and the TPM; the agent's own Debian packages (roles/node_agent/defaults/main.yml
# node_agent_packages, the etcd and Kubernetes clients, the state disk's tools).
PACKAGES = (
    "systemd", "systemd-sysv", "udev", "kmod", "tpm2-tools", "libtss2-tcti-device0", "cryptsetup-bin", "dmsetup",
    "linux-image-amd64", "dracut", "zstd", "e2fsprogs", "iproute2",
    "python3", "python3-cryptography", "python3-yaml", "python3-tpm2-pytss", "python3-grpcio", "python3-protobuf",
    "python3-kubernetes", "python3-etcd3gw", "wireguard-tools",
)
# The debug variant's extra package: nothing; its console login uses util-linux's agetty and login (in minbase).
INITRD = "boot/initrd.constellation.img"
DRACUT_CONF = """\
# The node image's initrd: generic (not host-only), with dm-verity for the root file system, the boot
# phases measured into PCR 11, dm-crypt/dm-integrity for the state disk and the TPM driver.
hostonly="no"
compress="zstd"
add_dracutmodules+=" systemd systemd-veritysetup systemd-pcrphase dm crypt "
omit_dracutmodules+=" plymouth "
add_drivers+=" virtio_blk virtio_pci virtio_scsi ext4 dm_verity dm_crypt dm_integrity tpm_crb tpm_tis "
"""
HOOKS = (
    'mkdir -p "$1/etc/dracut.conf.d" && cp "%(dracut_conf)s" "$1/etc/dracut.conf.d/10-constellation.conf"',
    'kver=$(ls "$1/lib/modules" | head -1); chroot "$1" dracut --force --no-hostonly --kver "$kver" /' + INITRD,
)


def inputs() -> Dict[str, object]:
    """Everything the root file system is made from (its cache key is their SHA-256)."""
    return {"suite": SUITE, "variant": VARIANT, "packages": list(PACKAGES), "dracut_conf": DRACUT_CONF,
            "hooks": list(HOOKS)}


def cache_key() -> str:
    return hashlib.sha256(json.dumps(inputs(), sort_keys=True).encode()).hexdigest()


def tarball() -> Path:
    return ROOTFS_CACHE / ("rootfs-%s.tar" % cache_key()[:16])


def ensure() -> Tuple[Path, bool, float]:
    """The cached root file system tarball, built first when missing: (path, built now, seconds)."""
    path = tarball()
    if path.exists():
        return path, False, 0.0
    ROOTFS_CACHE.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(dir=str(ROOTFS_CACHE), prefix=".build-") as tmp:
        conf = Path(tmp) / "dracut.conf"
        conf.write_text(DRACUT_CONF, encoding="utf-8")
        partial = Path(tmp) / "rootfs.tar"
        argv: List[str] = ["mmdebstrap", "--variant=" + VARIANT, "--include=" + ",".join(PACKAGES)]
        for hook in HOOKS:
            argv.append("--customize-hook=" + hook % {"dracut_conf": conf})
        argv += [SUITE, str(partial)]
        run(argv, "root file system (mmdebstrap)", timeout=3600)
        os.replace(partial, path)  # atomic: a failed build leaves no tarball
    return path, True, time.monotonic() - start


def unpack(path: Path, dest: Path) -> None:
    """Unpacks the cached tarball into the empty folder ``dest`` (owners and modes kept)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    run(["tar", "--numeric-owner", "--xattrs", "-xpf", str(path), "-C", str(dest)], "unpack the root file system")


def package_versions(root: Path) -> Dict[str, str]:
    """Every installed package and its version (for the manifest)."""
    out = run(["dpkg-query", "--admindir", str(root / "var/lib/dpkg"), "-W", "-f", "${Package}\t${Version}\n"],
              "list the packages")
    return dict(line.split("\t", 1) for line in out.splitlines() if "\t" in line)


def kernel_version(root: Path) -> str:
    versions = sorted(os.listdir(root / "lib/modules"))
    if len(versions) != 1:
        raise ImageError("root file system: expected one kernel in /lib/modules, found %s" % versions)
    return versions[0]
