"""The node image (docs/image.md): its build cold (the root file system made by mmdebstrap into a fresh cache) and
cached, the boot under QEMU TCG to an agent that serves and to one attested against the predicted signed
document, and the image's size; beside the start of one namespace lab host with its swtpm and agent (``python -m
lab up --hosts 1 --agents``) in the same run. ``--no-cold`` skips the cold build (about 2.5 minutes).
Last line: one JSON object."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "collections"), str(Path(__file__).resolve().parents[1])]

from image import paths  # noqa: E402
from image.boot import Guest, write_node_settings  # noqa: E402
from image.build import BuildOptions, build  # noqa: E402
from lab.image import lab_measurements  # noqa: E402
from lab.lab import Lab  # noqa: E402
from lab.swtpm import SwTPM, free_port  # noqa: E402
from lab.trust import LabTrust  # noqa: E402
from tests.support import VENV_BIN  # noqa: E402
from tests.support.playbook import run_tasks  # noqa: E402

GUEST_IP = "10.0.2.15"


def trust_in(base: Path) -> LabTrust:
    trust = LabTrust(base / "trust")
    if not (trust.ca_dir / "issuercert.pem").exists():
        trust.ca_dir.mkdir(parents=True, exist_ok=True)
        SwTPM(str(base / "seed-tpm"), free_port(), ek_cert=True, ca_dir=str(trust.ca_dir)).start().stop()
    trust.write_ek_ca()
    trust.measurements_key()
    return trust


def timed_build(trust: LabTrust, out: Path, policy: Path) -> tuple:
    started = time.monotonic()
    manifest = build(BuildOptions(out=out, ek_ca=[trust.ek_ca_path], signing_key=trust.measurements_key_path,
                                  policy=policy), log=lambda *_: None)
    return time.monotonic() - started, manifest


def attest(trust: LabTrust, out: Path, endpoint: str, work: Path) -> None:
    defaults = {"group/constellation.cluster.attestation": {
        "ek_ca_path": str(trust.ek_ca_path), "measurements_file": str(out / "measurements.json"),
        "measurements_pub_key_file": str(trust.measurements_pub_path), "attestation_timeout": 120, "timeout": 120}}
    run = run_tasks(work, [{"name": "attest", "constellation.cluster.verify_attestation": {"endpoint": endpoint}}],
                    play={"module_defaults": defaults}, python=str(VENV_BIN / "python"), env={"TSS2_LOG": "all+none"})
    if not run.ok:
        sys.exit("verify_attestation failed:\n%s" % run.stdout[-3000:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-cold", action="store_true", help="skip the cold build")
    args = parser.parse_args()
    os.environ.setdefault("TSS2_LOG", "all+none")
    figures = {"load_before": os.getloadavg()[0]}
    base = paths.CACHE / "bench"
    base.mkdir(parents=True, exist_ok=True)
    trust = trust_in(base)
    policy = base / "peers.json"
    policy.write_text(json.dumps(lab_measurements(), indent=2))
    trust.sign_measurements(policy)
    with tempfile.TemporaryDirectory(prefix="bench-image-") as tmp_name:
        tmp = Path(tmp_name)
        if not args.no_cold:
            from image import rootfs  # pylint: disable=import-outside-toplevel
            cold_cache = tmp / "cache"
            saved = rootfs.ROOTFS_CACHE
            rootfs.ROOTFS_CACHE = cold_cache / "rootfs"  # a fresh cache: mmdebstrap runs
            try:
                figures["build_cold_s"] = round(timed_build(trust, tmp / "cold", policy)[0], 1)
            finally:
                rootfs.ROOTFS_CACHE = saved
        timed_build(trust, base / "out", policy)  # the shared cache filled (a no-op when it is)
        seconds, manifest = timed_build(trust, base / "out", policy)
        figures["build_cached_s"] = round(seconds, 1)
        figures["build_cached_steps_s"] = manifest["times"]
        disk = base / "out" / "disk.raw"
        figures["disk_bytes"] = disk.stat().st_size
        figures["disk_allocated_bytes"] = disk.stat().st_blocks * 512
        figures["uki_bytes"] = manifest["sizes"]["uki"]
        figures["root_bytes"] = manifest["sizes"]["root"]

        node = write_node_settings(tmp / "node.raw", {"public_ip": GUEST_IP,
                                                      "init_secret_hash": trust.init_secret_hash(GUEST_IP)})
        with Guest(disk, tmp / "guest", trust.ca_dir, node_settings=node) as guest:
            figures["boot_to_agent_s"] = round(guest.wait_agent(600), 1)
            attest(trust, base / "out", guest.endpoint, tmp / "play")
            figures["boot_to_attested_s"] = round(time.monotonic() - guest.started_at, 1)

        lab = Lab("bimg", inventory_dir=tmp / "inv")
        started = time.monotonic()
        try:
            lab.up(hosts=1, tpm=True, agents=True)
            figures["lab_host_start_s"] = round(time.monotonic() - started, 1)
        finally:
            lab.down()
    figures["load_after"] = os.getloadavg()[0]
    print("image build cold %s s, cached %.1f s; boot to agent %.1f s, to attested %.1f s; disk %.0f MiB "
          "(%.0f MiB allocated), UKI %.1f MiB; a lab host with swtpm and agent: %.1f s (load %.1f -> %.1f)"
          % (figures.get("build_cold_s", "-"), figures["build_cached_s"], figures["boot_to_agent_s"],
             figures["boot_to_attested_s"], figures["disk_bytes"] / 2 ** 20, figures["disk_allocated_bytes"] / 2 ** 20,
             figures["uki_bytes"] / 2 ** 20, figures["lab_host_start_s"], figures["load_before"],
             figures["load_after"]))
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
