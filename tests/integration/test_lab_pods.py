"""The lab's pods (lab/pods.py) and its underlay capture (lab/capture.py): each host's own /etc/cni and
/var/lib/cni, pods made by the real CNI plugins with a host's conflist, and what tcpdump on the bridge sees."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

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
