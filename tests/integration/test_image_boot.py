# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node image booted for real (docs/image.md): ``python -m image build`` (cached root file system), QEMU TCG
+ OVMF + swtpm whose EK certificate is from the lab CA, the agent's port forwarded. The genuine image attests
against its predicted, signed measurements with the default variant and activates as a Coordinator; a copy with
one root byte flipped never serves (dm-verity); a copy with a changed command line is refused, naming PCR 9/11.
One QEMU at a time (image/boot.py takes /tmp/qemu-image.lock), every wait with a hard timeout."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.image, pytest.mark.slow]

for _tool in ("qemu-system-x86_64", "mmdebstrap", "veritysetup", "swtpm", "objcopy", "mkfs.vfat", "sfdisk"):
    if not shutil.which(_tool):  # pragma: no cover - scripts/setup.sh installs them
        pytest.skip("%s is not installed" % _tool, allow_module_level=True)
if os.geteuid() != 0:  # pragma: no cover - the test machine runs as root
    pytest.skip("the image build needs root (mmdebstrap, file owners)", allow_module_level=True)

from image import assemble  # noqa: E402
from image.boot import Guest, write_node_settings  # noqa: E402
from image.build import BuildOptions, build  # noqa: E402
from image.paths import CACHE  # noqa: E402
from lab.image import lab_measurements  # noqa: E402
from lab.swtpm import SwTPM, free_port  # noqa: E402
from lab.trust import LabTrust  # noqa: E402
from tests.support.playbook import run_tasks  # noqa: E402

GUEST_IP = "10.0.2.15"  # QEMU's user network gives the guest this address
AGENT_TIMEOUT = 420.0  # TCG boots in 60-95 s on an idle machine; the machine is shared
PYTHON = str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "python")


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    """The trust material (a lab CA, a measurements key, an init secret) and the image built with it."""
    base = CACHE / "test"  # kept between runs: the same trust gives the same image and root hash
    trust = LabTrust(base / "trust")
    if not (trust.ca_dir / "issuercert.pem").exists():
        trust.ca_dir.mkdir(parents=True, exist_ok=True)
        seed = SwTPM(str(tmp_path_factory.mktemp("seed-tpm")), free_port(), ek_cert=True, ca_dir=str(trust.ca_dir))
        seed.start().stop()  # manufacturing the first TPM makes the CA
    trust.write_ek_ca()
    trust.measurements_key()
    policy = base / "peers.json"  # the policy the image's agent checks its peers with (signed)
    policy.write_text(json.dumps(lab_measurements(), indent=2))
    trust.sign_measurements(policy)
    out = base / "out"
    manifest = build(BuildOptions(out=out, ek_ca=[trust.ek_ca_path], signing_key=trust.measurements_key_path,
                                  policy=policy), log=lambda *_: None)
    return {"trust": trust, "out": out, "manifest": manifest}


def settings(image, tmp_path):
    trust = image["trust"]
    return write_node_settings(tmp_path / "node.raw", {"public_ip": GUEST_IP,
                                                       "init_secret_hash": trust.init_secret_hash(GUEST_IP)})


def play(image, tmp_path, tasks):
    trust = image["trust"]
    defaults = {"group/constellation.cluster.attestation": {
        "ek_ca_path": str(trust.ek_ca_path), "measurements_file": str(image["out"] / "measurements.json"),
        "measurements_pub_key_file": str(trust.measurements_pub_path), "attestation_timeout": 120, "timeout": 120}}
    return run_tasks(tmp_path, tasks, play={"module_defaults": defaults}, python=PYTHON,
                     env={"TSS2_LOG": "all+none"}, timeout=600)


def test_genuine_image_attests_against_its_prediction_and_activates(image, tmp_path):
    trust = image["trust"]
    admin = LabTrust.admin_key(tmp_path)
    kms_uri = "kms://cluster-kms?key=%s&salt=%s" % (base64.urlsafe_b64encode(os.urandom(32)).decode(),
                                                    base64.urlsafe_b64encode(os.urandom(32)).decode())
    with Guest(image["out"] / "disk.raw", tmp_path / "guest", trust.ca_dir,
               node_settings=settings(image, tmp_path)) as guest:
        guest.wait_agent(AGENT_TIMEOUT)
        run = play(image, tmp_path, [
            {"name": "attest", "constellation.cluster.verify_attestation": {"endpoint": guest.endpoint},
             "register": "verified"},
            {"name": "activate", "constellation.cluster.activate_coordinator": {
                "endpoint": guest.endpoint, "kms_uri": kms_uri,
                "measurement_salt": base64.b64encode(os.urandom(32)).decode(),
                "admin_priv_key_file": str(admin), "init_secret": trust.init_secret()}},
            {"name": "state", "constellation.cluster.agent_state": {
                "endpoint": guest.endpoint, "admin_priv_key_file": str(admin)}},
        ])
        results = run.results()
        assert run.ok, run.stdout[-4000:] + guest.serial()[-3000:]
    verified = results["attest"]
    predicted = image["manifest"]["pcrs"]
    rows = {row["index"]: row for row in verified["pcrs"]}
    assert sorted(rows) == [4, 7, 9, 11, 13]
    for index in (4, 7, 9, 11):
        assert rows[index]["ok"] and not rows[index]["warn_only"]
        assert rows[index]["found"] == predicted[str(index)]
    assert rows[13]["found"] == "00" * 32  # the image's agent never extends PCR 13
    assert results["activate"]["cluster_id"]
    assert "verity: data block" not in guest.serial()


def test_flipped_root_byte_never_serves(image, tmp_path):
    """One byte of the agent's code changed in the root partition: dm-verity refuses the block, the agent cannot
    start, nothing answers on its port."""
    disk = tmp_path / "disk.raw"
    subprocess.run(["cp", "--sparse=always", str(image["out"] / "disk.raw"), str(disk)], check=True)
    part = image["manifest"]["partitions"]["root"]
    code = (Path(__file__).resolve().parents[2] / "plugins/module_utils/agent/wiring.py").read_bytes()[:512]
    offset = _find(disk, code, part["offset"], part["size"])
    with open(disk, "r+b") as handle:
        handle.seek(offset + 100)
        byte = handle.read(1)
        handle.seek(offset + 100)
        handle.write(bytes([byte[0] ^ 0x01]))
    with Guest(disk, tmp_path / "guest", image["trust"].ca_dir, node_settings=settings(image, tmp_path)) as guest:
        guest.wait_serial("is corrupted", AGENT_TIMEOUT)  # "device-mapper: verity: 253:2: data block N is corrupted"
        guest.wait_serial("OSError: [Errno 5] Input/output error", 120)  # the agent's import of that block
        assert not guest.tls_answers()
    assert "agent_started" not in guest.serial()


def test_changed_command_line_is_refused_naming_pcrs(image, tmp_path):
    """The same kernel, initrd and root, one more kernel argument: the boot works, the attestation fails on the
    PCRs that measure the command line."""
    disk = tmp_path / "disk.raw"
    subprocess.run(["cp", "--sparse=always", str(image["out"] / "disk.raw"), str(disk)], check=True)
    work = tmp_path / "uki"
    work.mkdir()
    uki = image["out"] / "uki.efi"
    for name in ("linux", "initrd", "osrel", "cmdline"):
        subprocess.run(["objcopy", "--dump-section", ".%s=%s" % (name, work / name), str(uki)], check=True,
                       capture_output=True)
    cmdline = (work / "cmdline").read_text().strip() + " systemd.log_level=info"
    assemble.make_uki(work / "uki.efi", work / "linux", work / "initrd", cmdline, (work / "osrel").read_text(), work)
    assemble.make_esp(work / "uki.efi", work / "esp.img")
    esp = image["manifest"]["partitions"]["esp"]
    assert (work / "esp.img").stat().st_size <= esp["size"]
    with open(disk, "r+b") as handle, open(work / "esp.img", "rb") as source:
        handle.seek(esp["offset"])
        handle.write(source.read())
    with Guest(disk, tmp_path / "guest", image["trust"].ca_dir, node_settings=settings(image, tmp_path)) as guest:
        guest.wait_agent(AGENT_TIMEOUT)
        run = play(image, tmp_path, [{"name": "attest", "constellation.cluster.verify_attestation": {
            "endpoint": guest.endpoint}}])
    assert not run.ok
    msg = run.results()["attest"]["msg"]
    assert "refused" in msg and ("PCR 9" in msg or "PCR 11" in msg), msg


def _find(path: Path, needle: bytes, start: int, size: int) -> int:
    """The offset of ``needle`` in ``path`` between ``start`` and ``start + size``."""
    chunk = 64 * 1024 * 1024
    with open(path, "rb") as handle:
        pos = start
        while pos < start + size:
            handle.seek(pos)
            data = handle.read(chunk + len(needle))
            found = data.find(needle)
            if found >= 0:
                return pos + found
            pos += chunk
    raise AssertionError("the agent's code was not found in the root partition")
