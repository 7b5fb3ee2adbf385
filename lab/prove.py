# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's proof that every host is what it claims: a TPM quote over a fresh nonce,
issued inside the host and validated here against the lab image's policy (on an SEV-SNP lab also its
platform's report, lab/snp.py), and a ping between every pair of hosts."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Protocol

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import sev_snp
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import Measurements
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import VTPMValidator
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError

from lab import snp
from lab.image import lab_measurements
from lab.names import Host, LabError
from lab.state import LabState


class ProvedLab(Protocol):
    """What the proof needs of its lab (lab.lab.Lab is one)."""

    name: str
    state: LabState
    hosts: List[Host]
    uses_snp: bool
    amd_roots_path: Path

    def host_cmd(self, h: Host, args: List[str]) -> str: ...


def attest(lab: ProvedLab, h: Host, validator: VTPMValidator) -> Dict:
    nonce = os.urandom(32)
    user_data = ("lab-proof/%s" % h.name).encode()
    try:
        document = lab.host_cmd(h, ["--tcti", h.tcti, "--attest", nonce.hex(), "--user-data", user_data.decode()])
        validation = validator.validate(document.encode(), nonce)
    except (AttestationError, LabError) as err:
        return {"ok": False, "error": str(err)}
    if validation.user_data != user_data:
        return {"ok": False, "error": "user data does not match"}
    return {"ok": True, "error": "", "warnings": validation.warnings,
            "pcrs": {c.index: c.found[:16] for c in validation.checks}}


def ping_all(h: Host, others: List[Host]) -> Dict[str, bool]:
    script = "; ".join("ping -c1 -W2 -q %s >/dev/null 2>&1 && echo %s" % (o.public_ip, o.name) for o in others)
    out = h.run(["sh", "-c", script], check=False).stdout.split()
    return {o.name: o.name in out for o in others}


def prove(lab: ProvedLab) -> Dict:
    hosts = lab.hosts
    if not hosts:
        raise LabError("lab %r has no hosts: run `python -m lab up` first" % lab.name)
    # Each host against the image it booted last (`lab reimage`).
    validators = {h.name: VTPMValidator(Measurements.from_dict(lab_measurements(lab.state.image_of(h.name)))) for h in hosts}
    with ThreadPoolExecutor(max_workers=4) as pool:
        attestations = list(pool.map(lambda h: attest(lab, h, validators[h.name]), hosts))
        pings = list(pool.map(lambda h: ping_all(h, [o for o in hosts if o is not h]), hosts))
        reports = [None] * len(hosts)
        if lab.uses_snp:
            roots = sev_snp.load_roots(str(lab.amd_roots_path))
            reports = list(pool.map(lambda h: snp.prove(h, lab.state.image_of(h.name), roots), hosts))
    rows = []
    for h, att, ping, report in zip(hosts, attestations, pings, reports):
        rows.append({"host": h.name, "public_ip": h.public_ip, "attested": att["ok"], "error": att["error"],
                     "pcrs": att.get("pcrs", {}), "ping_ok": sum(ping.values()), "ping_total": len(ping)})
        if report is not None:  # the platform's report must pass too
            rows[-1].update(attested=att["ok"] and report["ok"], error=att["error"] or report["error"],
                            snp=report)
    ok = all(r["attested"] and r["ping_ok"] == r["ping_total"] for r in rows)
    return {"ok": ok, "rows": rows}


def print_report(report: Dict) -> None:
    print("%-5s %-12s %-10s %-12s %s" % ("host", "public_ip", "quote", "pings", "PCR 4 / 9 / 11 (found)"))
    for r in report["rows"]:
        pcrs = " / ".join(r["pcrs"].get(i, "-") for i in (4, 9, 11)) if r["attested"] else r["error"]
        if r["attested"] and "snp" in r:
            pcrs += "; SNP TCB %s, measurement %s" % ("/".join(str(v) for v in r["snp"]["tcb"].values()),
                                                      r["snp"]["measurement"][:16])
        quote = "verified" if r["attested"] else "REFUSED"
        pings = "%d/%d" % (r["ping_ok"], r["ping_total"])
        print("%-5s %-12s %-10s %-12s %s" % (r["host"], r["public_ip"], quote, pings, pcrs))
    print("lab: %s" % ("every host attested and reachable" if report["ok"] else "NOT all hosts proven"))
