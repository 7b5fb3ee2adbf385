# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``python -m image build``: the steps from the cached root file system to disk.raw, the UKI, the command
line, the signed predicted measurements and the manifest (docs/image.md, "Build")."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from ansible_collections.constellation.cluster.plugins.module_utils import fileutil
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import signature

from image import assemble, contents, measure, rootfs
from image.paths import DEFAULT_OUT, EFI_STUB, OVMF_CODE, OVMF_VARS
from image.run import ImageError, run

IMAGE_ID = "constellation-node"
IMAGE_VERSION = "0.3.0"
# What the manifest says still varies between two builds with the same inputs.
STILL_VARIES = [
    "the package versions apt's mirror serves when the root file system cache is built (listed in packages)",
    "the EFI system partition's FAT directory times (mtools stamps its directories with the build time; not "
    "measured: the UKI, root file system and root hash are the same for the same inputs)",
]


@dataclass
class BuildOptions:
    out: Path = DEFAULT_OUT
    ek_ca: List[Path] = field(default_factory=list)
    signing_key: Optional[Path] = None
    measurements_pub_key: Optional[Path] = None
    policy: Optional[Path] = None
    deployment_mode: str = "image"
    debug: bool = False

    @property
    def set_name(self) -> str:
        return "%s-%s%s" % (IMAGE_ID, IMAGE_VERSION, "-debug" if self.debug else "")


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ImageError("%s: cannot read %s (%s)" % (what, path, err)) from None


def _read_bytes(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise ImageError("%s: cannot read %s (%s)" % (what, path, err.strerror)) from None


def _pub_pem(options: BuildOptions) -> str:
    if options.signing_key is not None:
        from cryptography.hazmat.primitives import serialization  # pylint: disable=import-outside-toplevel
        key = signature.load_private_key(_read_text(options.signing_key, "--signing-key").encode(), "--signing-key")
        return key.public_key().public_bytes(serialization.Encoding.PEM,
                                             serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    if options.measurements_pub_key is not None:
        pem = _read_text(options.measurements_pub_key, "--measurements-pub-key")
        signature.load_public_key(pem.encode(), "--measurements-pub-key")
        return pem
    raise ImageError("--signing-key or --measurements-pub-key: the measurements key the image pins is required")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(4 * 1024 * 1024), b""):
            digest.update(chunk)
    return digest.hexdigest()


def build(options: BuildOptions, log=print) -> Dict[str, Any]:
    """Builds the image into ``options.out``; returns the manifest."""
    if not options.ek_ca:
        raise ImageError("--ek-ca: the PEM file(s) of the CA(s) the TPMs' EK certificates chain to are required")
    ek_ca = "".join(_read_text(p, "--ek-ca") for p in options.ek_ca)
    if "-----BEGIN CERTIFICATE-----" not in ek_ca:
        raise ImageError("--ek-ca: expected PEM certificates")
    pub_pem = _pub_pem(options)
    if options.policy is None:
        raise ImageError("--policy: the signed measurements document (FILE and FILE.sig) the image's agent checks its "
                         "peers with is required (the image's own set cannot be in it: it depends on the image)")
    policy = signature.read_signed_file(str(options.policy), signature.load_public_key(pub_pem.encode(), "--policy"),
                                        "--policy")
    policy_sig = _read_bytes(Path(signature.signature_path(str(options.policy))), "--policy's signature")
    times: Dict[str, float] = {}
    started = time.monotonic()
    tar, built, seconds = rootfs.ensure()
    times["rootfs_seconds"] = round(seconds, 1)
    log("root file system: %s (%s)" % (tar, "built in %.0f s" % seconds if built else "cached"))

    options.out.mkdir(parents=True, exist_ok=True)
    work = options.out / ".work"
    step = time.monotonic()
    root = work / "root"
    rootfs.unpack(tar, root)
    kver = rootfs.kernel_version(root)
    packages = rootfs.package_versions(root)
    linux, initrd = work / "vmlinuz", work / "initrd.img"
    shutil.copyfile(root / ("boot/vmlinuz-" + kver), linux)
    shutil.copyfile(root / rootfs.INITRD, initrd)
    for item in os.listdir(root / "boot"):  # the kernel and initrd live in the UKI
        path = root / "boot" / item
        if path.is_file() or path.is_symlink():
            path.unlink()
    code_files = contents.install_agent(root)
    config = contents.install_config(root, ek_ca, pub_pem, options.deployment_mode, policy, policy_sig)
    contents.install_system(root, options.debug)
    times["contents_seconds"] = round(time.monotonic() - step, 1)

    step = time.monotonic()
    root_img, verity_img = work / "root.img", work / "root.verity"
    assemble.make_root_fs(root, root_img)
    verity = assemble.make_verity(root_img, verity_img)
    cmdline = assemble.command_line(verity, options.debug)
    osrel = assemble.os_release(root, IMAGE_ID, IMAGE_VERSION + ("-debug" if options.debug else ""))
    uki_tmp = work / "uki.efi"
    sections = assemble.make_uki(uki_tmp, linux, initrd, cmdline, osrel, work)
    esp = work / "esp.img"
    assemble.make_esp(uki_tmp, esp)
    disk_tmp = work / "disk.raw"
    layout = assemble.make_disk(disk_tmp, esp, root_img, verity_img, verity)
    times["assembly_seconds"] = round(time.monotonic() - step, 1)

    step = time.monotonic()
    measured = measure.predict(uki_tmp, options.set_name)
    times["prediction_seconds"] = round(time.monotonic() - step, 1)

    # The outputs, each replaced atomically (a failed build above left the previous ones intact).
    os.replace(disk_tmp, options.out / "disk.raw")
    os.replace(uki_tmp, options.out / "uki.efi")
    fileutil.atomic_write(str(options.out / "cmdline"), (cmdline + "\n").encode(), 0o644)
    measure.write(measured["document"], options.out / "measurements.json", options.signing_key)
    fileutil.atomic_write(str(options.out / "prediction.json"),
                          (json.dumps(measured["detail"], indent=2) + "\n").encode(), 0o644)
    times["total_seconds"] = round(time.monotonic() - started, 1)
    manifest = {
        "image": IMAGE_ID, "version": IMAGE_VERSION, "set_name": options.set_name, "debug": options.debug,
        "debug_note": "a serial console root login: measures differently from the release image" if options.debug
        else "", "deployment_mode": options.deployment_mode,
        "root_hash": verity.root_hash, "verity_salt": assemble.VERITY_SALT, "verity_uuid": assemble.VERITY_UUID,
        "root_fs_uuid": assemble.ROOT_FS_UUID, "partitions": layout, "cmdline": cmdline,
        "uki_sections": {name: hex(addr) for name, addr in sections}, "kernel": kver,
        "sizes": {"disk": (options.out / "disk.raw").stat().st_size, "uki": (options.out / "uki.efi").stat().st_size,
                  "root": verity.data_size, "verity": verity.hash_size},
        "sha256": {"uki.efi": _sha256(options.out / "uki.efi"), "disk.raw": _sha256(options.out / "disk.raw")},
        "agent_config": config, "agent_files": len(code_files),
        "rootfs": {"tarball": tar.name, "key": rootfs.cache_key(), "inputs": rootfs.inputs(), "cached": not built},
        "pinned": {"efi_stub": str(EFI_STUB), "efi_stub_package": _package_of(EFI_STUB),
                   "ovmf": [str(OVMF_CODE), str(OVMF_VARS)], "ovmf_package": _package_of(OVMF_CODE)},
        "pcrs": measured["pcrs"], "measurements_signed": options.signing_key is not None,
        "firmware_profile": measured["prediction"].firmware.name, "stub": measured["prediction"].stub,
        "packages": packages, "times": times, "still_varies": STILL_VARIES,
    }
    fileutil.atomic_write(str(options.out / "manifest.json"),
                          (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode(), 0o644)
    shutil.rmtree(work, ignore_errors=True)
    return manifest


def _package_of(path: Path) -> str:
    """The Debian package (and version) that owns ``path`` on the build host."""
    try:
        owner = run(["dpkg-query", "-S", str(path)], "find the package of %s" % path).split(":", 1)[0]
        version = run(["dpkg-query", "-W", "-f", "${Version}", owner], "package version").strip()
        return "%s %s" % (owner, version)
    except ImageError:
        return "unknown"
