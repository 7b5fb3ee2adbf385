"""`make demo`: build the lab and show the result."""

from __future__ import annotations

import time

from lab.core import Lab
from lab.prove import print_report, prove


def demo(lab: Lab, hosts: int) -> int:
    started = time.monotonic()
    print("== building the lab: %d simulated hosts (network namespace, swtpm, private /run, node agent each)" % hosts)
    lab.up(hosts=hosts, tpm=True, agents=True)
    print("   up in %.1f s; inventory: %s" % (time.monotonic() - started, lab.inventory_dir))
    print("== proving every host: TPM quote over a fresh nonce against the lab image policy, pings between all pairs")
    report = prove(lab)
    print_report(report)
    print("== the lab stays up for you: `.venv/bin/python -m lab status`, `... exec h1 -- sh`, `... down`")
    return 0 if report["ok"] else 1
