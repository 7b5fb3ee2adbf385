# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The hosts' TPMs: one swtpm per host inside its namespace (127.0.0.1:2321 there), manufactured with an EK
certificate of the lab CA, and the simulated boot chain that measures the lab image into it; a reboot, a
tampered boot and a TPM of another vendor."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List

from lab.image import TAMPERED_DIGEST, boot_digests
from lab.names import TPM_PORT, Host, host_cmd
from lab.swtpm import SwTPM
from lab.trust import LabTrust


def measure(h: Host, digests: Dict[int, bytes], python: List[str]) -> None:
    """Extends PCRs of a host's TPM (inside its namespace, where its swtpm listens)."""
    args = []
    for pcr, digest in sorted(digests.items()):
        args += ["--extend", "%d=%s" % (pcr, digest.hex())]
    host_cmd(h, ["--tcti", h.tcti] + args, python)


def _swtpm(h: Host, ca_dir: Path) -> SwTPM:
    return SwTPM(str(h.dir / "tpm"), port=TPM_PORT, ek_cert=True, ca_dir=str(ca_dir), netns=h.netns)


def start_tpms(hosts: List[Host], image: str, trust: LabTrust, python: List[str]) -> None:
    """Starts (manufacturing if new) each host's TPM and boots the image into it."""
    first_ever = not (trust.ca_dir / "issuercert.pem").exists()
    trust.ca_dir.mkdir(parents=True, exist_ok=True)
    tpms = [_swtpm(h, trust.ca_dir) for h in hosts]
    # The first manufacture creates the lab's local CA (the "TPM vendor"); the others
    # only ask it for certificates, so they can run side by side.
    if first_ever:
        tpms[0].start()
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda t: t.start(), tpms[1:] if first_ever else tpms))
        # The simulated boot chain measures the image into each host's TPM.
        list(pool.map(lambda h: measure(h, boot_digests(image), python), hosts))
    trust.write_ek_ca()


def reboot(h: Host, image: str, trust: LabTrust, python: List[str]) -> None:
    """Stands for a reboot of the host's machine: its TPM restarts (PCRs reset, keys kept) and the
    boot chain measures the lab image again. Stop the host's agent first and start it after."""
    tpm = _swtpm(h, trust.ca_dir)
    tpm.adopt()
    tpm.stop(orderly=True)  # a reboot: the OS shuts the TPM down first
    tpm.start()
    measure(h, boot_digests(image), python)


def tamper(h: Host, pcr: int, python: List[str]) -> None:
    """Stands for a modified host: its boot chain measured something else."""
    measure(h, {pcr: TAMPERED_DIGEST}, python)


def replace_with_foreign(h: Host, state_dir: Path, image: str, python: List[str]) -> None:
    """Replaces the host's swtpm by one whose EK certificate comes from another CA, with the lab image
    measured as usual (so only the EK chain can tell). Another TPM is another machine: the agent's state
    folder (sealed to the old TPM) goes with the old one. Stop the host's agent first."""
    old = SwTPM(str(h.dir / "tpm"), port=TPM_PORT, netns=h.netns)
    old.adopt()  # the running daemon, by its pid file
    old.destroy()
    foreign_ca = state_dir / "foreign-ca"
    foreign_ca.mkdir(parents=True, exist_ok=True)
    _swtpm(h, foreign_ca).start()
    measure(h, boot_digests(image), python)
    shutil.rmtree(str(h.dir / "agent" / "state"), ignore_errors=True)  # lab/agent.py's agent_dir(h) / "state"
