"""The pod network over the attested mesh: pod-to-pod throughput (iperf3) and latency (ping)
across two hosts, beside two baselines measured in the same run, on the same two hosts:

- ``pod``: pod a on h1 to pod b on h2 (lab pods, lab/pods.py: the CNI plugins with each node's conflist):
  veth, ``cni0``, the route ``cluster_pod_cidr dev wg0``, WireGuard, the underlay, and back up on h2;
- ``wg0``: h1 to h2 over their VPN IPs (WireGuard alone);
- ``underlay``: h1 to h2 over their public IPs (the lab's plain veth pairs and bridge, nothing encrypted).

The three paths run interleaved, round after round (``--rounds``), so that the machine's load falls on all
of them alike; each figure is the median of its rounds. Then 50 more pod pings while tcpdump captures the
underlay (lab/capture.py): how many frames it saw, how many were WireGuard, how many named a pod address. The lab runs wireguard-go in userspace, so the ratios
matter more than the absolute figures: ``pod_vs_wg0`` is the price of the pod hop (a veth and a bridge on each
side), ``wg0_vs_underlay`` the price of WireGuard in userspace.

Setup: a lab of 2 hosts with agents, site.yml (which applies the pod network, tag podnet), then one pod per
host. ``--no-pods``: site.yml with ``constellation_pod_network=false`` and the baselines alone; without a conflist
on the hosts after site.yml the ``pod`` path is left out too, and the result says so.

    python bench/podnet.py [--rounds 3] [--seconds 5] [--pings 200] [--no-pods] [--keep]

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "collections"), str(Path(__file__).resolve().parents[1])]

from ansible_collections.constellation.cluster.plugins.module_utils.pod_network.conflist import CLUSTER_POD_CIDR  # noqa: E402
from lab import pods  # noqa: E402
from lab.capture import UnderlayCapture, not_wireguard, with_addresses_in  # noqa: E402
from lab.lab import Lab  # noqa: E402
from lab.names import LabError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = ROOT / ".venv" / "bin"
IPERF_PORT = 5201


def play(inv: Path, playbook: Path, *extra: str) -> float:
    env = dict(os.environ, PATH="%s:%s" % (VENV_BIN, os.environ.get("PATH", "")),
               ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    started = time.monotonic()
    proc = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inv / "hosts.yml"), str(playbook),
                           "--vault-password-file", str(inv / "vault_pass"),
                           "-e", "ansible_python_interpreter=%s" % (VENV_BIN / "python")] + list(extra),
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode != 0:
        sys.exit("%s failed:\n%s\n%s" % (playbook.name, proc.stdout[-3000:], proc.stderr[-3000:]))
    return time.monotonic() - started


def address(h, iface: str) -> str:
    out = h.run(["ip", "-4", "-o", "addr", "show", iface], check=False).stdout
    match = re.search(r"inet (\d+\.\d+\.\d+\.\d+)", out)
    if not match:
        raise LabError("%s has no IPv4 address on %s" % (h.name, iface))
    return match.group(1)


class Path2:
    """One path between two endpoints: how to run a command at each end, and the server's address."""

    def __init__(self, name, client_run, server_popen, server_ip):
        self.name, self.client_run, self.server_popen, self.server_ip = name, client_run, server_popen, server_ip

    def iperf(self, seconds: int) -> float:
        """Gbit/s received by the server, TCP, one stream, ``seconds`` long."""
        # --forceflush: "Server listening" reaches the pipe at once (iperf3 buffers its output otherwise).
        argv = ["iperf3", "-s", "-1", "--forceflush", "-B", self.server_ip, "-p", str(IPERF_PORT)]
        server = self.server_popen(argv,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            for line in server.stdout:  # "Server listening on 5201"
                if "listening" in line:
                    break
            out = self.client_run(["iperf3", "-c", self.server_ip, "-p", str(IPERF_PORT), "-t", str(seconds), "-J"])
            result = json.loads(out.stdout)
            if "error" in result:
                raise LabError("%s: iperf3: %s" % (self.name, result["error"]))
            return result["end"]["sum_received"]["bits_per_second"] / 1e9
        finally:
            server.wait(timeout=30)
            server.stdout.close()

    def ping(self, count: int) -> dict:
        """Round trips of ``count`` pings 10 ms apart: median and p99, ms."""
        out = self.client_run(["ping", "-n", "-c", str(count), "-i", "0.01", "-W", "2", self.server_ip]).stdout
        times = sorted(float(t) for t in re.findall(r"time=([\d.]+) ms", out))
        if not times:
            raise LabError("%s: no ping reply from %s" % (self.name, self.server_ip))
        return {"p50": statistics.median(times), "p99": times[min(len(times) - 1, int(len(times) * 0.99))],
                "lost": count - len(times)}


def load() -> float:
    return os.getloadavg()[0]


def measure(args) -> dict:
    lab = Lab("bpod")
    inv = Path(lab.inventory_dir)
    try:
        lab.up(hosts=2, tpm=True, agents=True)
        site_s = play(inv, ROOT / "site.yml", *(["-e", "constellation_pod_network=false"] if args.no_pods else []))
        h1, h2 = lab.hosts
        paths = [Path2("underlay", h1.run, h2.popen, h2.public_ip),
                 Path2("wg0", h1.run, h2.popen, address(h2, "wg0"))]
        missing = None
        if args.no_pods:
            missing = "--no-pods: site.yml without the pod network; pod path left out"
        elif h1.run(["test", "-e", pods.CONFLIST_PATH], check=False).returncode != 0:
            missing = "no %s on the hosts after site.yml: the pod network is not applied; pod path left out" \
                      % pods.CONFLIST_PATH
        else:
            a, b = lab.pod_add("h1", "a"), lab.pod_add("h2", "b")
            paths.insert(0, Path2("pod", lambda argv: lab.pod_run("h1", "a", argv),
                                  lambda argv, **kw: pods.popen(h2, "b", argv, **kw), b["ip"]))
            print("pods: a %s on h1, b %s on h2" % (a["cidr"], b["cidr"]))
        if missing:
            print(missing)
        load_before = load()
        gbps = {p.name: [] for p in paths}
        rtt = {p.name: [] for p in paths}
        for round_ in range(args.rounds):
            for p in paths:
                gbps[p.name].append(p.iperf(args.seconds))
                rtt[p.name].append(p.ping(args.pings))
            done = ["%s %.3f Gbit/s %.3f ms" % (p.name, gbps[p.name][-1], rtt[p.name][-1]["p50"]) for p in paths]
            print("round %d: %s" % (round_ + 1, ", ".join(done)))
        load_after = load()
        seen = {}
        if paths[0].name == "pod":  # what the underlay carried of the pods' pings: WireGuard only
            with UnderlayCapture(lab) as capture:
                paths[0].ping(50)
            packets = capture.packets
            seen = {"capture_frames": len(packets), "capture_wireguard_frames": len(packets) - len(not_wireguard(packets)),
                    "capture_frames_with_pod_addresses": len(with_addresses_in(packets, CLUSTER_POD_CIDR))}
            print("underlay during 50 pod pings: %(capture_frames)d frames, %(capture_wireguard_frames)d WireGuard, "
                  "%(capture_frames_with_pod_addresses)d with a pod address" % seen)
        result = {"hosts": 2, "rounds": args.rounds, "seconds": args.seconds, "pings": args.pings,
                  "site_first_run_s": round(site_s, 1), "load_before": round(load_before, 2),
                  "load_after": round(load_after, 2)}
        for name in gbps:
            result["%s_gbps" % name] = round(statistics.median(gbps[name]), 3)
            result["%s_rtt_p50_ms" % name] = round(statistics.median(r["p50"] for r in rtt[name]), 3)
            result["%s_rtt_p99_ms" % name] = round(statistics.median(r["p99"] for r in rtt[name]), 3)
            result["%s_ping_lost" % name] = sum(r["lost"] for r in rtt[name])
        if "pod_gbps" in result:
            result["pod_vs_wg0_throughput"] = round(result["pod_gbps"] / result["wg0_gbps"], 3)
            result["pod_vs_wg0_rtt"] = round(result["pod_rtt_p50_ms"] / result["wg0_rtt_p50_ms"], 3)
        result["wg0_vs_underlay_throughput"] = round(result["wg0_gbps"] / result["underlay_gbps"], 3)
        result["wg0_vs_underlay_rtt"] = round(result["wg0_rtt_p50_ms"] / result["underlay_rtt_p50_ms"], 3)
        result.update(seen)
        if missing:
            result["pod_missing"] = missing
        return result
    finally:
        if not args.keep:
            lab.down()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=int, default=5, help="iperf3 duration per path and round")
    p.add_argument("--pings", type=int, default=200, help="pings per path and round (10 ms apart)")
    p.add_argument("--no-pods", action="store_true", help="the baselines alone (site.yml without the pod network)")
    p.add_argument("--keep", action="store_true", help="leave the lab (bpod) up afterwards")
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/podnet.py needs root (the lab's network namespaces)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("bench/podnet.py: terminated"))  # the lab comes down
    result = measure(args)
    print("%-9s %12s %12s %12s" % ("path", "Gbit/s", "rtt p50 ms", "rtt p99 ms"))
    for name in ("pod", "wg0", "underlay"):
        if "%s_gbps" % name in result:
            print("%-9s %12.3f %12.3f %12.3f" % (name, result["%s_gbps" % name], result["%s_rtt_p50_ms" % name],
                                                 result["%s_rtt_p99_ms" % name]))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
