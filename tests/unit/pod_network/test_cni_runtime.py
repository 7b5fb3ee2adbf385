"""cni.py runs a conflist as a container runtime does (the CNI specification, "network configuration lists"):
ADD in order with each plugin handed the previous result, DEL in reverse with the cached ADD result, a failed ADD
undone, errors naming the plugin. The plugins here are small recording programs that speak the protocol; the
real plugins run in tests/integration/test_pod_network.py."""

from __future__ import annotations

import json
import os
import sys

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.command import CommandRunner
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.pod_network.cni import CNI, CNIError, result_addresses

RECORDER = r'''#!%s
import json, os, sys
kind = os.path.basename(sys.argv[0])
conf = json.load(sys.stdin)
env = {k: v for k, v in os.environ.items() if k.startswith("CNI_")}
with open(os.environ["RECORD_LOG"], "a") as log:
    log.write(json.dumps({"kind": kind, "env": env, "conf": conf}) + "\n")
if os.environ.get("RECORD_FAIL") == kind + " " + env["CNI_COMMAND"]:
    print(json.dumps({"cniVersion": "1.0.0", "code": 11, "msg": "no room", "details": "pool empty"}))
    sys.exit(1)
if env["CNI_COMMAND"] == "ADD":
    result = conf.get("prevResult") or {"cniVersion": "1.0.0", "interfaces": [], "ips": []}
    result["interfaces"].append({"name": kind, "sandbox": env["CNI_NETNS"]} if kind == "bridge" else {"name": kind})
    if kind == "bridge":
        result["ips"].append({"interface": len(result["interfaces"]) - 1, "address": "10.244.1.2/24"})
    print(json.dumps(result))
'''

CONFLIST = {"cniVersion": "1.0.0", "name": "constellation", "plugins": [
    {"type": "bridge", "bridge": "cni0"},
    {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
    {"type": "loopback"},
]}


@pytest.fixture
def recorded(tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    for kind in ("bridge", "portmap", "loopback"):
        path = plugins / kind
        path.write_text(RECORDER % sys.executable)
        os.chmod(path, 0o755)
    log = tmp_path / "log"

    def make(fail: str = "") -> CNI:
        runner = CommandRunner(env={"RECORD_LOG": str(log), "RECORD_FAIL": fail})
        return CNI(runner, cni_path="%s:%s" % (tmp_path / "empty", plugins), cache_dir=str(tmp_path / "cache"))

    def calls():
        if not log.exists():
            return []
        found = [json.loads(line) for line in log.read_text().splitlines()]
        log.unlink()
        return found

    return make, calls, tmp_path


def test_add_chains_prev_result_and_del_runs_in_reverse_with_the_cached_result(recorded):
    make, calls, tmp_path = recorded
    cni = make()
    capabilities = {"portMappings": [{"hostPort": 80}], "bandwidth": {}}
    result = cni.add(CONFLIST, "pod-1", "/run/netns/cnpod", capability_args=capabilities)
    assert [i["name"] for i in result["interfaces"]] == ["bridge", "portmap", "loopback"]
    assert result_addresses(result) == ["10.244.1.2/24"]
    added = calls()
    assert [(c["kind"], c["env"]["CNI_COMMAND"]) for c in added] == [("bridge", "ADD"), ("portmap", "ADD"),
                                                                     ("loopback", "ADD")]
    first = added[0]
    assert first["env"] == {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "pod-1", "CNI_NETNS": "/run/netns/cnpod",
                            "CNI_IFNAME": "eth0", "CNI_PATH": cni.cni_path, "CNI_ARGS": ""}
    assert first["conf"] == {"type": "bridge", "bridge": "cni0", "name": "constellation", "cniVersion": "1.0.0"}
    # Each later plugin gets what the one before returned; only portmap declares portMappings.
    assert [i["name"] for i in added[1]["conf"]["prevResult"]["interfaces"]] == ["bridge"]
    assert [i["name"] for i in added[2]["conf"]["prevResult"]["interfaces"]] == ["bridge", "portmap"]
    assert added[1]["conf"]["runtimeConfig"] == {"portMappings": [{"hostPort": 80}]}
    assert "runtimeConfig" not in added[0]["conf"] and "runtimeConfig" not in added[2]["conf"]
    cache = tmp_path / "cache" / "constellation-pod-1-eth0"
    entry = json.loads(cache.read_text())
    assert entry["kind"] == "cniCacheV1" and entry["result"] == result

    cni.delete(CONFLIST, "pod-1", "/run/netns/cnpod")
    deleted = calls()
    assert [(c["kind"], c["env"]["CNI_COMMAND"]) for c in deleted] == [("loopback", "DEL"), ("portmap", "DEL"),
                                                                       ("bridge", "DEL")]
    assert all(c["conf"]["prevResult"] == result for c in deleted)
    assert not cache.exists()
    cni.delete(CONFLIST, "pod-1", "")  # again, the namespace gone: still runs, without a prevResult
    again = calls()
    assert [c["kind"] for c in again] == ["loopback", "portmap", "bridge"]
    assert all("prevResult" not in c["conf"] and c["env"]["CNI_NETNS"] == "" for c in again)


def test_a_failed_add_is_undone_and_names_the_plugin(recorded):
    make, calls, tmp_path = recorded
    with pytest.raises(CNIError) as err:
        make(fail="portmap ADD").add(CONFLIST, "pod-2", "/run/netns/cnpod")
    assert str(err.value) == "CNI plugin portmap ADD failed (code 11): no room (pool empty)"
    assert [(c["kind"], c["env"]["CNI_COMMAND"]) for c in calls()] == [
        ("bridge", "ADD"), ("portmap", "ADD"), ("loopback", "DEL"), ("portmap", "DEL"), ("bridge", "DEL")]
    assert not (tmp_path / "cache" / "constellation-pod-2-eth0").exists()


def test_a_failing_del_still_runs_the_others_then_raises(recorded):
    make, calls, dummy_tmp = recorded
    make().add(CONFLIST, "pod-3", "/run/netns/cnpod")
    calls()
    with pytest.raises(CNIError, match="portmap DEL"):
        make(fail="portmap DEL").delete(CONFLIST, "pod-3", "/run/netns/cnpod")
    assert [c["kind"] for c in calls()] == ["loopback", "portmap", "bridge"]


def test_bad_arguments_and_a_missing_plugin_fail_before_anything_runs(recorded):
    make, calls, tmp_path = recorded
    cni = make()
    for kwargs, field in ((dict(container_id="-x"), "container_id"), (dict(ifname="a/b"), "ifname"),
                          (dict(netns="cnpod"), "netns")):
        args = dict(dict(container_id="pod-4", netns="/run/netns/cnpod"), **kwargs)
        with pytest.raises(InputError) as err:
            cni.add(CONFLIST, **args)
        assert err.value.field == field
    missing = dict(CONFLIST, plugins=CONFLIST["plugins"] + [{"type": "tuning"}])
    with pytest.raises(StateError, match="CNI plugin tuning: not found in cni_path .*containernetworking-plugins"):
        cni.add(missing, "pod-4", "/run/netns/cnpod")
    assert calls() == []
