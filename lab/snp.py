# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab as an SEV-SNP machine (docs/testing.md, "The lab as an SEV-SNP platform"): which variants use it, the
measurements document's ``snp`` object of a lab image, and each host's platform service (lab/snp_platform.py),
started inside the host's namespaces so that ``lab down`` stops it with the host."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose, sev_snp
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError, InputError
from lab.image import LAB_IMAGE, lab_measurements, launch_measurement
from lab.names import REPO_ROOT, Host, LabError
from lab.procs import alive, kill_all
from lab.snp_platform import LAB_TCB, TAMPERS, PlatformError, SNPPlatform, platform_of, request

START_TIMEOUT = 20.0
# The variants whose reports are signed with a VLEK (AWS loads one per cloud into the chip); the others a VCEK.
VLEK_VARIANTS = ("aws-sev-snp",)
# The variants that read the report from the vTPM (Azure's paravisor writes its HCL report into an NV index), not
# from ``snp_report_source``.
HCL_VARIANTS = ("azure-sev-snp",)


def uses_snp(variant: str) -> bool:
    """Whether hosts of ``variant`` attest with an SEV-SNP report (its spec needs AMD roots)."""
    return choose.spec(variant, "variant").needs_amd_roots


def quotes_pcrs(variant: str) -> bool:
    """Whether ``variant``'s documents carry a TPM quote (``sev-snp``'s do not: no PCRs in its policy)."""
    return choose.spec(variant, "variant").quotes_pcrs


def lab_snp_policy(image: str = LAB_IMAGE) -> Dict[str, object]:
    """The measurements document's ``snp`` object for a lab image (Constellation's names): the launch measurement
    computed from the image (never read back from a host) and the lab platform's TCB as the minimums."""
    return {
        "bootloaderVersion": LAB_TCB["bootloader"],
        "teeVersion": LAB_TCB["tee"],
        "snpVersion": LAB_TCB["snp"],
        "microcodeVersion": LAB_TCB["microcode"],
        "launchMeasurement": launch_measurement(image).hex(),
        "allowDebug": False,
    }


def measurements(image: str = LAB_IMAGE, variant: str = "qemu-vtpm-ek") -> Dict[str, object]:
    """The lab's measurements document of ``image`` for ``variant``: the PCRs the boot chain measures (unless the
    variant quotes none) and, for an SEV-SNP variant, the ``snp`` object."""
    if not uses_snp(variant):
        return lab_measurements(image)
    doc: Dict[str, object] = dict(lab_measurements(image)) if quotes_pcrs(variant) else {}
    doc["snp"] = lab_snp_policy(image)
    return doc


def report_source(variant: str, h: Host) -> Optional[str]:
    """The agent's ``snp_report_source`` on ``h``: the host's platform socket (None: the variant reads its report
    from the vTPM, or uses no SNP)."""
    if not uses_snp(variant) or variant in HCL_VARIANTS:
        return None
    return "unix:%s" % platform_of(h).socket_path


def signing_key(variant: str) -> str:
    return "vlek" if variant in VLEK_VARIANTS else "vcek"


# -- the platform service per host ------------------------------------------------------------
def platform_pid(h: Host) -> Optional[int]:
    try:
        pid = int(platform_of(h).pid_path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if alive(pid) else None


def platform_alive(h: Host) -> bool:
    return platform_pid(h) is not None and platform_of(h).socket_path.exists()


def start_platform(h: Host, image: str, variant: str, python: List[str]) -> None:
    """Starts ``h``'s platform service (its state made first, kept if it exists) unless it runs."""
    if platform_alive(h):
        return
    platform = platform_of(h)
    platform.state(image, signing_key(variant))
    platform.pid_path.unlink(missing_ok=True)
    platform.socket_path.unlink(missing_ok=True)
    log = open(platform.folder / "platform.log", "ab")
    try:
        proc = h.popen(["env", "PYTHONPATH=%s:%s" % (REPO_ROOT / "collections", REPO_ROOT)] + list(python)
                       + ["-m", "lab.snp_platform", "--host-dir", str(h.dir), "--lab-state", str(h.state_dir)],
                       stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    finally:
        log.close()
    deadline = time.monotonic() + START_TIMEOUT
    while not platform_alive(h):
        if proc.poll() is not None:
            raise LabError("%s: the SEV-SNP platform service exited with %s: %s"
                           % (h.name, proc.returncode, _tail(platform.folder / "platform.log")))
        if time.monotonic() > deadline:
            raise LabError("%s: the SEV-SNP platform service did not listen within %.0f s" % (h.name, START_TIMEOUT))
        time.sleep(0.05)


def stop_platform(h: Host) -> None:
    pid = platform_pid(h)
    if pid is not None:
        kill_all([pid])
    platform_of(h).socket_path.unlink(missing_ok=True)


def tamper(h: Host, what: str, image: str = LAB_IMAGE) -> SNPPlatform:
    """``lab tamper HOST --snp WHAT`` (lab/snp_platform.py's ``SNPPlatform.tamper``; ``genuine`` undoes them).
    The running service reads the state at each request: no restart."""
    platform = platform_of(h)
    if what == "genuine":
        platform.restore(image)
    elif what in TAMPERS:
        platform.tamper(what)
        platform.chain()  # made now (the foreign AMD once), not at the service's next request
    else:
        raise LabError("snp: expected one of %s, got %r" % (", ".join(TAMPERS + ("genuine",)), what))
    return platform


def reimaged(h: Host, image: str) -> None:
    """A host rebooted into ``image`` launches with that image's measurement (a tampered one stays tampered)."""
    platform = platform_of(h)
    if platform.state_path.exists() and "measurement" not in platform.state().tampered:
        platform.update(measurement=launch_measurement(image).hex())


def prove(h: Host, image: str, roots: sev_snp.AMDRoots) -> Dict[str, object]:
    """``lab prove`` on an SEV-SNP lab: a report of ``h``'s platform over a fresh nonce, verified to the lab's AMD
    roots and checked against the ``snp`` object of the image the host booted."""
    nonce = os.urandom(64)
    try:
        raw, table = request(platform_of(h).socket_path, nonce)
        report = sev_snp.parse_report(raw)
        certs = sev_snp.parse_cert_table(table)
        signer = certs.get(report.signing_key)
        if signer is None:
            raise PlatformError("certs: no %s in the certificate table" % report.signing_key)
        sev_snp.verify_report(report, signer, b"", roots)
        sev_snp.check_report_data(report, nonce)
        sev_snp.SNPPolicy.from_dict(lab_snp_policy(image)).check(report)
    except (AttestationError, InputError, PlatformError, OSError, ValueError) as err:
        return {"ok": False, "error": "snp: %s" % err}
    return {"ok": True, "error": "", "tcb": report.reported_tcb.to_dict(), "measurement": report.measurement.hex()}


def status(h: Host) -> Dict[str, object]:
    platform = platform_of(h)
    state = platform.state() if platform.state_path.exists() else None
    return {"snp_platform": platform_alive(h), "snp_tampered": list(state.tampered) if state else []}


def _tail(path: Path, lines: int = 10) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
