"""Benchmark: activate N lab nodes through the agents' pubapi (real swtpm, wireguard-go).

Baseline, measured in the same run: the aTLS handshake + GetState round trip alone (one TPM
quote per handshake) and the activation of one node. Then: ActivateAsCoordinator on h1 and one
``ActivateAdditionalNodes`` call for N further hosts (the Nodes), until every node is IsNode and every
peer lists every other peer (the mesh converged through GetUpdate).

    python bench/activation.py [--nodes 16]

The last line is one JSON object: nodes, wall_s, per_node_s (plus the baselines).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent / "collections"), str(Path(__file__).resolve().parent.parent)]
os.environ.setdefault("TSS2_LOG", "all+none")

from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ed25519  # noqa: E402

from lab.agent import start_agent, stop_agent  # noqa: E402
from lab.lab import Lab, lab_measurements  # noqa: E402
from lab.netns import NetNS  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils import kms  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import Measurements  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import VTPMValidator  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.pubapi import (  # noqa: E402
    coordinator_policy, fresh_node_policy)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--handshakes", type=int, default=20)
    args = parser.parse_args()
    n = args.nodes
    lab = Lab("bench", inventory_dir=None)
    procs = []
    admin = None
    try:
        t0 = time.monotonic()
        lab.up(hosts=n + 3, tpm=True, variant="qemu-vtpm")  # the Coordinator, n Nodes, and a pair for the one-node baseline
        for h in lab.hosts:
            procs.append(start_agent(lab, h, wait=False, update_interval=0.5))
        from lab.agent import wait_listening
        for h, p in zip(lab.hosts, procs):
            wait_listening(h, p)
        setup_s = time.monotonic() - t0
        admin = NetNS(lab.bridge_netns)
        policy = Measurements.from_dict(lab_measurements())
        fresh = [VTPMValidator(fresh_node_policy(policy))]
        activated = [VTPMValidator(coordinator_policy(policy))]
        key = ed25519.Ed25519PrivateKey.generate()
        pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                            serialization.PublicFormat.SubjectPublicKeyInfo).decode()

        def client(h, validators):
            return AgentClient.connect(h.public_endpoint, validators, sock=admin.connect((h.public_ip, 9000)))

        def cluster(coordinator, nodes):
            start = time.monotonic()
            with client(coordinator, fresh) as c:
                c.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), pem)
            with client(coordinator, activated) as c:
                c.admin_auth(key)
                result = c.activate_additional_nodes([h.public_endpoint for h in nodes])
            failed = [r for r in result["nodes"] if not r["ok"]]
            if failed:
                raise SystemExit("activation failed: %s" % failed)
            members = [coordinator] + list(nodes)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if all(len(h.run(["wg", "show", "wg0", "peers"], check=False).stdout.split()) == len(members) - 1
                       for h in members):
                    return time.monotonic() - start
                time.sleep(0.1)
            raise SystemExit("the mesh did not converge within 120 s")

        hosts = lab.hosts
        # Baseline 1: aTLS handshake (one TPM quote + validation) and one GetState round trip.
        samples = []
        for _handshake in range(args.handshakes):
            start = time.monotonic()
            with client(hosts[-1], fresh) as c:
                c.get_state()
            samples.append(time.monotonic() - start)
        handshake_p50 = statistics.median(samples)
        # Baseline 2: a cluster of one coordinator and one node.
        one_node_s = cluster(hosts[-2], [hosts[-1]])
        # The measurement: Coordinator h1 activates n Nodes.
        wall_s = cluster(hosts[0], hosts[1:n + 1])
        print("lab set-up (%d hosts, agents listening): %.2f s" % (len(hosts), setup_s))
        print("baseline  aTLS handshake + GetState p50: %8.4f s" % handshake_p50)
        print("baseline  activation of 1 coordinator + 1 node: %8.3f s" % one_node_s)
        print("activation of %d nodes by the Coordinator: %8.3f s wall, %.3f s per node" % (n, wall_s, wall_s / n))
        print(json.dumps({"nodes": n, "wall_s": round(wall_s, 3), "per_node_s": round(wall_s / n, 4),
                          "baseline_handshake_p50_s": round(handshake_p50, 4),
                          "baseline_one_node_s": round(one_node_s, 3)}))
        return 0
    finally:
        for p in procs:
            stop_agent(p)
        if admin is not None:
            admin.close()
        lab.down()


if __name__ == "__main__":
    sys.exit(main())
