"""Benchmark: activate N lab nodes through the agents' pubapi (real swtpm, wireguard-go).

Baseline, measured in the same run: the aTLS handshake + GetState round trip alone (one TPM
quote per handshake) and the activation of one node. Then, for each size of the curve, a lab of its
own (the Coordinator and N Nodes, every agent listening before the clock starts): ActivateAsCoordinator
on h1 and one ``ActivateAdditionalNodes`` call for the N Nodes, until every node is IsNode and every peer
lists every other peer (the mesh converged through GetUpdate).

    python bench/activation.py [--nodes 16] [--curve 4,16,32,64] [--workers 16]

``--workers`` sets the Coordinator's ``activation_workers`` (docs/agent.md; default 16),
``--update-interval`` the Nodes' poll period (default 0.5 s, as the lab runs them). ``--profile`` prints,
per size, where the machine's CPU went from the first activation until the mesh converged (every
process's CPU time from /proc, children it reaped included, by kind: wireguard-go, the Coordinator's
agent, the Nodes' agents, swtpm, other). The last line is one JSON object: nodes, wall_s, per_node_s (the largest size), wall_s_<N> per size of the curve, the
baselines and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent / "collections"), str(Path(__file__).resolve().parent.parent)]
os.environ.setdefault("TSS2_LOG", "all+none")

from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ed25519  # noqa: E402

from lab.agent import start_agent, stop_agent, tail_log, wait_listening  # noqa: E402
from lab.image import lab_measurements  # noqa: E402
from lab.lab import Lab  # noqa: E402
from lab.names import MAX_HOSTS  # noqa: E402
from lab.netns import NetNS  # noqa: E402
from lab.procs import processes_cpu  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils import kms  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import Measurements  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import VTPMValidator  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.agent.pubapi import (  # noqa: E402
    coordinator_policy, fresh_node_policy)

MAX_NODES = MAX_HOSTS - 1


def cpu_by_pid():
    """{pid: (kind, CPU seconds of the process and of the children it reaped)} from /proc."""
    out = {}
    for pid, (comm, cmdline, seconds) in processes_cpu().items():
        if "constellation-agent" in cmdline:
            kind = "agent: Coordinator" if "/hosts/h1/" in cmdline else "agents: Nodes"
        elif comm in ("wireguard-go", "swtpm"):
            kind = comm
        else:
            kind = "other"
        out[pid] = (kind, seconds)
    return out


def cpu_split(before, after):
    """CPU seconds by kind between two cpu_by_pid() snapshots."""
    split = {}
    for pid, (kind, seconds) in after.items():
        spent = seconds - (before[pid][1] if pid in before and before[pid][0] == kind else 0.0)
        split[kind] = split.get(kind, 0.0) + max(spent, 0.0)
    return split


class Bench:
    def __init__(self, lab_name: str, workers: int, update_interval: float = 0.5):
        self.lab_name = lab_name
        self.workers = workers
        self.update_interval = update_interval
        policy = Measurements.from_dict(lab_measurements())
        self.fresh = [VTPMValidator(fresh_node_policy(policy))]
        self.activated = [VTPMValidator(coordinator_policy(policy))]
        self.key = ed25519.Ed25519PrivateKey.generate()
        self.pem = self.key.public_key().public_bytes(serialization.Encoding.PEM,
                                                      serialization.PublicFormat.SubjectPublicKeyInfo).decode()

    def lab(self, hosts: int):
        """A lab of ``hosts`` hosts with every agent listening: (lab, agents, admin namespace, set-up s)."""
        start = time.monotonic()
        lab = Lab(self.lab_name, inventory_dir=None)
        lab.up(hosts=hosts, tpm=True, variant="qemu-vtpm")
        with ThreadPoolExecutor(max_workers=4) as pool:
            procs = list(pool.map(lambda h: start_agent(lab, h, wait=False, update_interval=self.update_interval,
                                                        activation_workers=self.workers), lab.hosts))
        # The clock starts only once every agent listens (an agent still importing answers no SYN).
        for h, p in zip(lab.hosts, procs):
            wait_listening(h, p, timeout=120)
        return lab, procs, NetNS(lab.bridge_netns), time.monotonic() - start

    @staticmethod
    def close(lab, procs, admin) -> None:
        for p in procs:
            stop_agent(p)
        admin.close()
        lab.down()

    def client(self, admin, h, validators):
        return AgentClient.connect(h.public_endpoint, validators, sock=admin.connect((h.public_ip, 9000)))

    def cluster(self, lab, admin, coordinator, nodes):
        """(seconds until every node converged, seconds until ActivateAdditionalNodes returned)."""
        start = time.monotonic()
        with self.client(admin, coordinator, self.fresh) as c:
            c.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), self.pem)
        with self.client(admin, coordinator, self.activated) as c:
            c.admin_auth(self.key)
            result = c.activate_additional_nodes([h.public_endpoint for h in nodes])
        activated_s = time.monotonic() - start
        failed = [r for r in result["nodes"] if not r["ok"]]
        if failed:
            by_endpoint = {h.public_endpoint: h for h in lab.hosts}
            for row in failed:
                print("FAILED %s: %s\n%s" % (row["node_public_endpoint"], row["error"],
                                             tail_log(by_endpoint[row["node_public_endpoint"]], 5)))
            print("Coordinator log:\n%s" % tail_log(coordinator, 10))
            raise SystemExit("activation failed for %d of %d nodes" % (len(failed), len(nodes)))
        members = [coordinator] + list(nodes)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if all(len(h.run(["wg", "show", "wg0", "peers"], check=False).stdout.split()) == len(members) - 1
                   for h in members):
                return time.monotonic() - start, activated_s
            time.sleep(0.1)
        raise SystemExit("the mesh did not converge within 120 s")

    def baselines(self, handshakes: int):
        lab, procs, admin, _setup = self.lab(2)
        try:
            samples = []
            for _handshake in range(handshakes):
                start = time.monotonic()
                with self.client(admin, lab.hosts[-1], self.fresh) as c:
                    c.get_state()
                samples.append(time.monotonic() - start)
            return statistics.median(samples), self.cluster(lab, admin, lab.hosts[0], [lab.hosts[1]])[0]
        finally:
            self.close(lab, procs, admin)

    def size(self, n: int):
        """(wall s, activated s, lab set-up s, CPU seconds by kind during the activation)."""
        lab, procs, admin, setup_s = self.lab(n + 1)
        try:
            before = cpu_by_pid()
            wall_s, activated_s = self.cluster(lab, admin, lab.hosts[0], lab.hosts[1:n + 1])
            return wall_s, activated_s, setup_s, cpu_split(before, cpu_by_pid())
        finally:
            self.close(lab, procs, admin)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=16, help="1..%d" % MAX_NODES)
    parser.add_argument("--curve", default="", help="comma-separated sizes, e.g. 4,16,32,64 (instead of --nodes)")
    parser.add_argument("--workers", type=int, default=None, help="the Coordinator's activation_workers")
    parser.add_argument("--update-interval", type=float, default=0.5,
                        help="the Nodes' GetUpdate poll period in s (default %(default)s, as the lab runs them)")
    parser.add_argument("--profile", action="store_true", help="print where the CPU went, per size")
    parser.add_argument("--handshakes", type=int, default=20)
    parser.add_argument("--lab", default="bact", help="lab name (namespaces and state directory)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.curve.split(",") if s.strip()] if args.curve else [args.nodes]
    if not all(1 <= s <= MAX_NODES for s in sizes):
        parser.error("node counts must be within 1..%d (the lab has at most %d hosts)" % (MAX_NODES, MAX_HOSTS))
    bench = Bench(args.lab, args.workers, args.update_interval)
    load_before = os.getloadavg()
    handshake_p50, one_node_s = bench.baselines(args.handshakes)
    print("load average before: %.2f %.2f %.2f (2 cores)" % load_before)
    print("baseline  aTLS handshake + GetState p50: %8.4f s" % handshake_p50)
    print("baseline  activation of 1 coordinator + 1 node: %8.3f s" % one_node_s)
    result = {}
    for n in sizes:
        wall_s, activated_s, setup_s, split = bench.size(n)
        print("activation of %2d nodes by the Coordinator: %8.3f s wall (%.3f s until ActivateAdditionalNodes "
              "returned, the rest the mesh converging), %.3f s per node (%.2f x the one-node baseline; lab set-up "
              "%.1f s, not counted)" % (n, wall_s, activated_s, wall_s / n, wall_s / one_node_s, setup_s))
        result["wall_s_%d" % n] = round(wall_s, 3)
        result["activated_s_%d" % n] = round(activated_s, 3)
        if args.profile:
            total = sum(split.values())
            print("  CPU from the first activation until converged: %.2f s on %d cores (%.0f %% of them): %s"
                  % (total, os.cpu_count(), 100 * total / wall_s / os.cpu_count(),
                     ", ".join("%s %.2f s" % kv for kv in sorted(split.items(), key=lambda kv: -kv[1]))))
            result["cpu_s_%d" % n] = {kind: round(value, 2) for kind, value in split.items()}
    largest = max(sizes)
    print("load average after: %.2f %.2f %.2f" % os.getloadavg())
    print(json.dumps(dict({"nodes": largest, "wall_s": result["wall_s_%d" % largest],
                           "per_node_s": round(result["wall_s_%d" % largest] / largest, 4),
                           "baseline_handshake_p50_s": round(handshake_p50, 4),
                           "baseline_one_node_s": round(one_node_s, 3),
                           "activation_workers": args.workers or 16,
                           "load_avg_1m_before": round(load_before[0], 2)}, **result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
