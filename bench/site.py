"""site.yml on a 4-host lab: first run, second run (nothing to change) and, as the baseline, a
ping play (ansible.builtin.ping) over the same hosts and the same aTLS connection.

Last line: one JSON object with first_run_s, second_run_s, ping_s, second_run_changed, second_vs_ping
and the attestation variant. ``--variant`` (default: the lab's, qemu-vtpm-ek) lets the EK variant's
enrollment cost be read against qemu-vtpm's.
Goal: second_run_changed == 0 and second_vs_ping <= 1.5.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO_ROOT / "collections"), str(REPO_ROOT)]

from lab.lab import Lab  # noqa: E402

VENV_BIN = REPO_ROOT / ".venv" / "bin"
PING_PLAY = """---
- name: Baseline - one ping per host over the aTLS connection
  hosts: coordinators:nodes
  gather_facts: false
  tasks:
    - name: Ping
      ansible.builtin.ping:
"""


def play(inv: Path, playbook: Path):
    env = dict(os.environ, PATH="%s:%s" % (VENV_BIN, os.environ.get("PATH", "")),
               ANSIBLE_CONFIG=str(REPO_ROOT / "ansible.cfg"))
    started = time.monotonic()
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inv / "hosts.yml"), str(playbook),
                           "--vault-password-file", str(inv / "vault_pass"),
                           "-e", "ansible_python_interpreter=%s" % (VENV_BIN / "python")],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    elapsed = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit("%s failed:\n%s" % (playbook.name, proc.stdout[-3000:]))
    changed = sum(int(n) for n in re.findall(r"\bchanged=(\d+)", proc.stdout.split("PLAY RECAP")[-1]))
    return elapsed, changed


def main() -> int:
    import argparse

    from lab.lab import LAB_VARIANT

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default=LAB_VARIANT, help="attestation variant of the lab (default %(default)s)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-site-") as tmp:
        inv = Path(tmp) / "inv"
        lab = Lab("bsite", inventory_dir=inv)
        try:
            lab.up(hosts=4, tpm=True, agents=True, variant=args.variant)
            ping_play = Path(tmp) / "ping.yml"
            ping_play.write_text(PING_PLAY)
            first, first_changed = play(inv, REPO_ROOT / "site.yml")
            second, second_changed = play(inv, REPO_ROOT / "site.yml")
            ping = play(inv, ping_play)[0]
        finally:
            lab.down()
    print("%-34s %8s %8s" % ("4-host lab, aTLS connection", "seconds", "changed"))
    print("%-34s %8.2f %8d" % ("site.yml first run", first, first_changed))
    print("%-34s %8.2f %8d" % ("site.yml second run", second, second_changed))
    print("%-34s %8.2f %8s" % ("baseline: ping play", ping, "-"))
    print(json.dumps({"first_run_s": round(first, 2), "second_run_s": round(second, 2), "ping_s": round(ping, 2),
                      "second_run_changed": second_changed, "second_vs_ping": round(second / ping, 2),
                      "variant": args.variant}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
