"""The pod network on real CNI plugins (Debian's containernetworking-plugins) and real nftables, each test in a
private "host": a network namespace ``cn*`` plus a mount namespace whose /etc and /var/lib are overlays (so the
product writes its default paths, /etc/cni/net.d and /var/lib/cni, and the machine keeps none of it) and whose
/run is its own (pods are namespaces made inside it). Pods are made as a runtime makes them: CNI ADD through the
node's conflist (plugins/module_utils/pod_network/cni.py), DEL to remove them.

Covered: ADD/DEL (addresses from the node's pod CIDR, MTU, routes, nothing left after DEL), two pods on one
bridge ping each other and the gateway, the nftables table drops pod-range traffic that would leave by an
interface other than wg0 (a default route to a veth) while wg0 and pod egress pass, idempotence, and the two modules
through ansible-playbook: check mode, diff, second run unchanged, the probe, absent, bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.command import CommandRunner
from ansible_collections.constellation.cluster.plugins.module_utils.errors import StateError
from ansible_collections.constellation.cluster.plugins.module_utils.pod_network import (
    CNI,
    NFTables,
    PodNetwork,
    load_conflist,
    parse_pod_network_spec,
    result_addresses,
)
from tests.support import VENV_BIN
from tests.support.playbook import run_tasks

pytestmark = [pytest.mark.lab, pytest.mark.skipif(
    not os.path.isfile("/usr/lib/cni/bridge") or shutil.which("nft") is None,
    reason="needs Debian's containernetworking-plugins and nftables (scripts/setup.sh installs them)")]

SPEC = parse_pod_network_spec(pod_cidr="10.244.1.0/24")
OTHER_POD = "10.244.7.7"  # in another node's pod CIDR
OUTSIDE = "198.51.100.7"  # outside the pod range and the VPN CIDR


def _run(argv, check=True):
    return subprocess.run(argv, capture_output=True, text=True, check=check)


class Box:
    """A private host: network namespace ``name``, a mount namespace (overlays on /etc and /var/lib, own /run)."""

    def __init__(self, name: str, tmp: Path):
        self.name = name
        self.tmp = tmp
        self.mnt = tmp / "mnt"
        self.mount_ns = self.mnt / "ns"
        _run(["ip", "netns", "delete", name], check=False)  # left by a killed run
        _run(["ip", "netns", "add", name])
        self.mnt.mkdir()
        _run(["mount", "--bind", str(self.mnt), str(self.mnt)])
        _run(["mount", "--make-private", str(self.mnt)])
        self.mount_ns.touch()
        dirs = {}
        for key in ("etc-up", "etc-work", "lib-up", "lib-work"):
            dirs[key] = tmp / key
            dirs[key].mkdir()
        _run(["unshare", "--mount=%s" % self.mount_ns, "--propagation", "private", "sh", "-c",
              "mount -t overlay cn-etc -o lowerdir=/etc,upperdir={etc-up},workdir={etc-work} /etc && "
              "mount -t overlay cn-lib -o lowerdir=/var/lib,upperdir={lib-up},workdir={lib-work} /var/lib && "
              "mount -t tmpfs -o mode=0755 cn-run /run".format(**dirs)])
        self.prefix = ["nsenter", "--mount=%s" % self.mount_ns, "--net=/run/netns/%s" % name]
        self.runner = CommandRunner(prefix=self.prefix)
        self.run(["ip", "link", "set", "lo", "up"])

    def run(self, argv, check=True):
        return _run(self.prefix + list(argv), check=check)

    def read(self, path: str) -> str:
        return self.run(["cat", path]).stdout

    def exists(self, path: str) -> bool:
        return self.run(["test", "-e", path], check=False).returncode == 0

    def link_tx(self, dev: str) -> int:
        return json.loads(self.run(["ip", "-j", "-s", "link", "show", "dev", dev]).stdout)[0]["stats64"]["tx"]["packets"]

    def ping(self, pod: str, address: str, attempts: int = 3) -> bool:
        """A few bounded attempts: the first packet after a veth appears can meet a port not yet forwarding."""
        for dummy_attempt in range(attempts):
            if self.run(["ip", "netns", "exec", pod, "ping", "-c1", "-W2", address], check=False).returncode == 0:
                return True
        return False

    def close(self):
        _run(["umount", str(self.mount_ns)], check=False)
        _run(["umount", "-l", str(self.mnt)], check=False)
        _run(["ip", "netns", "delete", self.name], check=False)


@pytest.fixture
def box(tmp_path):
    made = []

    def make(name: str) -> Box:
        sub = tmp_path / name
        sub.mkdir()
        made.append(Box(name, sub))
        return made[-1]

    yield make
    for b in made:
        b.close()


def _route_out(b: Box, dev: str, address: str, dst: str = "default") -> None:
    """An underlay stand-in: ``dev``, a veth whose peer sits in a sink namespace (inside the box) with no address;
    ``dst`` is routed to ``dev`` through a gateway with a fixed MAC, so what the host sends there leaves at once
    (no ARP) and is counted in ``dev``'s transmit counter."""
    if not b.exists("/run/netns/cnsink"):
        b.run(["ip", "netns", "add", "cnsink"])
    b.run(["ip", "link", "add", dev, "type", "veth", "peer", "name", dev + "s", "netns", "cnsink"])
    b.run(["ip", "netns", "exec", "cnsink", "ip", "link", "set", dev + "s", "up"])
    b.run(["sysctl", "-q", "-w", "net.ipv6.conf.%s.disable_ipv6=1" % dev])  # no router solicitation in the count
    b.run(["ip", "address", "add", address, "dev", dev])
    b.run(["ip", "link", "set", dev, "up"])
    gateway = address.rsplit(".", 1)[0] + ".254"
    b.run(["ip", "neigh", "replace", gateway, "lladdr", "02:00:00:00:00:01", "dev", dev, "nud", "permanent"])
    b.run(["ip", "route", "add", dst, "via", gateway, "dev", dev])


def test_two_pods_on_the_bridge_ping_and_del_leaves_nothing(box, tmp_path):
    b = box("cnh1")
    net = PodNetwork(b.runner, conf_dir=str(tmp_path / "net.d"))
    bridge_nf = net.sysctl("net.bridge.bridge-nf-call-iptables")
    if bridge_nf is not None:  # br_netfilter loaded: off, so that apply turns it on (pods then ping through it)
        b.run(["sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=0"])
    dummy_state, steps = net.apply(SPEC)
    assert steps == ["ip_forward"] + (["bridge_nf_call_iptables"] if bridge_nf is not None else []) + \
        ["nftables", "bridge", "bridge_mtu", "bridge_address", "bridge_up", "conflist"]
    assert net.sysctl("net.ipv4.ip_forward") == "1" and net.sysctl("net.bridge.bridge-nf-call-iptables") in (None, "1")
    assert net.apply(SPEC)[1] == []
    conflist = load_conflist(net.conflist_path)
    cni = CNI(b.runner, cache_dir=str(tmp_path / "cache"))
    addresses = {}
    for pod in ("cnp1", "cnp2"):
        b.run(["ip", "netns", "add", pod])
        addresses[pod] = result_addresses(cni.add(conflist, pod, "/run/netns/%s" % pod))[0]
    assert sorted(addresses.values()) == ["10.244.1.2/24", "10.244.1.3/24"]
    eth0 = json.loads(b.run(["ip", "netns", "exec", "cnp1", "ip", "-j", "link", "show", "eth0"]).stdout)[0]
    assert eth0["mtu"] == 1420
    routes = json.loads(b.run(["ip", "netns", "exec", "cnp1", "ip", "-j", "route"]).stdout)
    assert {"dst": "default", "gateway": "10.244.1.1"}.items() <= [r for r in routes if r["dst"] == "default"][0].items()
    assert b.ping("cnp1", addresses["cnp2"].split("/")[0]) and b.ping("cnp2", addresses["cnp1"].split("/")[0])
    assert b.ping("cnp1", SPEC.gateway)
    ports = json.loads(b.run(["ip", "-j", "-d", "link", "show", "master", "cni0"]).stdout)
    assert len(ports) == 2 and all(p["linkinfo"]["info_slave_data"]["hairpin"] for p in ports)
    assert net.apply(SPEC)[1] == []  # pods do not make the host differ from the spec

    for pod in ("cnp1", "cnp2"):
        cni.delete(conflist, pod, "/run/netns/%s" % pod)
    assert json.loads(b.run(["ip", "-j", "link", "show", "master", "cni0"]).stdout) == []
    leases = b.run(["ls", "/var/lib/cni/networks/constellation"]).stdout.split()
    assert not [name for name in leases if name.startswith("10.244.")], leases
    assert list((tmp_path / "cache").iterdir()) == []
    assert json.loads(b.run(["ip", "netns", "exec", "cnp1", "ip", "-j", "link", "show"]).stdout)[0]["ifname"] == "lo"
    assert len(json.loads(b.run(["ip", "netns", "exec", "cnp1", "ip", "-j", "link", "show"]).stdout)) == 1


def test_pod_range_traffic_never_leaves_by_a_non_wg0_interface(box, tmp_path):
    b = box("cnh2")
    _route_out(b, "und0", "192.0.2.1/24")
    net = PodNetwork(b.runner, conf_dir=str(tmp_path / "net.d"))
    net.apply(SPEC)
    cni = CNI(b.runner, cache_dir=str(tmp_path / "cache"))
    b.run(["ip", "netns", "add", "cnp1"])
    cni.add(load_conflist(net.conflist_path), "cnp1", "/run/netns/cnp1")
    nft = NFTables(b.runner)

    # Without the table, the default route carries pod-range traffic out of und0 in the clear.
    nft.delete()
    before = b.link_tx("und0")
    b.run(["ip", "netns", "exec", "cnp1", "ping", "-c2", "-W1", OTHER_POD], check=False)
    assert b.link_tx("und0") >= before + 2

    assert net.apply(SPEC)[1] == ["nftables"]
    counted = nft.counters()
    before = b.link_tx("und0")
    assert not b.ping("cnp1", OTHER_POD, attempts=1)  # forwarded from a pod
    host = b.run(["ping", "-c2", "-W1", OTHER_POD], check=False)  # sent by the host itself
    assert host.returncode != 0
    assert b.link_tx("und0") == before
    after = nft.counters()
    assert after["forward"] >= counted["forward"] + 1 and after["output"] >= counted["output"] + 2

    # Pod egress outside the pod range still leaves, masqueraded; pod-range traffic routed to wg0 passes.
    b.run(["ip", "netns", "exec", "cnp1", "ping", "-c2", "-W1", OUTSIDE], check=False)
    assert b.link_tx("und0") >= before + 2 and nft.counters()["postrouting"] >= counted["postrouting"] + 1
    _route_out(b, "wg0", "192.0.3.1/24", dst=SPEC.cluster_pod_cidr)  # an interface named wg0 (the rule's test)
    wg_before = b.link_tx("wg0")
    b.run(["ip", "netns", "exec", "cnp1", "ping", "-c2", "-W1", OTHER_POD], check=False)
    assert b.link_tx("wg0") >= wg_before + 2
    cni.delete(load_conflist(net.conflist_path), "cnp1", "/run/netns/cnp1")


def test_nothing_is_written_before_every_check_passed(box, tmp_path):
    b = box("cnh4")
    conf_dir = tmp_path / "net.d"
    no_plugins = PodNetwork(b.runner, conf_dir=str(conf_dir), cni_path=str(tmp_path / "none"))
    with pytest.raises(StateError, match="CNI plugin bridge: not found in cni_path .*containernetworking-plugins"):
        no_plugins.apply(SPEC)
    b.run(["ip", "link", "add", "cni0", "type", "veth", "peer", "name", "cni0p"])  # the name taken by another kind
    net = PodNetwork(b.runner, conf_dir=str(conf_dir))
    with pytest.raises(StateError, match="cni0 exists but is a veth interface, not a bridge"):
        net.apply(SPEC)
    assert not conf_dir.exists() and NFTables(b.runner).live() is None
    assert net.sysctl("net.ipv4.ip_forward") == "0"
    assert net.remove()[1] == []  # absent leaves a cni0 it did not make alone
    assert b.run(["ip", "link", "show", "cni0"], check=False).returncode == 0


def _interpreter(b: Box, tmp_path: Path) -> str:
    """A Python that runs inside the box: ansible's local connection then runs the modules there."""
    path = tmp_path / ("python-in-%s" % b.name)
    path.write_text("#!/bin/sh\nexec %s %s \"$@\"\n" % (" ".join(b.prefix), VENV_BIN / "python"))
    path.chmod(0o755)
    return str(path)


def _task(module: str, **args) -> dict:
    return {"name": module, "constellation.cluster.%s" % module: args, "register": "out"}


def test_modules_check_mode_diff_second_run_probe_and_absent(box, tmp_path):
    b = box("cnh3")
    _route_out(b, "und0", "192.0.2.1/24")
    python = _interpreter(b, tmp_path)
    work = tmp_path / "runs"

    def play(*tasks, args=()):
        run = run_tasks(work, list(tasks), args=list(args), python=python)
        return run, run.results()

    present = _task("pod_network", pod_cidr="10.244.1.0/24")
    run, res = play(present, args=["--check", "--diff"])
    assert run.ok, run.stdout
    assert res["pod_network"]["changed"] and res["pod_network"]["steps"][-1] == "conflist"
    assert not b.exists("/etc/cni/net.d/10-constellation.conflist")
    assert b.run(["ip", "link", "show", "cni0"], check=False).returncode != 0
    assert NFTables(b.runner).live() is None

    run, res = play(present, args=["--diff"])
    assert run.ok, run.stdout
    out = res["pod_network"]
    assert out["changed"] and out["gateway"] == "10.244.1.1"
    conflist = b.read("/etc/cni/net.d/10-constellation.conflist")
    assert out["diff"][0]["before"] == "" and out["diff"][0]["after"] == conflist
    assert json.loads(conflist)["plugins"][0]["ipam"]["ranges"] == [[{"subnet": "10.244.1.0/24", "gateway": "10.244.1.1"}]]
    assert "constellation_pod_network" in out["diff"][1]["after"]
    assert b.run(["stat", "-c", "%a", "/etc/cni/net.d/10-constellation.conflist"]).stdout.strip() == "644"

    run, res = play(present, _task("pod_network_probe", addresses=["10.244.1.1", OTHER_POD], count=2, wait=1))
    assert run.ok, run.stdout
    assert not res["pod_network"]["changed"] and res["pod_network"]["steps"] == []
    probe = res["pod_network_probe"]
    assert not probe["changed"] and probe["probe_address"].startswith("10.244.1.")
    assert [(r["address"], r["reachable"]) for r in probe["results"]] == [("10.244.1.1", True), (OTHER_POD, False)]
    assert probe["unanswered"] == [OTHER_POD]
    assert [line.split()[0] for line in b.run(["ip", "netns", "list"]).stdout.splitlines()] == ["cnsink"]  # probe gone
    assert json.loads(b.run(["ip", "-j", "link", "show", "master", "cni0"]).stdout) == []

    run, res = play(_task("pod_network", pod_cidr="10.118.1.0/24"))
    assert not run.ok and "pod_cidr: expected a network inside cluster_pod_cidr 10.244.0.0/16" in res["pod_network"]["msg"]
    assert json.loads(b.read("/etc/cni/net.d/10-constellation.conflist")) == json.loads(conflist)

    absent = _task("pod_network", state="absent")
    run, res = play(absent, args=["--check"])
    assert run.ok and res["pod_network"]["steps"] == ["conflist", "bridge", "nftables"]
    assert b.exists("/etc/cni/net.d/10-constellation.conflist")
    run, res = play(absent)
    assert run.ok and res["pod_network"]["changed"]
    assert not b.exists("/etc/cni/net.d/10-constellation.conflist")
    assert b.run(["ip", "link", "show", "cni0"], check=False).returncode != 0
    assert NFTables(b.runner).live() is None
    run, res = play(absent)
    assert run.ok and not res["pod_network"]["changed"]
