# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Constellation's verification service on real lab agents (swtpm, network namespaces), attested by
the constellation_verify module in a real ansible-playbook run over both transports (docs/verify.md).

h1: an agent on the project's Python; h2: an agent on Debian's Python (python3-grpcio 1.51,
python3-protobuf 3.21, as the node_agent role runs it); h3: a host whose boot chain measured something
else (PCR 9). Attacks: h3 is refused naming PCR 9; a process on h1 that replays a genuine answer of
h1's agent, recorded for another nonce, is refused over both transports."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lab.agent import start_agent, stop_agent, tail_log
from lab.image import lab_measurements
from lab.lab import Lab
from lab.netns import NetNS
from tests.support import ROOT
from tests.support.playbook import run_tasks
from tests.support.wait import until as wait_until
from ansible_collections.constellation.cluster.plugins.module_utils.agent import verify_service as vs

pytestmark = pytest.mark.lab

VENV_BIN = ROOT / ".venv" / "bin"
PYTHON = str(VENV_BIN / "python") if (VENV_BIN / "python").exists() else sys.executable
SYSTEM_PYTHON = "/usr/bin/python3"
REPLAY_GRPC_PORT, REPLAY_HTTP_PORT = 9190, 8180
# A compromised process on h1: answers every request with one recorded, genuine answer.
REPLAYER = """
import sys, time
from ansible_collections.constellation.cluster.plugins.module_utils.agent import verify_service as vs
recorded = open(sys.argv[1], "rb").read()
servers = [vs.GRPCVerifyServer(("0.0.0.0", %d), lambda user_data, nonce: recorded).start(),
           vs.HTTPVerifyServer(("0.0.0.0", %d), lambda user_data, nonce: recorded).start()]
print("ready", flush=True)
time.sleep(120)
""" % (REPLAY_GRPC_PORT, REPLAY_HTTP_PORT)


@pytest.fixture(scope="module")
def tvs(tmp_path_factory):
    lab = Lab("tvs", inventory_dir=None)
    lab.up(hosts=3, tpm=True, variant="qemu-vtpm")
    lab.tamper("h3")
    procs = {}
    try:
        procs["h1"] = start_agent(lab, lab.host("h1"))
        lab.host_python = lambda: [SYSTEM_PYTHON]  # h2's agent on Debian's Python
        procs["h2"] = start_agent(lab, lab.host("h2"))
        del lab.host_python
        procs["h3"] = start_agent(lab, lab.host("h3"))
        yield lab, tmp_path_factory.mktemp("tvs"), procs
    finally:
        for proc in procs.values():
            stop_agent(proc)
        lab.down()


def _replayer(lab, tmp):
    """Records h1's genuine answer for a nonce of its own, then replays it from h1 (ports 9190/8180)."""
    h1 = lab.host("h1")
    with NetNS(lab.bridge_netns) as admin:
        recorded = admin.run(vs.fetch_attestation, "%s:%d" % (h1.public_ip, vs.HTTP_PORT), os.urandom(32), "http")
    (tmp / "recorded.json").write_bytes(recorded)
    proc = h1.popen(["env", "PYTHONPATH=%s" % (ROOT / "collections"), PYTHON, "-c", REPLAYER,
                     str(tmp / "recorded.json")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise AssertionError("the replaying process did not start: %s%s" % (line, proc.stdout.read()))
    return proc


def _verify(host, port, transport, register, ignore_errors=False):
    task = {"name": "%s %s" % (register, transport), "register": register, "ignore_errors": ignore_errors,
            "constellation.cluster.constellation_verify": {"endpoint": "%s:%d" % (host.public_ip, port),
                                                           "transport": transport}}
    return task


def test_constellation_verify_attests_real_agents_and_refuses_attacks(tvs):
    lab, tmp, procs = tvs
    # h2's agent runs on Debian's Python (nsenter and env exec it in place: the same process).
    assert os.path.realpath("/proc/%d/exe" % procs["h2"].pid) == os.path.realpath(SYSTEM_PYTHON)
    h1, h2, h3 = (lab.host(name) for name in ("h1", "h2", "h3"))
    policy = dict(lab_measurements(), **{"15": {"expected": "00" * 32, "warnOnly": False}})
    (tmp / "measurements.json").write_text(json.dumps(policy))
    replayer = _replayer(lab, tmp)
    try:
        tasks = []
        for transport, port in (("grpc", vs.GRPC_PORT), ("http", vs.HTTP_PORT)):
            tasks += [_verify(h1, port, transport, "h1_" + transport), _verify(h2, port, transport, "h2_" + transport),
                      _verify(h3, port, transport, "h3_" + transport, ignore_errors=True)]
        tasks += [_verify(h1, REPLAY_GRPC_PORT, "grpc", "replay_grpc", ignore_errors=True),
                  _verify(h1, REPLAY_HTTP_PORT, "http", "replay_http", ignore_errors=True)]
        # The action group's defaults reach the module (meta/runtime.yml).
        play = {"module_defaults": {"group/constellation.cluster.attestation": {
            "measurements_file": str(tmp / "measurements.json"), "variant": "qemu-vtpm",
            "insecure_trust_any_ak": True, "netns": lab.bridge_netns}}}
        proc = run_tasks(tmp, tasks, play=play, python=PYTHON, env={"TSS2_LOG": "all+none"})
    finally:
        replayer.kill()
        replayer.wait(timeout=10)
    assert proc.returncode == 0, proc.stdout[-4000:]
    results = {task["register"]: proc.results()[task["name"]] for task in tasks}

    # The genuine agents pass over both transports, on both Pythons, with the table of verify.yml.
    for name in ("h1_grpc", "h1_http", "h2_grpc", "h2_http"):
        result = results[name]
        assert not result.get("failed"), (name, result.get("msg"), tail_log(h2))
        assert [(row["index"], row["ok"]) for row in result["pcrs"]] == [(int(i), True) for i in sorted(policy, key=int)]
        assert result["table"][0].split() == ["endpoint", "PCR", "expected", "found", "match", "verdict"]
        assert all(line.split()[-1] == "ok" for line in result["table"][1:])
    assert results["h1_grpc"]["nonce"] != results["h1_http"]["nonce"]  # a fresh nonce per run
    # Two hosts, two TPMs: different attestation keys, same measured image.
    assert results["h1_grpc"]["measurements"]["9"] == results["h2_grpc"]["measurements"]["9"]

    # A host whose boot chain differs is refused over both transports, naming PCR 9.
    for name in ("h3_grpc", "h3_http"):
        result = results[name]
        assert result["failed"] and "refused" in result["msg"] and "PCR 9: expected" in result["msg"], result["msg"]
        assert [row["index"] for row in result["pcrs"] if not row["ok"]] == [9]
        assert any(line.split()[-2:] == ["NO", "FAIL"] for line in result["table"])

    # A genuine answer replayed for another nonce is refused over both transports.
    for name in ("replay_grpc", "replay_http"):
        result = results[name]
        assert result["failed"] and "does not match the nonce binding" in result["msg"], result["msg"]
        assert result["pcrs"] == []

    # The agents logged what they served (JSON lines; never key material).
    def served():
        events = [json.loads(line) for line in (h1.dir / "agent" / "agent.log").read_text().splitlines()
                  if line.startswith("{")]
        return {(e.get("event"), e.get("server")) for e in events}
    assert wait_until(lambda: {("verify_issued", "verify-grpc"), ("verify_issued", "verify-http"),
                               ("listening", "verify-grpc"), ("listening", "verify-http")} <= served(),
                      timeout=5, what="h1's verify log events")
