# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""bench/site.py's arguments and its JSON line's keys (no lab, no timing: the figures are the bench's)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.support import ROOT


def _bench():
    spec = importlib.util.spec_from_file_location("bench_site", ROOT / "bench" / "site.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sizes_are_parsed_and_bounded():
    bench = _bench()
    assert bench.parse_args(["--sizes", "4,16,64"]).sizes == [4, 16, 64]
    assert bench.parse_args([]).sizes == [4, 16]
    for wrong in (["--sizes", "1"], ["--sizes", "4,x"], ["--sizes", "500"], ["--repeat", "0"], ["--forks", "-1"]):
        with pytest.raises(SystemExit):
            bench.parse_args(wrong)


def test_the_json_line_has_the_keys_per_size(capsys):
    bench = _bench()
    args = bench.parse_args(["--sizes", "4,16", "--repeat", "2"])
    rows = [{"size": n, "setup_s": 1.0, "load": 0.5, "first": 3.0 * n, "first_changed": n, "seconds": [2.0 * n, 2.2 * n],
             "pings": [1.0 * n, 1.1 * n], "changed": 0, "cpu": {"agents": 1.0}, "tasks": [(0.5, "Attest")]}
            for n in (4, 16)]
    summary = json.loads(json.dumps(bench.report(rows, args)))
    for n in (4, 16):
        assert summary["second_vs_ping_%d" % n] == 2.0
        assert summary["first_vs_second_%d" % n] == 1.5
        assert summary["per_host_s_%d" % n] == 2.0
        assert summary["second_run_s_%d" % n] == [2.0 * n, 2.2 * n]
        for key in ("first_run_s", "ping_s", "second_run_changed", "load", "cpu_s"):
            assert "%s_%d" % (key, n) in summary
    assert summary["sizes"] == [4, 16]
    assert "16-host lab" in capsys.readouterr().out
