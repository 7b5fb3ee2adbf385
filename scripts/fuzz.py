# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``make fuzz``: every parser of untrusted data, at least 100,000 mutated inputs each.

The targets, seeds and mutators are those of the fuzz tests (tests/unit/fuzz/targets.py): the
attestation document is issued by a real swtpm first. A plain random mutation loop per parser,
seeded (``--seed``) so a run can be repeated, spread over ``--jobs`` processes. Prints per parser
the count, the rate and the number of foreign exceptions (anything but the project's documented
errors, or an error text holding secret material), with a few examples; exits 1 if there is any.
Bounded: it stops after ``--count`` inputs per parser; no network.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import sys
import tempfile
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "collections"), ROOT]

from ansible_collections.constellation.cluster.tests.unit.fuzz import targets as fuzz_targets  # noqa: E402 pylint: disable=wrong-import-position

_CORPUS = None


def _where(err: BaseException) -> str:
    frames = traceback.extract_tb(err.__traceback__)
    return "%s:%d" % (os.path.relpath(frames[-1].filename, ROOT), frames[-1].lineno) if frames else "?"


def run_target(job):
    """One parser: ``count`` inputs from its seeds; returns (name, count, seconds, foreign, examples)."""
    name, count, seed = job
    target = {t.name: t for t in fuzz_targets.make_targets(_CORPUS)}[name]
    rng = random.Random("%s/%d" % (name, seed))
    foreign = 0
    examples = {}
    started = time.monotonic()
    try:
        for _unused in range(count):
            data = target.input_from(rng)
            err = fuzz_targets.check(target, data)
            if err is not None:
                foreign += 1
                key = (type(err).__name__, _where(err))
                if key not in examples and len(examples) < 5:
                    examples[key] = "%s: %s | input %s" % (type(err).__name__, str(err)[:160], repr(data)[:200])
    finally:
        for cleanup in target.cleanup:
            cleanup()
    return name, count, time.monotonic() - started, foreign, list(examples.values())


def main(argv=None) -> int:
    global _CORPUS  # pylint: disable=global-statement
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--count", type=int, default=100000, help="inputs per parser (default 100000)")
    parser.add_argument("--seed", type=int, default=14, help="random seed of the mutations")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes")
    parser.add_argument("--only", action="append", default=[], help="run only this parser (repeatable)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TSS2_LOG", "all+none")
    with tempfile.TemporaryDirectory(prefix="constellation-fuzz-") as workdir:
        started = time.monotonic()
        _CORPUS = fuzz_targets.build_corpus(workdir)
        names = [t.name for t in fuzz_targets.make_targets(_CORPUS)]
        for target_name in args.only:
            if target_name not in names:
                parser.error("unknown parser %s (one of %s)" % (target_name, ", ".join(names)))
        slow_first = sorted(names, key=lambda n: n not in ("policy_file", "agent_config", "attestation_document"))
        jobs = [(n, args.count, args.seed) for n in slow_first if not args.only or n in args.only]
        print("fuzz: %d parsers x %d inputs, seed %d, %d processes; corpus: a %d-byte attestation document from swtpm"
              % (len(jobs), args.count, args.seed, args.jobs, len(_CORPUS.document)), flush=True)
        print("%-22s %10s %12s %8s" % ("parser", "inputs", "inputs/s", "foreign"), flush=True)
        total_foreign = 0
        # fork: the workers inherit the corpus (and the validator) built above
        with multiprocessing.get_context("fork").Pool(max(1, args.jobs)) as pool:
            for name, count, seconds, foreign, examples in pool.imap_unordered(run_target, jobs):
                total_foreign += foreign
                print("%-22s %10d %12.0f %8d" % (name, count, count / max(seconds, 1e-9), foreign), flush=True)
                for example in examples:
                    print("    " + example, flush=True)
    print("fuzz: %s in %.0f s" % ("clean" if not total_foreign else "%d foreign exception(s)" % total_foreign,
                                  time.monotonic() - started))
    return 1 if total_foreign else 0


if __name__ == "__main__":
    sys.exit(main())
