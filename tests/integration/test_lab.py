"""The lab builds real simulated hosts and leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from lab.image import lab_measurements
from lab.lab import Lab
from tests.support import ROOT

pytestmark = pytest.mark.lab


def _root_state(lab: Lab) -> dict:
    """Everything this lab could leave behind in the root namespace (other labs may run
    side by side, so namespaces and mounts are filtered by this lab's names)."""
    netns = sorted(n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
                   .stdout.split() if n.startswith(lab.ns_prefix))
    links = sorted(line.split(":")[1].strip() for line in subprocess.run(
        ["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout.splitlines())
    wg_dir = Path("/var/run/wireguard")
    wg = sorted(os.listdir(wg_dir)) if wg_dir.exists() else []
    with open("/proc/self/mountinfo") as f:
        mounts = sorted(line.split()[4] for line in f if str(lab.state_dir) in line.split()[4])
    procs = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path("/proc/%s/cmdline" % pid).read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(lab.state_dir) in cmd or ("cl-%s-" % lab.name) in cmd:
            procs.append(cmd)
    return {"netns": netns, "links": links, "wireguard": wg, "mounts": mounts, "procs": sorted(procs),
            "state_dir": lab.state_dir.exists()}


def _wait_gone(lab: Lab, before: dict, timeout: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout
    after = _root_state(lab)
    while after != before and time.monotonic() < deadline:
        time.sleep(0.1)
        after = _root_state(lab)
    return after


def test_eight_hosts_up_and_down_leave_no_trace(tmp_path):
    lab = Lab("tud", inventory_dir=tmp_path / "inv")
    before = _root_state(lab)
    try:
        lab.up(hosts=8, tpm=True)
        during = _root_state(lab)
        assert len([n for n in during["netns"] if n.startswith("cl-tud-")]) == 9
        assert during["links"] == before["links"], "the lab must not create links in the root namespace"
        assert all(row["netns"] and row["mount_ns"] and row["tpm"] for row in lab.status())
        # Every host has its own wireguard-go interface name space (/run/wireguard is private).
        for h in lab.hosts[:2]:
            h.run(["sh", "-c", "WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD=1 wireguard-go wg0"])
            assert h.run(["ls", "/run/wireguard"]).stdout.split() == ["wg0.sock"]
        assert (Path("/var/run/wireguard") / "wg0.sock").exists() is False
        # Hosts reach each other, and the admin machine reaches the hosts.
        assert lab.hosts[0].run(["ping", "-c1", "-W2", lab.hosts[7].public_ip], check=False).returncode == 0
        assert lab.admin_run(["ping", "-c1", "-W2", lab.hosts[3].public_ip], check=False).returncode == 0
    finally:
        lab.down()
    assert _wait_gone(lab, before) == before


def test_addresses_exist_only_inside_namespaces(lab_factory):
    lab = lab_factory("taddr", hosts=2)
    root_addrs = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    for h in lab.hosts:
        assert h.public_ip not in root_addrs
        assert h.public_ip in h.run(["ip", "-o", "addr"]).stdout
    assert "10.42.0.1/" not in root_addrs


def test_down_cleans_up_after_up_was_killed_half_way(tmp_path):
    lab = Lab("tkill", inventory_dir=tmp_path / "inv")
    before = _root_state(lab)
    env = dict(os.environ, PYTHONPATH="%s:%s" % (ROOT / "collections", ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "lab", "--name", "tkill", "up", "--hosts", "8"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Wait until up is half-way: some hosts exist, not all swtpms are running yet.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            hosts = [n for n in _root_state(lab)["netns"] if n.startswith("cl-tkill-h")]
            if len(hosts) >= 3 or proc.poll() is not None:
                break
            time.sleep(0.005)
        assert proc.poll() is None, "lab up finished before it could be interrupted"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        half = _root_state(lab)
        assert half != before, "the interrupted up should have left something to clean"
        state = json.loads((lab.state_dir / "state.json").read_text())
        assert state["phase"] == "building"
        # A second up repairs the lab ...
        lab.up(hosts=2, tpm=False)
        assert lab.healthy()
        assert [n for n in _root_state(lab)["netns"] if n.startswith("cl-tkill-")] == \
            ["cl-tkill-br", "cl-tkill-h1", "cl-tkill-h2"]
        # ... and down removes everything, also after another crash half-way.
        subprocess.run(["ip", "netns", "add", "cl-tkill-h7"], check=True)
    finally:
        if proc.poll() is None:
            proc.kill()
        subprocess.run([sys.executable, "-m", "lab", "--name", "tkill", "down"], cwd=ROOT, env=env,
                       check=True, capture_output=True)
    assert _wait_gone(lab, before) == before


def test_inventory_holds_hosts_endpoints_tcti_and_the_image_policy(tmp_path, lab_factory):
    inv = tmp_path / "inv"
    lab = lab_factory("tinv", hosts=3, inventory_dir=inv)
    doc = yaml.safe_load((inv / "hosts.yml").read_text())
    children = doc["all"]["children"]
    assert list(children["coordinators"]["hosts"]) == ["h1"]
    assert list(children["nodes"]["hosts"]) == ["h2", "h3"]
    h2 = children["nodes"]["hosts"]["h2"]
    assert h2["constellation_public_endpoint"] == "10.42.0.12:9000"
    assert h2["constellation_tpm_tcti"] == "swtpm:host=127.0.0.1,port=2321"
    lab_vars = yaml.safe_load((inv / "group_vars" / "all" / "lab.yml").read_text())
    assert lab_vars["ansible_connection"] == "constellation.cluster.atls"
    assert lab_vars["constellation_atls_netns"] == "cl-tinv-br"
    assert (inv / "admin_key").stat().st_mode & 0o777 == 0o600
    assert (inv / "vault_pass").stat().st_mode & 0o777 == 0o600
    # The local inventory's wrapper shell runs inside the host.
    local = yaml.safe_load(lab.local_inventory.read_text())["all"]["children"]["nodes"]["hosts"]["h2"]
    out = subprocess.run([local["ansible_shell_executable"], "-c", "ip -o -4 addr show eth0"],
                         capture_output=True, text=True, check=True).stdout
    assert "10.42.0.12/24" in out
    # Entering again from inside the host (as Ansible's shell tasks do) stays in the host.
    nested = subprocess.run([local["ansible_shell_executable"], "-c",
                             "%s -c 'ip -o -4 addr show eth0'" % local["ansible_shell_executable"]],
                            capture_output=True, text=True, check=True).stdout
    assert "10.42.0.12/24" in nested
    policy = json.loads((inv / "measurements.json").read_text())
    assert policy == lab_measurements()
    assert sorted(policy, key=int) == ["4", "9", "11"]
    assert all(len(bytes.fromhex(m["expected"])) == 32 and not m["warnOnly"] for m in policy.values())
    lab.down()
    assert not inv.exists()


def test_a_named_lab_writes_its_inventory_in_its_state_dir():
    """`python -m lab --name NAME up` writes an inventory for any lab name, not only the default."""
    lab = Lab("tname")
    env = dict(os.environ, PATH="%s:%s" % (ROOT / ".venv" / "bin", os.environ["PATH"]))
    try:
        out = subprocess.run([sys.executable, "-m", "lab", "--name", "tname", "up", "--hosts", "2", "--no-tpm"],
                             cwd=str(ROOT), env=env, capture_output=True, text=True, check=True).stdout
        inv = lab.state_dir / "inventory"
        assert "inventory: %s" % inv in out
        hosts = yaml.safe_load((inv / "hosts.yml").read_text())["all"]["children"]
        assert list(hosts["coordinators"]["hosts"]) == ["h1"] and list(hosts["nodes"]["hosts"]) == ["h2"]
        lab_vars = yaml.safe_load((inv / "group_vars" / "all" / "lab.yml").read_text())
        assert lab_vars["constellation_atls_netns"] == "cl-tname-br"
        # kubeadm cannot run on lab hosts: the lab turns Kubernetes off explicitly.
        assert lab_vars["constellation_kubernetes"] is False
        # The default lab's inventory is untouched by another lab.
        default_inv = ROOT / "inventories" / "lab" / "hosts.yml"
        assert "tname" not in (default_inv.read_text() if default_inv.exists() else "")
    finally:
        subprocess.run([sys.executable, "-m", "lab", "--name", "tname", "down"], cwd=str(ROOT), env=env,
                       check=False, capture_output=True)
    assert not (lab.state_dir / "inventory").exists()


def test_prove_verifies_quotes_and_refuses_a_tampered_host(lab_factory):
    from lab.prove import prove

    lab = lab_factory("tprv", hosts=3, tpm=True)
    report = prove(lab)
    assert report["ok"], report
    assert [r["ping_ok"] for r in report["rows"]] == [2, 2, 2]
    lab.tamper("h2")
    report = prove(lab)
    assert not report["ok"]
    by_host = {r["host"]: r for r in report["rows"]}
    assert by_host["h1"]["attested"] and by_host["h3"]["attested"]
    assert not by_host["h2"]["attested"]
    assert "PCR 9" in by_host["h2"]["error"]


def test_ansible_runs_tasks_inside_lab_hosts_through_the_inventory(tmp_path, lab_factory):
    lab = lab_factory("tans", hosts=2, inventory_dir=tmp_path / "inv")
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
               PATH="%s:%s" % (ROOT / ".venv" / "bin", os.environ["PATH"]))
    proc = subprocess.run(["ansible", "all", "-i", str(lab.local_inventory), "-m", "ansible.builtin.command",
                           "-a", "ip -o -4 addr show eth0"], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "10.42.0.11/24" in proc.stdout and "10.42.0.12/24" in proc.stdout


def test_agents_start_with_the_lab_and_grow_adds_booting_hosts(tmp_path, lab_factory):
    lab = lab_factory("tagt", hosts=2, tpm=True, agents=True, inventory_dir=tmp_path / "inv")
    assert [row["agent"] for row in lab.status()] == [True, True]
    assert lab.healthy()
    new = lab.grow(3)
    assert [h.name for h in new] == ["h3"]
    assert all(row["agent"] and row["tpm"] for row in lab.status())
    doc = yaml.safe_load((tmp_path / "inv" / "hosts.yml").read_text())
    assert list(doc["all"]["children"]["nodes"]["hosts"]) == ["h2", "h3"]
    # The new host booted the same image: it attests like the others.
    from lab.prove import prove
    assert prove(lab)["ok"]
