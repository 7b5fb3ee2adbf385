# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node image's assembly with the real tools on a small root folder (docs/image.md, "Build"): the same folder
gives the same ext4 image and root hash, the partitions are named by the root hash's halves, the UKI holds its
sections in order, the baked configuration and the per-node settings disk are what the agent reads. The full
build and boot: tests/integration/test_image_boot.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import AgentConfig, read_node_settings
from image import assemble, contents, rootfs
from image.boot import write_node_settings
from image.paths import EFI_STUB
from image.run import ImageError

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("mkfs.ext4", "veritysetup", "objcopy", "mkfs.vfat", "mcopy", "sfdisk")
needs_tools = pytest.mark.skipif(any(shutil.which(t) is None for t in TOOLS) or not EFI_STUB.exists(),
                                 reason="the image tools (scripts/setup.sh) are not installed")


def _tree(path: Path) -> Path:
    (path / "etc").mkdir(parents=True)
    (path / "etc/hostname").write_text("node\n")
    (path / "usr/bin").mkdir(parents=True)
    (path / "usr/bin/tool").write_bytes(os.urandom(0) + b"#!/bin/sh\necho hi\n" * 500)
    os.chmod(path / "usr/bin/tool", 0o755)
    assemble.normalize_times(path)
    return path


@needs_tools
def test_the_same_folder_gives_the_same_root_hash_and_one_byte_another(tmp_path):
    tree = _tree(tmp_path / "root")
    hashes = []
    for name in ("a", "b"):
        img = tmp_path / ("%s.img" % name)
        assemble.make_root_fs(tree, img)
        hashes.append(assemble.make_verity(img, tmp_path / ("%s.verity" % name)).root_hash)
    assert hashes[0] == hashes[1] and len(hashes[0]) == 64
    assert (tmp_path / "a.img").read_bytes() == (tmp_path / "b.img").read_bytes()
    (tree / "etc/hostname").write_text("nodf\n")
    assemble.normalize_times(tree)
    assemble.make_root_fs(tree, tmp_path / "c.img")
    assert assemble.make_verity(tmp_path / "c.img", tmp_path / "c.verity").root_hash != hashes[0]


@needs_tools
def test_uki_esp_and_gpt_carry_the_root_hash(tmp_path):
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation import image_prediction
    tree = _tree(tmp_path / "root")
    assemble.make_root_fs(tree, tmp_path / "root.img")
    verity = assemble.make_verity(tmp_path / "root.img", tmp_path / "root.verity")
    cmdline = assemble.command_line(verity)
    assert "roothash=%s" % verity.root_hash in cmdline and "root=/dev/mapper/root" in cmdline
    assert verity.data_partuuid.replace("-", "") == verity.root_hash[:32]
    assert verity.hash_partuuid.replace("-", "") == verity.root_hash[32:]
    work = tmp_path / "uki"
    work.mkdir()
    (work / "linux").write_bytes(b"kernel" * 1000)
    (work / "initrd").write_bytes(b"initrd" * 3000)
    placed = assemble.make_uki(work / "uki.efi", work / "linux", work / "initrd", cmdline, "ID=debian\n", work)
    assert [name for name, _address in placed] == [".osrel", ".cmdline", ".initrd", ".linux"]
    assert all(b > a for (_name_a, a), (_name_b, b) in zip(placed, placed[1:]))
    sections = image_prediction.uki_sections((work / "uki.efi").read_bytes())
    assert sections[".cmdline"] == cmdline.encode() and sections[".linux"] == b"kernel" * 1000
    assemble.make_esp(work / "uki.efi", tmp_path / "esp.img")
    listing = subprocess.run(["mdir", "-i", str(tmp_path / "esp.img"), "-b", "::/EFI/BOOT"], capture_output=True,
                             text=True, check=True).stdout
    assert "BOOTX64.EFI" in listing
    layout = assemble.make_disk(tmp_path / "disk.raw", tmp_path / "esp.img", tmp_path / "root.img",
                                tmp_path / "root.verity", verity)
    table = json.loads(subprocess.run(["sfdisk", "--json", str(tmp_path / "disk.raw")], capture_output=True,
                                      text=True, check=True).stdout)["partitiontable"]
    parts = {p["name"]: p for p in table["partitions"]}
    assert parts["root"]["uuid"].lower() == verity.data_partuuid
    assert parts["root-verity"]["uuid"].lower() == verity.hash_partuuid
    assert parts["root"]["type"].upper() == assemble.TYPE_ROOT_X86_64
    with open(tmp_path / "disk.raw", "rb") as disk:
        disk.seek(layout["root"]["offset"])
        assert disk.read(4096) == (tmp_path / "root.img").read_bytes()[:4096]


def test_baked_config_is_one_the_agent_loads_with_per_node_settings(tmp_path):
    root = tmp_path / "root"
    config = contents.install_config(root, "PEM", "PUB", "image", b"{}", b"sig")
    assert config["deployment_mode"] == "image" and config["variant"] == "qemu-vtpm-ek"
    assert config["node_settings"] == "/dev/disk/by-id/virtio-constellation-node"
    assert config["state_disk_device"] == "/dev/disk/by-id/virtio-constellation-state"
    assert json.loads((root / "etc/constellation/agent.json").read_text()) == config
    settings = write_node_settings(tmp_path / "node.raw", {"public_ip": "10.0.2.15", "init_secret_hash": "ab" * 32})
    assert settings.stat().st_size % 4096 == 0
    assert read_node_settings(str(settings)) == {"public_ip": "10.0.2.15", "init_secret_hash": "ab" * 32}
    merged = dict(config, **read_node_settings(str(settings)))
    loaded = AgentConfig.from_mapping(merged)
    assert loaded.public_ip == "10.0.2.15" and loaded.deployment_mode == "image"
    with pytest.raises(ImageError, match="at most"):
        write_node_settings(tmp_path / "big.raw", {"public_endpoint": "x" * 70000})


def test_root_file_system_holds_every_package_the_agent_needs():
    defaults = yaml.safe_load((ROOT / "roles/node_agent/defaults/main.yml").read_text())
    needed = set()
    for name in ("node_agent_packages", "node_agent_etcd_packages", "node_agent_kubernetes_packages",
                 "node_agent_state_disk_packages"):
        needed.update(defaults[name])
    assert needed <= set(rootfs.PACKAGES), sorted(needed - set(rootfs.PACKAGES))


def test_cache_key_follows_the_inputs(monkeypatch):
    key = rootfs.cache_key()
    assert rootfs.cache_key() == key and rootfs.tarball().name.startswith("rootfs-" + key[:16])
    monkeypatch.setattr(rootfs, "PACKAGES", rootfs.PACKAGES + ("less",))
    assert rootfs.cache_key() != key


@needs_tools
def test_uki_stamp_is_fixed_and_its_checksum_recomputed(tmp_path):
    import struct
    stub = EFI_STUB.read_bytes()
    pe = struct.unpack("<I", stub[0x3C:0x40])[0]
    zeroed = bytearray(stub)
    zeroed[pe + 88:pe + 92] = bytes(4)
    assert assemble._pe_checksum(bytes(zeroed)) == struct.unpack("<I", stub[pe + 88:pe + 92])[0]  # the linker's
    (tmp_path / "linux").write_bytes(b"k" * 999)
    (tmp_path / "initrd").write_bytes(b"i" * 999)
    ukis = []
    for name in ("a", "b"):
        work = tmp_path / name
        work.mkdir()
        assemble.make_uki(work / "uki.efi", tmp_path / "linux", tmp_path / "initrd", "ro", "ID=x\n", work)
        ukis.append((work / "uki.efi").read_bytes())
    assert ukis[0] == ukis[1]
    pe = struct.unpack("<I", ukis[0][0x3C:0x40])[0]
    assert struct.unpack("<I", ukis[0][pe + 8:pe + 12])[0] == assemble.EPOCH
