"""The lab's pods (lab/pods.py) and its underlay capture (lab/capture.py): each host's own /etc/cni and
/var/lib/cni, pods made by the real CNI plugins with a host's conflist, and what tcpdump on the bridge sees."""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.pod_network import conflist
from lab import pods
from lab.capture import UnderlayCapture, not_wireguard, read_pcap, with_addresses_in
from lab.lab import Lab
from lab.names import SUBNET, LabError

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    lab = Lab("lppods", inventory_dir=tmp_path_factory.mktemp("inv"))
    lab.up(hosts=2, tpm=False)
    yield lab
    lab.down()


def test_each_host_has_its_own_cni_folders(lab):
    h1, h2 = lab.hosts
    assert all(row["cni_dirs"] for row in lab.status())
    h1.run(["sh", "-c", "mkdir -p /etc/cni/net.d /var/lib/cni/networks && echo h1 > /etc/cni/net.d/mine "
                        "&& echo h1 > /var/lib/cni/networks/mine"])
    assert (pods.cni_dir(h1, "etc") / "net.d" / "mine").read_text() == "h1\n"
    assert (pods.cni_dir(h1, "lib") / "networks" / "mine").read_text() == "h1\n"
    assert h2.run(["ls", "/etc/cni/net.d/mine"], check=False).returncode != 0
    assert not Path("/etc/cni/net.d/mine").exists() and not Path("/var/lib/cni/networks/mine").exists()
    h1.run(["rm", "-r", "/etc/cni/net.d/mine", "/var/lib/cni/networks/mine"])


def test_pod_commands_name_what_is_missing(lab):
    with pytest.raises(LabError, match="pod name"):
        lab.pod_add("h1", "Bad/Name")
    with pytest.raises(LabError, match="no conflist /etc/cni/net.d/10-constellation.conflist"):
        lab.pod_add("h1", "a")
    assert lab.pods("h1") == []
    with pytest.raises(LabError, match="no pod 'a'"):
        lab.pod_run("h1", "a", ["true"])
    lab.pod_del("h1", "a")  # a pod that is gone is no error


def test_pods_by_the_cni_plugins_with_the_hosts_conflist(lab):
    h1 = lab.hosts[0]
    spec = conflist.parse_pod_network_spec(cluster_pod_cidr="10.244.0.0/16", pod_cidr="10.244.7.0/24")
    target = pods.cni_dir(h1, "etc") / "net.d" / conflist.CONFLIST_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(conflist.dump_conflist(conflist.render_conflist(spec)))
    leases = pods.cni_dir(h1, "lib") / "networks" / conflist.NETWORK_NAME
    try:
        a, b = lab.pod_add("h1", "a"), lab.pod_add("h1", "b")
        assert {a["ip"], b["ip"]} <= set(str(ip) for ip in ipaddress.ip_network(spec.pod_cidr).hosts())
        assert a["ip"] != b["ip"] and a["cidr"].endswith("/24")
        assert lab.pods("h1") == ["a", "b"] and lab.pods("h2") == []
        assert sorted(p.name for p in leases.iterdir() if p.name[0].isdigit()) == sorted([a["ip"], b["ip"]])
        # The pods reach each other through cni0, and their host (the gateway).
        assert lab.pod_run("h1", "a", ["ping", "-c", "1", "-W", "2", b["ip"]], check=False).returncode == 0
        assert lab.pod_run("h1", "b", ["ping", "-c", "1", "-W", "2", spec.gateway], check=False).returncode == 0
        assert "mtu %d" % spec.mtu in lab.pod_run("h1", "a", ["ip", "link", "show", "eth0"]).stdout
        with pytest.raises(LabError, match="pod a exists"):
            lab.pod_add("h1", "a")
        lab.pod_del("h1", "a")
        assert lab.pods("h1") == ["b"]
        assert sorted(p.name for p in leases.iterdir() if p.name[0].isdigit()) == [b["ip"]]
        assert lab.pod_run("h1", "b", ["ping", "-c", "1", "-W", "1", a["ip"]], check=False).returncode != 0
    finally:
        for name in lab.pods("h1"):
            lab.pod_del("h1", name)
        target.unlink()
        h1.run(["ip", "link", "del", conflist.BRIDGE], check=False)


def test_capture_on_the_underlay_sees_the_hosts_traffic(lab):
    h1, h2 = lab.hosts
    with UnderlayCapture(lab) as capture:
        h1.run(["ping", "-c", "3", "-i", "0.2", "-W", "2", h2.public_ip])
    packets = capture.packets
    icmp = [p for p in packets if p.proto == "icmp"]
    assert {(p.src, p.dst) for p in icmp} == {(h1.public_ip, h2.public_ip), (h2.public_ip, h1.public_ip)}
    assert len(icmp) == 6
    assert set(not_wireguard(packets)) >= set(icmp)
    assert with_addresses_in(packets, str(SUBNET)) and not with_addresses_in(packets, "10.244.0.0/16")
    assert read_pcap(capture.path) == packets
    # A filter narrows what is kept.
    with UnderlayCapture(lab, bpf="udp") as capture:
        h1.run(["ping", "-c", "1", "-W", "2", h2.public_ip])
    assert [p for p in capture.packets if p.proto == "icmp"] == []


def test_down_leaves_no_pod_process(tmp_path):
    lab = Lab("lpdown", inventory_dir=tmp_path / "inv")
    try:
        lab.up(hosts=1, tpm=False)
        h1 = lab.hosts[0]
        # A pod's namespace made by hand (no conflist needed), with a process inside it.
        h1.run(["ip", "netns", "add", pods.pod_netns("x")])
        proc = h1.popen(pods.exec_argv("x", ["sleep", "600"]), stdout=subprocess.DEVNULL)
        assert lab.pods("h1") == ["x"]
    finally:
        lab.down()
    assert proc.wait(timeout=10) != 0
