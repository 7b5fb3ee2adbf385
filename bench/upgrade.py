"""A rolling image upgrade (playbooks/upgrade_image.yml) on a lab of N hosts (``--hosts 4,16``): the roll's
time beside a site.yml second run on the same lab, and the longest ping gap seen during the roll.
``--upgrade agent``: the same for an agent upgrade (playbooks/upgrade_agent.yml): every host runs the checkout's
agent installed on it, the new agent is that code with one line more (tests/support/release.py), the reboot is
`lab reboot` and the old agent is retired.

Per lab: site.yml (first run, activation), a site.yml second run (the baseline), then upgrade_image.yml with
both images' sets, `lab reimage` as the reboot and the old set retired, while every host pings the next one over
the VPN (a ring, every 0.2 s). Gaps are read from the ping replies' timestamps: ``ping_gap_others_s`` is the longest
gap of a pair while neither of its hosts rebooted (the mesh of the others: the no-downtime figure), and
``ping_gap_rebooting_s`` the longest one of a pair with its rebooting host (that host's own outage).
The agents re-attest every 2 s here (the lab's default is 30 s: the roll waits for a re-attestation per host).
Last line: one JSON object per lab size.
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

from lab.agent import agent_dir  # noqa: E402
from tests.support.release import agent_archive, next_release, upgrade_documents  # noqa: E402
from lab.image import LAB_IMAGE, lab_measurements  # noqa: E402
from lab.lab import Lab  # noqa: E402
from tests.support import ROOT, VENV_BIN  # noqa: E402

NEXT_IMAGE = "constellation-lab-image-v2"
REATTEST_INTERVAL = 2


def play(inv: Path, playbook: Path, *extra: str):
    env = dict(os.environ, PATH="%s:%s" % (VENV_BIN, os.environ.get("PATH", "")), ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    started = time.monotonic()
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inv / "hosts.yml"), str(playbook),
                           "--vault-password-file", str(inv / "vault_pass"),
                           "-e", "ansible_python_interpreter=%s" % (VENV_BIN / "python")] + list(extra),
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600, check=False)
    elapsed = time.monotonic() - started
    if proc.returncode != 0:
        sys.exit("%s failed:\n%s\n%s" % (playbook.name, proc.stdout[-3000:], proc.stderr[-3000:]))
    changed = sum(int(n) for n in re.findall(r"\bchanged=(\d+)", proc.stdout.split("PLAY RECAP")[-1]))
    return elapsed, changed


def signed(lab: Lab, path: Path, document: dict) -> str:
    path.write_text(json.dumps(document, indent=2) + "\n")
    lab.sign_measurements(path)
    return str(path)


def gaps(times, windows, a, b):
    """(longest gap while neither a nor b rebooted, longest gap while one of them did) of one pair's replies."""
    others = rebooting = 0.0
    for earlier, later in zip(times, times[1:]):
        gap = later - earlier
        mine = any(s < later and e > earlier for host, (s, e) in windows.items() if host in (a, b))
        if mine:
            rebooting = max(rebooting, gap)
        else:
            others = max(others, gap)
    return others, rebooting


def agent_upgrade(lab: Lab, tmp: Path, hosts: int) -> tuple:
    """The agent upgrade's documents (the running agent and the next one; the next one alone) and its extra vars."""
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.agent_measurement import (
        AgentMeasurement, code_digest)

    measured = [json.loads(line) for line in (agent_dir(lab.hosts[0]) / "agent.log").read_text().splitlines()
                if '"event": "agent_measured"' in line][-1]
    config = bytes.fromhex(measured["agent_config"])
    nxt = next_release(tmp / ("next%d" % hosts))
    archive = tmp / ("agent-next%d.tar.gz" % hosts)
    sha256 = agent_archive(nxt / "plugins" / "module_utils", archive)
    old = AgentMeasurement(code_digest(str(ROOT / "plugins" / "module_utils")), config).to_dict()
    new = AgentMeasurement(code_digest(str(nxt / "plugins" / "module_utils")), config).to_dict()
    in_force = json.loads((Path(lab.inventory_dir) / "measurements.json").read_text())  # as site.yml left it
    _running, both, retired = upgrade_documents(in_force, old, new, lab_measurements(LAB_IMAGE))
    upgrade = signed(lab, tmp / ("upgrade%d.json" % hosts), both)
    retire = signed(lab, tmp / ("retire%d.json" % hosts), retired)
    return upgrade, retire, {"constellation_upgrade_agent": "next", "constellation_agent_archive": str(archive),
                             "constellation_agent_archive_sha256": sha256}


def measure(hosts: int, tmp: Path, what: str = "image") -> dict:
    inv = tmp / ("inv%d" % hosts)
    lab = Lab("bupg", inventory_dir=inv)
    try:
        lab.up(hosts=hosts, tpm=True, agents=True, variant="qemu-vtpm-ek")
        # A shorter re-attestation: each agent's configuration, then a "reboot" into the same image before activation.
        for h in lab.hosts:
            config = agent_dir(h) / "config.json"
            doc = json.loads(config.read_text())
            doc["reattest_interval"] = REATTEST_INTERVAL
            doc["reattest_unreachable_limit"] = 60
            config.write_text(json.dumps(doc, indent=2))
            if what == "agent":  # the checkout's agent, installed on the host: an upgrade replaces it
                lab.install_agent(h.name, ROOT)
            lab.reimage(h.name, LAB_IMAGE)
        first = play(inv, ROOT / "site.yml")[0]
        second, second_changed = play(inv, ROOT / "site.yml")
        if what == "agent":
            upgrade, retire, options = agent_upgrade(lab, tmp, hosts)
            playbook, lab_reboot = ROOT / "playbooks" / "upgrade_agent.yml", "reboot {{ inventory_hostname }}"
        else:
            upgrade = signed(lab, tmp / ("upgrade%d.json" % hosts),
                             {"version": 1, "accepted": {"v1": lab_measurements(LAB_IMAGE), "v2": lab_measurements(NEXT_IMAGE)}})
            retire = signed(lab, tmp / ("retire%d.json" % hosts), {"version": 2, "accepted": {"v2": lab_measurements(NEXT_IMAGE)}})
            options = {"constellation_upgrade_set": "v2"}
            playbook, lab_reboot = ROOT / "playbooks" / "upgrade_image.yml", "reimage {{ inventory_hostname }} --image " + NEXT_IMAGE
        windows_file = tmp / ("windows%d.tsv" % hosts)
        reboot = ("sh -c 'echo {{ inventory_hostname }} $(date +%%s.%%N) >> %s; env PYTHONPATH=%s:%s %s -m lab --name bupg "
                  "%s; echo {{ inventory_hostname }} $(date +%%s.%%N) >> %s'"
                  % (windows_file, ROOT, ROOT / "collections", VENV_BIN / "python", lab_reboot, windows_file))
        vpn_ips = {}
        for h in lab.hosts:
            out = h.run(["ip", "-4", "-o", "addr", "show", "wg0"], check=False).stdout
            match = re.search(r"inet (\d+\.\d+\.\d+\.\d+)", out)
            vpn_ips[h.name] = match.group(1) if match else None
        names = [h.name for h in lab.hosts]
        pairs = [(names[i], names[(i + 1) % len(names)]) for i in range(len(names))]
        extra = json.dumps(dict(options, constellation_upgrade_measurements_file=upgrade,
                                constellation_retire_measurements_file=retire, constellation_upgrade_reboot_command=reboot))
        procs, files = {}, {}
        for a, b in pairs:
            files[(a, b)] = tmp / ("ping-%d-%s-%s.log" % (hosts, a, b))
            with open(files[(a, b)], "wb") as handle:
                procs[(a, b)] = lab.host(a).popen(["ping", "-D", "-n", "-i", "0.2", vpn_ips[b]], stdout=handle,
                                                  stderr=subprocess.STDOUT)
        try:
            roll, roll_changed = play(inv, playbook, "-e", extra)
        finally:
            for proc in procs.values():
                proc.terminate()
                proc.wait(timeout=5)
        again, again_changed = play(inv, playbook, "-e", extra)
        marks = {}
        for line in windows_file.read_text().split("\n"):
            if line.strip():
                host, stamp = line.split()
                marks.setdefault(host, []).append(float(stamp))
        windows = {host: (stamps[0], stamps[-1] + 5.0) for host, stamps in marks.items()}  # + the agent's return
        gap_others = gap_rebooting = 0.0
        for (a, b), path in files.items():
            times = [float(m) for m in re.findall(r"^\[(\d+\.\d+)\] \d+ bytes from", path.read_text(), re.M)]
            others, rebooting = gaps(times, windows, a, b)
            gap_others, gap_rebooting = max(gap_others, others), max(gap_rebooting, rebooting)
    finally:
        lab.down()
    return {"upgrade": what, "hosts": hosts, "site_first_run_s": round(first, 2), "site_second_run_s": round(second, 2),
            "site_second_run_changed": second_changed, "upgrade_s": round(roll, 2), "upgrade_changed": roll_changed,
            "upgrade_per_host_s": round(roll / hosts, 2), "upgrade_second_run_s": round(again, 2),
            "upgrade_second_run_changed": again_changed, "ping_gap_others_s": round(gap_others, 2),
            "ping_gap_rebooting_s": round(gap_rebooting, 2), "reattest_interval_s": REATTEST_INTERVAL}


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="4,16", help="lab sizes, comma-separated (default %(default)s)")
    parser.add_argument("--upgrade", default="image", choices=("image", "agent"),
                        help="what rolls: the node image (upgrade_image.yml) or the agent (upgrade_agent.yml)")
    args = parser.parse_args()
    sizes = [int(n) for n in args.hosts.split(",")]
    if not all(2 <= n <= 32 for n in sizes):
        parser.error("--hosts: expected sizes in 2..32")
    load = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-upgrade-") as tmp:
        for hosts in sizes:
            rows.append(measure(hosts, Path(tmp), args.upgrade))
    print("%-6s %12s %12s %12s %14s %14s" % ("hosts", "upgrade s", "per host s", "site 2nd s", "gap others s",
                                             "gap rebooting s"))
    for row in rows:
        cells = (row["hosts"], row["upgrade_s"], row["upgrade_per_host_s"], row["site_second_run_s"],
                 row["ping_gap_others_s"], row["ping_gap_rebooting_s"])
        print("%-6d %12.2f %12.2f %12.2f %14.2f %14.2f" % cells)
    print("load average (1 min) before: %.2f" % load)
    print(json.dumps({"labs": rows, "load_before": round(load, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
