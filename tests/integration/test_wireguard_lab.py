"""WireGuard on real lab hosts (network + mount namespaces, wireguard-go): full-mesh tunnels, in-place
peer changes that keep other sessions, exclusive removal, fail-closed validation, and the two modules
through a real ansible-playbook run."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import (
    CommandRunner,
    WireGuard,
    diff_peers,
    parse_interface_spec,
    parse_peer_list,
    ensure_key_file,
)
from tests.support import ROOT
from tests.support.playbook import PlayRun, run_playbook

pytestmark = pytest.mark.lab

VPN_IPS = ["10.118.0.1", "10.118.0.11", "10.118.0.12"]


def _config(state):
    """The configuration part of a live interface: no private key, no counters, no handshakes."""
    return (state.pub_key, state.listen_port,
            sorted((p.pub_key, p.endpoint, p.allowed_ips, p.persistent_keepalive) for p in state.peers.values()))


def _kept_session(before, after) -> bool:
    return (after.latest_handshake != 0 and after.latest_handshake >= before.latest_handshake
            and after.transfer_rx >= before.transfer_rx and after.transfer_tx >= before.transfer_tx)


def _ping(host, ip, attempts: int = 4) -> bool:
    """Reachable over the tunnel. Peers are configured one host after the other, so a first handshake
    initiation can reach a host that does not know the sender yet; WireGuard retries after its 5 s
    rekey timeout. A few bounded attempts cover that; a dead tunnel still fails every one."""
    for dummy_attempt in range(attempts):
        if host.run(["ping", "-c1", "-W2", ip], check=False).returncode == 0:
            return True
    return False


def _mesh(hosts, pub_keys, port_of=lambda h: 51820, skip=()):
    return {
        h.name: [{"pub_key": pub_keys[o.name], "vpn_ip": VPN_IPS[j], "endpoint": "%s:%d" % (o.public_ip, port_of(o))}
                 for j, o in enumerate(hosts) if o is not h and o.name not in skip]
        for h in hosts
    }


@pytest.fixture
def wg_lab(lab_factory, tmp_path):
    lab = lab_factory("wgc", hosts=3, tpm=False)
    wgs, pub_keys = {}, {}
    for i, h in enumerate(lab.hosts):
        wg = WireGuard(CommandRunner(prefix=h.nsenter_prefix))
        key_file = str(tmp_path / ("%s.key" % h.name))
        key_state, dummy_changed = ensure_key_file(key_file)
        steps = wg.ensure_interface(parse_interface_spec("wg0", "%s/16" % VPN_IPS[i]), key_file, key_state.pub_key)
        assert steps[0] == "create"
        assert wg.ensure_interface(parse_interface_spec("wg0", "%s/16" % VPN_IPS[i]), key_file, key_state.pub_key) == []
        assert wg.show("wg0").pub_key == key_state.pub_key
        wgs[h.name], pub_keys[h.name] = wg, key_state.pub_key
    return lab, wgs, pub_keys, tmp_path


def _converge(wg, items, exclusive=False):
    live = wg.show("wg0")
    diff = diff_peers(parse_peer_list(items, own_pub_key=live.pub_key, exclusive=exclusive), live, exclusive)
    wg.apply_peer_diff("wg0", diff)
    return diff


def test_mesh_endpoint_change_keeps_other_sessions_and_exclusive_removal(wg_lab):
    lab, wgs, pub_keys, tmp_path = wg_lab
    h1, h2, h3 = lab.hosts
    mesh = _mesh(lab.hosts, pub_keys)
    for h in lab.hosts:
        assert _converge(wgs[h.name], mesh[h.name])
        assert not _converge(wgs[h.name], mesh[h.name])  # second run: nothing to do
    for h in lab.hosts:
        for j, other in enumerate(lab.hosts):
            if other is not h:
                assert _ping(h, VPN_IPS[j]), "%s cannot reach %s over the tunnel" % (h.name, other.name)

    before = wgs["h1"].show("wg0").peers
    assert before[pub_keys["h2"]].latest_handshake > 0 and before[pub_keys["h3"]].latest_handshake > 0

    # h3 moves to another port; h1 and h2 learn its new endpoint from an updated list.
    key3 = str(tmp_path / "h3.key")
    assert wgs["h3"].ensure_interface(parse_interface_spec("wg0", "%s/16" % VPN_IPS[2], listen_port=51821),
                                      key3, pub_keys["h3"]) == ["listen_port"]
    moved = _mesh(lab.hosts, pub_keys, port_of=lambda h: 51821 if h.name == "h3" else 51820)
    diff = _converge(wgs["h1"], moved["h1"])
    assert [p.pub_key for p in diff.changed] == [pub_keys["h3"]] and not diff.added and not diff.removed
    _converge(wgs["h2"], moved["h2"])
    after = wgs["h1"].show("wg0").peers
    # The unrelated tunnel h1<->h2 kept its session: handshake and counters not reset (a removed and
    # re-added peer starts from 0; a natural re-handshake could only move the time forward).
    assert _kept_session(before[pub_keys["h2"]], after[pub_keys["h2"]])
    assert after[pub_keys["h3"]].endpoint == "%s:51821" % h3.public_ip
    assert _ping(h1, VPN_IPS[2]) and _ping(h2, VPN_IPS[2]) and _ping(h1, VPN_IPS[1])

    # exclusive: h1 keeps only h2.
    only_h2 = [p for p in moved["h1"] if p["pub_key"] == pub_keys["h2"]]
    diff = _converge(wgs["h1"], only_h2, exclusive=True)
    assert [p.pub_key for p in diff.removed] == [pub_keys["h3"]]
    assert set(wgs["h1"].show("wg0").peers) == {pub_keys["h2"]}
    assert not _ping(h1, VPN_IPS[2], attempts=1)
    assert _ping(h1, VPN_IPS[1])
    assert not _converge(wgs["h1"], only_h2, exclusive=True)

    # Control: the check above does detect a torn-down session (remove + re-add, as config regeneration does).
    before = wgs["h1"].show("wg0").peers[pub_keys["h2"]]
    h1.run(["wg", "set", "wg0", "peer", pub_keys["h2"], "remove"])
    _converge(wgs["h1"], only_h2, exclusive=True)
    assert not _kept_session(before, wgs["h1"].show("wg0").peers[pub_keys["h2"]])


def test_bad_lists_leave_live_interface_untouched(wg_lab):
    lab, wgs, pub_keys, dummy_tmp = wg_lab
    mesh = _mesh(lab.hosts, pub_keys)
    wg = wgs["h1"]
    _converge(wg, mesh["h1"])
    good = mesh["h1"]
    new_key = pub_keys["h1"][:-2] + ("A=" if pub_keys["h1"][-2] != "A" else "B=")
    bad_lists = {
        "malformed key": good + [{"pub_key": "not-a-key", "vpn_ip": "10.118.0.20"}],
        "outside CIDR": good + [{"pub_key": new_key, "vpn_ip": "10.119.0.20"}],
        "duplicate VPN IP": good + [{"pub_key": new_key, "vpn_ip": good[0]["vpn_ip"]}],
        "duplicate key": good + [dict(good[0], vpn_ip="10.118.0.20")],
        "own key": good + [{"pub_key": pub_keys["h1"], "vpn_ip": "10.118.0.20"}],
        "empty exclusive": [],
    }
    before = _config(wg.show("wg0"))
    for what, items in bad_lists.items():
        with pytest.raises(InputError) as err:
            _converge(wg, items, exclusive=True)
        assert err.value.field.startswith("peers"), what
        assert _config(wg.show("wg0")) == before, what


# ---------------------------------------------------------------- modules via ansible-playbook

INTERFACE_PLAY = """
- name: WireGuard interfaces
  hosts: all
  gather_facts: false
  tasks:
    - name: Interface with a key generated on the host
      constellation.cluster.wireguard_interface:
        name: wg0
        address: "{{ vpn_ips[inventory_hostname] }}/16"
        private_key_file: "{{ key_dir }}/{{ inventory_hostname }}.key"
        state: "{{ wg_state | default('present') }}"
"""

PEERS_PLAY = """
- name: WireGuard peers from an explicit list
  hosts: all
  gather_facts: false
  tasks:
    - name: Peers
      constellation.cluster.wireguard_peers:
        interface: wg0
        exclusive: true
        peers: "{{ wg_peers[inventory_hostname] }}"
"""


def _local_inventory(inv: Path, hosts) -> Path:
    """Each lab host as an Ansible host: local connection, every command through a shell that enters the
    host's mount and network namespaces (docs/roles.md, "Molecule without Docker")."""
    (inv / "bin").mkdir(parents=True)
    host_vars = {}
    for h in hosts:
        shell = inv / "bin" / ("%s-sh" % h.name)
        shell.write_text("#!/bin/sh\nexec %s /bin/sh \"$@\"\n" % " ".join(h.nsenter_prefix))
        shell.chmod(0o755)
        host_vars[h.name] = {"ansible_connection": "local", "ansible_shell_executable": str(shell),
                             "ansible_python_interpreter": str(ROOT / ".venv" / "bin" / "python")}
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"wg_lab": {"hosts": host_vars}}}}))
    return inv


def _playbook(inv: Path, play: Path, extra: Path, *args: str) -> PlayRun:
    return run_playbook(play, str(inv / "hosts.yml"), inv.parent / "runs", ["-e", "@%s" % extra] + list(args))


def test_modules_through_ansible_playbook(lab_factory, tmp_path):
    lab = lab_factory("wgp", hosts=3, tpm=False)
    hosts = lab.hosts
    inv = _local_inventory(tmp_path / "inv", hosts)
    key_dir = tmp_path / "keys"
    key_dir.mkdir()
    extra = tmp_path / "vars.yml"
    extra.write_text(yaml.safe_dump({"key_dir": str(key_dir), "vpn_ips": {h.name: VPN_IPS[i] for i, h in enumerate(hosts)}}))
    (tmp_path / "iface.yml").write_text(INTERFACE_PLAY)
    (tmp_path / "peers.yml").write_text(PEERS_PLAY)

    # Check mode: reports the change, creates neither key files nor interfaces.
    run = _playbook(inv, tmp_path / "iface.yml", extra, "--check", "--diff")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert all(r["changed"] == 1 for r in run.recap().values())
    assert list(key_dir.iterdir()) == []
    assert hosts[0].run(["ip", "link", "show", "wg0"], check=False).returncode != 0

    run = _playbook(inv, tmp_path / "iface.yml", extra, "--diff", "-v")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert all(r["changed"] == 1 for r in run.recap().values())
    priv_keys = [(key_dir / ("%s.key" % h.name)).read_text().strip() for h in hosts]
    assert len(set(priv_keys)) == 3
    assert not any(k in run.stdout + run.stderr for k in priv_keys), "a private key was printed"
    run = _playbook(inv, tmp_path / "iface.yml", extra, "-v")
    assert run.returncode == 0 and all(r["changed"] == 0 for r in run.recap().values()), run.stdout[-3000:]
    for h in hosts:
        assert (key_dir / ("%s.key" % h.name)).stat().st_mode & 0o777 == 0o600
    pub_keys = {h.name: h.run(["wg", "show", "wg0", "public-key"]).stdout.strip() for h in hosts}

    # The peer list is explicit data, not derived from the play's hosts.
    data = yaml.safe_load(extra.read_text())
    data["wg_peers"] = _mesh(hosts, pub_keys)
    extra.write_text(yaml.safe_dump(data))
    run = _playbook(inv, tmp_path / "peers.yml", extra, "--diff")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "PrivateKey" not in run.stdout and "AllowedIPs = 10.118.0.11/32" in run.stdout
    assert not any(k in run.stdout + run.stderr for k in priv_keys), "a private key was printed"
    for h in hosts:
        for j, other in enumerate(hosts):
            if other is not h:
                assert _ping(h, VPN_IPS[j])
    run = _playbook(inv, tmp_path / "peers.yml", extra)
    assert run.returncode == 0 and all(r["changed"] == 0 for r in run.recap().values()), run.stdout[-3000:]
    # --limit cannot drop peers: h1 still gets its full list.
    run = _playbook(inv, tmp_path / "peers.yml", extra, "--limit", "h1")
    assert run.returncode == 0 and run.recap()["h1"]["changed"] == 0
    assert len(WireGuard(CommandRunner(hosts[0].nsenter_prefix)).show("wg0").peers) == 2

    live_before = {h.name: _config(WireGuard(CommandRunner(h.nsenter_prefix)).show("wg0")) for h in hosts}

    # Check mode: reports the removal, changes nothing.
    data["wg_peers"]["h1"] = data["wg_peers"]["h1"][:1]
    extra.write_text(yaml.safe_dump(data))
    run = _playbook(inv, tmp_path / "peers.yml", extra, "--check", "--diff", "--limit", "h1")
    assert run.returncode == 0 and run.recap()["h1"]["changed"] == 1
    assert _config(WireGuard(CommandRunner(hosts[0].nsenter_prefix)).show("wg0")) == live_before["h1"]

    # Bad input on every host: a clear error naming the field, nothing touched anywhere.
    good = _mesh(hosts, pub_keys)
    for name, bad in {
        "peers[2].pub_key": {h: good[h] + [{"pub_key": "bogus", "vpn_ip": "10.118.0.40"}] for h in good},
        "peers[1].vpn_ip": {h: [good[h][0], dict(good[h][1], vpn_ip="192.168.0.1")] for h in good},
        "peers[1].vpn_ip ": {h: [good[h][0], dict(good[h][1], vpn_ip=good[h][0]["vpn_ip"])] for h in good},
        "peers[1].pub_key": {h: [good[h][0], dict(good[h][0], vpn_ip="10.118.0.40")] for h in good},
    }.items():
        data["wg_peers"] = bad
        extra.write_text(yaml.safe_dump(data))
        run = _playbook(inv, tmp_path / "peers.yml", extra)
        assert run.returncode != 0
        assert name.strip() + ": expected" in run.stdout, run.stdout[-2000:]
        assert "Traceback" not in run.stdout
        for h in hosts:
            assert _config(WireGuard(CommandRunner(h.nsenter_prefix)).show("wg0")) == live_before[h.name], name

    # state: absent removes the interfaces (wireguard-go exits with them) and keeps the keys.
    for expected in (1, 0):
        run = _playbook(inv, tmp_path / "iface.yml", extra, "-e", "wg_state=absent")
        assert run.returncode == 0 and all(r["changed"] == expected for r in run.recap().values()), run.stdout
    for h in hosts:
        assert h.run(["ip", "link", "show", "wg0"], check=False).returncode != 0
        assert (key_dir / ("%s.key" % h.name)).exists()


CREATE_THEN_KILL_GROUP = """
import os, signal, sys
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import (
    CommandRunner, WireGuard, ensure_key_file, parse_interface_spec)
key_state, dummy_changed = ensure_key_file(sys.argv[2])
WireGuard(CommandRunner(prefix=sys.argv[3:])).ensure_interface(
    parse_interface_spec("wg0", "10.118.0.11/16"), sys.argv[2], key_state.pub_key)
os.killpg(os.getpgrp(), signal.SIGTERM)  # what Ansible's worker does to its group when terminated
"""


def test_interface_survives_the_callers_process_group(lab_factory, tmp_path):
    lab = lab_factory("wgs", hosts=1, tpm=False)
    h = lab.hosts[0]
    env = dict(os.environ, PYTHONPATH="%s:%s" % (ROOT / "collections", ROOT))
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-c", CREATE_THEN_KILL_GROUP, "x",
                           str(tmp_path / "h1.key")] + h.nsenter_prefix,
                          env=env, start_new_session=True, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == -15, proc.stderr
    assert h.run(["wg", "show", "wg0", "listen-port"]).stdout.strip() == "51820"
