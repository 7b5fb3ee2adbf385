# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What sealing the secrets at rest costs (docs/agent.md, "Secrets at rest"), against a real swtpm, beside its
baseline in the same run: an agent start's measurement and unseal against a plain start, and a store write and
read sealed (AES-256-GCM) against the plain JSON file store. Bounded loops, loopback only, a few seconds.

Prints one row per figure (p50 and p99 in ms) and ends with one JSON line.

Usage: python bench/sealing.py [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path[:0] = [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "collections"),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
os.environ.setdefault("TSS2_LOG", "all+none")

# pylint: disable=wrong-import-position
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import agent_measurement, tpm  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.core.at_rest import SEALED_KEY_FILE, SealedStorage  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.store import FileStore  # noqa: E402
from lab.swtpm import SwTPM, free_port  # noqa: E402

PCRS = [4, 9, 11, 13]
VALUE = b"x" * 2048  # about a node state and a KMS entry


def _ms(samples):
    ordered = sorted(samples)
    return round(statistics.median(ordered) * 1000, 3), round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 3)


def _timed(rounds, step):
    samples = []
    for index in range(rounds):
        start = time.perf_counter()
        step(index)
        samples.append(time.perf_counter() - start)
    return samples


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args(argv)
    rounds = max(5, min(args.rounds, 1000))
    work = tempfile.mkdtemp(prefix="bench-sealing-")
    swtpm = SwTPM(os.path.join(work, "tpm"), free_port()).start()
    try:
        def factory():
            return tpm.open_tpm(swtpm.tcti)

        state = os.path.join(work, "state")
        os.makedirs(state)
        SealedStorage.open(state, factory, PCRS)  # the first start seals the key
        sealed = SealedStorage.open(state, factory, PCRS)
        rows = {
            # The start: the agent's code digest (cached after the first in a process) and its measurement read.
            "code_digest": _timed(rounds, lambda i: agent_measurement._CACHE.clear() or agent_measurement.code_digest()),  # pylint: disable=protected-access
            "open_tpm_baseline": _timed(rounds, lambda i: factory().__enter__().close()),
            "unseal_at_start": _timed(rounds, lambda i: SealedStorage.open(state, factory, PCRS)),
            "seal_first_start": _timed(rounds, lambda i: (os.unlink(os.path.join(state, SEALED_KEY_FILE)),
                                                          SealedStorage.open(state, factory, PCRS))),
        }
        plain = FileStore(os.path.join(work, "plain.json"))
        secret = FileStore(os.path.join(work, "sealed.json"), cipher=sealed)
        rows["store_put_plain"] = _timed(rounds, lambda i: plain.put("k%d" % (i % 8), VALUE + b"%d" % i))
        rows["store_put_sealed"] = _timed(rounds, lambda i: secret.put("k%d" % (i % 8), VALUE + b"%d" % i))
        rows["store_reopen_plain"] = _timed(rounds, lambda i: FileStore(plain.path).get("k0"))
        rows["store_reopen_sealed"] = _timed(rounds, lambda i: FileStore(secret.path, cipher=sealed).get("k0"))
    finally:
        swtpm.stop()
        shutil.rmtree(work, ignore_errors=True)
    figures = {}
    print("%-22s %10s %10s" % ("figure", "p50 ms", "p99 ms"))
    for name, samples in rows.items():
        p50, p99 = _ms(samples)
        figures[name + "_p50_ms"] = p50
        print("%-22s %10.3f %10.3f" % (name, p50, p99))
    figures["store_put_sealed_vs_plain"] = round(figures["store_put_sealed_p50_ms"] / figures["store_put_plain_p50_ms"], 2)
    figures["start_unseal_vs_open_tpm"] = round(figures["unseal_at_start_p50_ms"] / figures["open_tpm_baseline_p50_ms"], 2)
    print(json.dumps(figures, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
