"""site.yml on labs of N hosts: first run, second run (nothing to change) and, as the baseline, a ping
play (ansible.builtin.ping) over the same hosts and the same aTLS connection.

    python bench/site.py [--sizes 4,16,64] [--repeat 2] [--profile] [--variant qemu-vtpm-ek] [--forks N]

One lab per size (the Coordinator and N-1 Nodes, agents as the lab runs them: polls every 0.5 s),
built, measured and torn down before the next: the first run activates every host, so it needs fresh
hosts. Then ``--repeat`` pairs of (second run, ping play), interleaved, so load hits both alike.
Ansible runs with the repository's ansible.cfg as a new user gets it (``--forks`` overrides its forks
through ANSIBLE_FORKS, to compare).
``--profile`` prints, per size, the slowest tasks of the last second run (a timing callback) and
where the CPU went during it (ansible-playbook with its workers, the connection relays, the agents,
swtpm, wireguard-go, other: from /proc, sampled while the run goes).

Last line: one JSON object with, per size N, first_run_s_N, second_run_s_N and ping_s_N (lists with
--repeat > 1), second_run_changed_N, second_vs_ping_N (the worst pair), first_vs_second_N,
per_host_s_N (second run seconds per host) and load_N (1-min load average before that size); and
the variant, forks and sizes.
Goals: second_run_changed_N == 0, second_vs_ping_N <= 1.5 at 16 and 64 hosts,
first_vs_second_64 <= 2, per_host_s_N flat from 4 to 64.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "collections"), str(Path(__file__).resolve().parents[1])]

from lab.lab import Lab  # noqa: E402
from lab.names import MAX_HOSTS  # noqa: E402
from lab.procs import processes_cpu  # noqa: E402
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


def _kind(comm: str, cmdline: str) -> str:
    if "constellation-agent" in cmdline:
        return "agents"
    if "relay_main" in cmdline:
        return "relays (controller)"
    if comm in ("wireguard-go", "swtpm"):
        return comm
    if "_serve()" in cmdline:
        return "warm module interpreters (hosts)"
    return "other processes (the machine's, not only this bench's)"


def cpu_by_pid():
    """{pid: (kind, CPU seconds of the process and of the children it reaped)} from /proc."""
    out = {}
    for pid, (comm, cmdline, seconds) in processes_cpu().items():
        if pid == os.getpid():
            continue
        if "ansible-playbook" in cmdline or "ansible-playbook" in comm:
            continue  # counted from this process's reaped children (workers included)
        out[pid] = (_kind(comm, cmdline), seconds)
    return out


class CpuSampler:
    """CPU seconds by kind while a run goes: /proc sampled every 0.25 s (a process that ends between
    two samples loses at most that much), plus ansible-playbook and its workers from rusage."""

    def __init__(self):
        self.before, self.last, self.stop = cpu_by_pid(), {}, threading.Event()
        self.rusage = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.wait(0.25):
            self.last.update(cpu_by_pid())

    def split(self):
        self.stop.set()
        self.thread.join()
        self.last.update(cpu_by_pid())
        rusage = resource.getrusage(resource.RUSAGE_CHILDREN)
        split = {"ansible-playbook (with its workers)": rusage.ru_utime + rusage.ru_stime
                 - self.rusage.ru_utime - self.rusage.ru_stime}
        for pid, (kind, seconds) in self.last.items():
            spent = seconds - (self.before[pid][1] if pid in self.before and self.before[pid][0] == kind else 0.0)
            split[kind] = split.get(kind, 0.0) + max(spent, 0.0)
        return split


def play(inv: Path, playbook: Path, profile: Path = None, forks: int = 0):
    env = dict(os.environ, PATH="%s:%s" % (VENV_BIN, os.environ.get("PATH", "")),
               ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    if forks:
        env["ANSIBLE_FORKS"] = str(forks)
    if profile is not None:
        # The timing callback next to the one ansible.cfg enables (the variable replaces the setting).
        env.update(ANSIBLE_CALLBACK_PLUGINS=str(profile.parent),
                   ANSIBLE_CALLBACKS_ENABLED="bench_task_times,constellation.cluster.atls_preload",
                   BENCH_TASK_TIMES=str(profile))
    started = time.monotonic()
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inv / "hosts.yml"), str(playbook),
                           "--vault-password-file", str(inv / "vault_pass"),
                           "-e", "ansible_python_interpreter=%s" % (VENV_BIN / "python")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800, check=False)
    elapsed = time.monotonic() - started
    if proc.returncode != 0:
        handle, log = tempfile.mkstemp(prefix="bench-site-failed-", suffix=".log")
        with os.fdopen(handle, "w") as out:
            out.write(proc.stdout + "\n" + proc.stderr)
        fatal = proc.stdout.find("fatal:")
        excerpt = proc.stdout[fatal:fatal + 4000] if fatal >= 0 else proc.stdout[-3000:]
        sys.exit("%s failed (whole output: %s):\n%s\n%s" % (playbook.name, log, excerpt, proc.stderr[-2000:]))
    changed = sum(int(n) for n in re.findall(r"\bchanged=(\d+)", proc.stdout.split("PLAY RECAP")[-1]))
    return elapsed, changed


def measure(size: int, args, tmp: Path, ping_play: Path) -> dict:
    """One lab of ``size`` hosts: first run, then args.repeat pairs (second run, ping play)."""
    inv = tmp / ("inv%d" % size)
    lab = Lab(args.lab, inventory_dir=inv)
    profile = None
    if args.profile:
        (tmp / "callbacks").mkdir(exist_ok=True)
        (tmp / "callbacks" / "bench_task_times.py").write_text(TASK_TIMES)
        profile = tmp / "callbacks" / "times.tsv"
    try:
        started = time.monotonic()
        lab.up(hosts=size, tpm=True, agents=True, variant=args.variant)
        setup_s = time.monotonic() - started
        load = os.getloadavg()[0]
        first, first_changed = play(inv, ROOT / "site.yml", forks=args.forks)
        seconds, pings, changed, cpu = [], [], 0, {}
        for last in [False] * (args.repeat - 1) + [True]:  # each second run next to its own ping play
            sampler = CpuSampler() if last and args.profile else None
            second, second_changed = play(inv, ROOT / "site.yml", profile if last else None, args.forks)
            if sampler is not None:
                cpu = sampler.split()
            seconds.append(second)
            changed += second_changed
            pings.append(play(inv, ping_play, forks=args.forks)[0])
    finally:
        lab.down()
    out = {"size": size, "setup_s": setup_s, "load": load, "first": first, "first_changed": first_changed,
           "seconds": seconds, "pings": pings, "changed": changed, "cpu": cpu, "tasks": []}
    if profile is not None:
        out["tasks"] = sorted(((float(took), name) for took, name in
                               (line.split("\t", 1) for line in profile.read_text().splitlines())), reverse=True)
    return out


def report(rows, args, quiet: bool = False) -> dict:
    summary = {}

    def say(*parts):
        if not quiet:
            print(*parts)

    for row in rows:
        n = row["size"]
        ratios = [second / ping for second, ping in zip(row["seconds"], row["pings"])]
        say("\n%d-host lab (the Coordinator and %d Nodes), aTLS connection, forks %s; lab set-up %.1f s"
            % (n, n - 1, args.forks or "from ansible.cfg", row["setup_s"]))
        say("%-34s %8s %8s %8s %10s" % ("", "seconds", "changed", "ratio", "s per host"))
        say("%-34s %8.2f %8d %8.2f %10.3f" % ("site.yml first run", row["first"], row["first_changed"],
                                              row["first"] / min(row["seconds"]), row["first"] / n))
        for second, ping, ratio in zip(row["seconds"], row["pings"], ratios):
            say("%-34s %8.2f %8d %8.2f %10.3f" % ("site.yml second run", second, row["changed"], ratio, second / n))
            say("%-34s %8.2f %8s %8s %10.3f" % ("baseline: ping play (same lab)", ping, "-", "-", ping / n))
        say("load average (1 min) before: %.2f" % row["load"])
        if row["cpu"]:
            total = sum(row["cpu"].values())
            say("CPU during the last second run (%.1f CPU-s in %.1f s, %.0f %% of 2 cores):"
                % (total, row["seconds"][-1], 100 * total / row["seconds"][-1] / 2))
            for kind, spent in sorted(row["cpu"].items(), key=lambda item: -item[1]):
                say("  %6.2f s  %s" % (spent, kind))
        if row["tasks"]:
            say("slowest tasks of the last second run (s):")
            for took, name in row["tasks"][:12]:
                say("  %6.2f  %s" % (took, name))
        one = args.repeat == 1
        summary.update({
            "first_run_s_%d" % n: round(row["first"], 2),
            "second_run_s_%d" % n: round(row["seconds"][0], 2) if one else [round(v, 2) for v in row["seconds"]],
            "ping_s_%d" % n: round(row["pings"][0], 2) if one else [round(v, 2) for v in row["pings"]],
            "second_run_changed_%d" % n: row["changed"],
            "second_vs_ping_%d" % n: round(max(ratios), 2),
            "first_vs_second_%d" % n: round(row["first"] / min(row["seconds"]), 2),
            "per_host_s_%d" % n: round(min(row["seconds"]) / n, 3),
            "load_%d" % n: round(row["load"], 2),
        })
        if row["cpu"]:
            summary["cpu_s_%d" % n] = {kind: round(spent, 2) for kind, spent in row["cpu"].items()}
    summary.update({"sizes": [row["size"] for row in rows], "variant": args.variant, "forks": args.forks or None})
    return summary


def parse_args(argv=None):
    import argparse

    from lab.names import LAB_VARIANT

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,16", help="comma-separated lab sizes in hosts (default %(default)s)")
    parser.add_argument("--variant", default=LAB_VARIANT, help="attestation variant of the lab (default %(default)s)")
    parser.add_argument("--repeat", type=int, default=1, help="pairs of (second run, ping play) to measure per size")
    parser.add_argument("--profile", action="store_true", help="print the slowest tasks and the CPU by process kind")
    parser.add_argument("--forks", type=int, default=0, help="override ansible.cfg's forks (ANSIBLE_FORKS)")
    parser.add_argument("--lab", default="bsite", help="lab name (namespaces and state directory)")
    args = parser.parse_args(argv)
    try:
        args.sizes = [int(size) for size in args.sizes.split(",") if size.strip()]
    except ValueError:
        parser.error("--sizes: expected comma-separated integers, got %r" % args.sizes)
    if not args.sizes or not all(2 <= size <= MAX_HOSTS for size in args.sizes):
        parser.error("--sizes: each within 2..%d (the Coordinator and at least one Node)" % MAX_HOSTS)
    if not 1 <= args.repeat <= 20:
        parser.error("--repeat: expected 1..20, got %d" % args.repeat)
    if args.forks < 0:
        parser.error("--forks: expected >= 0, got %d" % args.forks)
    return args


def main() -> int:
    args = parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-site-") as tmp:
        ping_play = Path(tmp) / "ping.yml"
        ping_play.write_text(PING_PLAY)
        for size in args.sizes:
            rows.append(measure(size, args, Path(tmp), ping_play))
            report(rows[-1:], args)  # each size's figures as soon as it is done
            sys.stdout.flush()
    print(json.dumps(report(rows, args, quiet=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
