"""site.yml on a 4-host lab: first run, second run (nothing to change) and, as the baseline, a
ping play (ansible.builtin.ping) over the same hosts and the same aTLS connection.

Last line: one JSON object with first_run_s, second_run_s, ping_s, second_run_changed, second_vs_ping
and the attestation variant. ``--variant`` (default: the lab's, qemu-vtpm-ek) lets the EK variant's
enrollment cost be read against qemu-vtpm's. ``--repeat N`` measures N pairs (second run, then ping)
on the same lab: second_run_s and ping_s are then lists, second_vs_ping the worst pair.
``--profile`` prints the slowest tasks of the (last) second run on stderr (a timing callback).
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

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "collections"), str(Path(__file__).resolve().parents[1])]

from lab.lab import Lab  # noqa: E402
from tests.support import ROOT, VENV_BIN  # noqa: E402
# The timing callback of --profile: seconds from one task's start to the next one's (or the end).
TASK_TIMES = r"""
import os, time
from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "bench_task_times"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.rows, self.current = [], None

    def _next(self, name):
        now = time.monotonic()
        if self.current:
            self.rows.append((now - self.current[1], self.current[0]))
        self.current = (name, now) if name else None

    def v2_playbook_on_play_start(self, play):
        self._next("(play) " + play.get_name())

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._next(task.get_name())

    def v2_playbook_on_stats(self, stats):
        self._next(None)
        with open(os.environ["BENCH_TASK_TIMES"], "w") as handle:
            handle.writelines("%.3f\t%s\n" % row for row in self.rows)
"""
PING_PLAY = """---
- name: Baseline - one ping per host over the aTLS connection
  hosts: coordinators:nodes
  gather_facts: false
  tasks:
    - name: Ping
      ansible.builtin.ping:
"""


def play(inv: Path, playbook: Path, profile: Path = None):
    env = dict(os.environ, PATH="%s:%s" % (VENV_BIN, os.environ.get("PATH", "")),
               ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    if profile is not None:
        # The timing callback next to the one ansible.cfg enables (the variable replaces the setting).
        env.update(ANSIBLE_CALLBACK_PLUGINS=str(profile.parent),
                   ANSIBLE_CALLBACKS_ENABLED="bench_task_times,constellation.cluster.atls_preload",
                   BENCH_TASK_TIMES=str(profile))
    started = time.monotonic()
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inv / "hosts.yml"), str(playbook),
                           "--vault-password-file", str(inv / "vault_pass"),
                           "-e", "ansible_python_interpreter=%s" % (VENV_BIN / "python")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    elapsed = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit("%s failed:\n%s\n%s" % (playbook.name, proc.stdout[-3000:], proc.stderr[-3000:]))
    changed = sum(int(n) for n in re.findall(r"\bchanged=(\d+)", proc.stdout.split("PLAY RECAP")[-1]))
    return elapsed, changed


def main() -> int:
    import argparse

    from lab.names import LAB_VARIANT

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default=LAB_VARIANT, help="attestation variant of the lab (default %(default)s)")
    parser.add_argument("--repeat", type=int, default=1, help="pairs of (second run, ping play) to measure")
    parser.add_argument("--profile", action="store_true", help="print the slowest tasks of the second run")
    args = parser.parse_args()
    if not 1 <= args.repeat <= 20:
        parser.error("--repeat: expected 1..20, got %d" % args.repeat)
    with tempfile.TemporaryDirectory(prefix="bench-site-") as tmp:
        inv = Path(tmp) / "inv"
        lab = Lab("bsite", inventory_dir=inv)
        try:
            lab.up(hosts=4, tpm=True, agents=True, variant=args.variant)
            ping_play = Path(tmp) / "ping.yml"
            ping_play.write_text(PING_PLAY)
            profile = None
            if args.profile:
                (Path(tmp) / "callbacks").mkdir()
                (Path(tmp) / "callbacks" / "bench_task_times.py").write_text(TASK_TIMES)
                profile = Path(tmp) / "callbacks" / "times.tsv"
            load = os.getloadavg()[0]
            first, first_changed = play(inv, ROOT / "site.yml")
            seconds, pings, changed = [], [], 0
            for _round in range(args.repeat):  # each second run next to its own ping play
                second, second_changed = play(inv, ROOT / "site.yml", profile)
                seconds.append(second)
                changed += second_changed
                pings.append(play(inv, ping_play)[0])
            if profile is not None:
                rows = sorted((line.split("\t", 1) for line in profile.read_text().splitlines()),
                              key=lambda row: -float(row[0]))
                print("slowest tasks of the second run (s):", file=sys.stderr)
                for took, name in rows[:15]:
                    print("  %6s  %s" % (took, name), file=sys.stderr)
        finally:
            lab.down()
    ratios = [second / ping for second, ping in zip(seconds, pings)]
    print("%-34s %8s %8s %8s" % ("4-host lab, aTLS connection", "seconds", "changed", "ratio"))
    print("%-34s %8.2f %8d" % ("site.yml first run", first, first_changed))
    for second, ping, ratio in zip(seconds, pings, ratios):
        print("%-34s %8.2f %8d %8.2f" % ("site.yml second run", second, changed, ratio))
        print("%-34s %8.2f %8s" % ("baseline: ping play (same lab)", ping, "-"))
    print("load average (1 min) before: %.2f" % load)
    one = args.repeat == 1
    print(json.dumps({"first_run_s": round(first, 2),
                      "second_run_s": round(seconds[0], 2) if one else [round(value, 2) for value in seconds],
                      "ping_s": round(pings[0], 2) if one else [round(value, 2) for value in pings],
                      "second_run_changed": changed, "second_vs_ping": round(max(ratios), 2),
                      "variant": args.variant, "load_before": round(load, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
