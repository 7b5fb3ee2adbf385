# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Replacing a dead Coordinator (core/coordinator_removal.py, modules/coordinator_member.py) on a real
three-member etcd cluster with TLS from a cluster KMS. Each member runs on its own loopback address
(127.0.0.1-3), which stands for its Coordinator's VPN IP: the registry's VPN network is 127.0.0.0/24, whose
Coordinator range starts at 127.0.0.1."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.constellation.cluster.plugins.module_utils.core.records import state_store
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.store import EtcdStore, FileStore, StoreError
from ansible_collections.constellation.cluster.plugins.module_utils.core.coordinator_removal import remove_coordinator
from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd_members import open_local_member
from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd_member import member_name
from ansible_collections.constellation.cluster.plugins.modules import coordinator_member
from ansible_collections.constellation.cluster.tests.support.etcd_coordinators import HOSTS, Coordinators, _key
from lab.etcd import Etcd, free_ports, tmpfs_dir

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/etcd"), reason="/usr/bin/etcd is missing")

NODE_IP = "127.0.0.11"  # the first address of the Node range


@pytest.fixture
def cluster():
    base = tempfile.mkdtemp(prefix="coordinator-members-", dir=tmpfs_dir())
    coordinators = Coordinators(base)
    try:
        yield coordinators.start()
    finally:
        coordinators.stop()
        shutil.rmtree(base, ignore_errors=True)


def _names(store):
    deadline = time.monotonic() + 15
    while True:
        try:
            return sorted(m["name"] for m in store.member_list())
        except StoreError:  # an election, right after a kill or a removal
            if time.monotonic() >= deadline:
                raise
        time.sleep(0.1)


def test_a_killed_coordinator_is_removed_and_the_cluster_keeps_writing(cluster):
    cluster.members[HOSTS[2]].kill()
    with cluster.store(HOSTS[0]) as store:
        before = state_store.load_peer_state(store)
        # Check mode reports what would go and changes nothing.
        planned = remove_coordinator(store, HOSTS[2], check=True, tls=cluster.tls[HOSTS[0]])
        assert planned["changed"] and planned["member"]["name"] == member_name(HOSTS[2])
        assert planned["peer"]["role"] == "coordinator" and planned["peer"]["vpn_ip"] == HOSTS[2]
        assert planned["health"]["reachable"] is False
        assert sorted(m["name"] for m in planned["members"]) == [member_name(h) for h in HOSTS[:2]]
        assert len(store.member_list()) == 3 and state_store.load_peer_state(store) == before

        done = remove_coordinator(store, HOSTS[2], tls=cluster.tls[HOSTS[0]])
        assert done["changed"] and done["member"] == planned["member"] and done["peer"] == planned["peer"]
        assert _names(store) == [member_name(h) for h in HOSTS[:2]]
        registry = state_store.load_peer_registry(store)
        assert registry.peers.get(HOSTS[2]) is None and registry.peers.get(HOSTS[1]) is not None
        assert registry.peers.version == before["peers"]["resource_version"] + 1 == done["peer_version"]
        assert not registry.allocator.in_use(HOSTS[2])  # released: the replacement gets it again
        assert registry.allocator.allocate("coordinator") == HOSTS[2]

        # Idempotent: nothing left to remove, nothing changes.
        again = remove_coordinator(store, HOSTS[2], tls=cluster.tls[HOSTS[0]])
        assert not again["changed"] and again["member"] is None and again["peer"] is None
        assert state_store.load_peer_registry(store).peers.version == done["peer_version"]

    # The two that remain are the whole majority: both write, and each sees the other's writes.
    with cluster.store(HOSTS[0]) as first, cluster.store(HOSTS[1]) as second:
        first.put("probe", b"1")
        second.update(lambda tx: tx.put("probe", tx.get("probe") + b"2"))
        assert first.get("probe") == b"12"

    # A replacement on the same VPN IP joins; then one more Coordinator may die and writes go on.
    cluster.replace(HOSTS[2])
    cluster.members[HOSTS[1]].kill()
    with cluster.store(HOSTS[0]) as store:
        store.put("probe", b"3")
        assert len(store.member_list()) == 3
    with cluster.store(HOSTS[2]) as store:
        assert store.get("probe") == b"3"


def test_a_second_loss_without_the_removal_stops_writes(cluster):
    """Why the dead one must go: three members with two dead have no majority."""
    with cluster.store(HOSTS[0], timeout=1) as store:
        cluster.members[HOSTS[2]].kill()
        cluster.members[HOSTS[1]].kill()
        with pytest.raises(StateError, match="etcd has no quorum"):
            store.put("probe", b"1")
        with pytest.raises(StateError, match="etcd has no quorum"):
            remove_coordinator(store, HOSTS[2], tls=cluster.tls[HOSTS[0]])


def test_a_run_interrupted_after_the_member_removes_the_entry_next_time(cluster):
    cluster.members[HOSTS[1]].kill()
    with cluster.store(HOSTS[0]) as store:
        dead = [m for m in store.member_list() if m["name"] == member_name(HOSTS[1])][0]
        store.member_remove(dead["id"])
        result = remove_coordinator(store, HOSTS[1])
        assert result["changed"] and result["member"] is None and result["health"] is None
        assert result["peer"]["vpn_ip"] == HOSTS[1]
        assert state_store.load_peer_registry(store).peers.get(HOSTS[1]) is None


def test_refusals_name_the_field_and_change_nothing(cluster):
    with cluster.store(HOSTS[0]) as store:
        before = (len(store.member_list()), state_store.load_peer_state(store))
        with pytest.raises(InputError, match="vpn_ip: expected another Coordinator than this one"):
            remove_coordinator(store, HOSTS[0], tls=cluster.tls[HOSTS[0]])
        with pytest.raises(InputError, match=r"vpn_ip: expected the VPN IP of a Coordinator, got '127.0.0.11 \(a peer "
                                             r"with the role node\)'"):
            remove_coordinator(store, NODE_IP, tls=cluster.tls[HOSTS[0]])
        with pytest.raises(InputError, match="vpn_ip: expected the VPN IP of the dead Coordinator"):
            remove_coordinator(store, "coordinator-2")
        with pytest.raises(InputError, match="timeout: expected seconds"):
            remove_coordinator(store, HOSTS[1], timeout=0)
        # A running member is not removed without force, with or without TLS to ask its status.
        with pytest.raises(StateError, match=r"vpn_ip: the etcd member coordinator-127-0-0-2 on 127.0.0.2 still "
                                             r"answers \(.*etcd 3\.4\.\d+ answers its status"):
            remove_coordinator(store, HOSTS[1], tls=cluster.tls[HOSTS[0]])
        with pytest.raises(StateError, match="still answers .*its status request failed"):
            remove_coordinator(store, HOSTS[1])
        assert (len(store.member_list()), state_store.load_peer_state(store)) == before
    with EtcdStore([m.url for m in cluster.members.values()], tls=cluster.tls[HOSTS[0]]) as several:
        with pytest.raises(InputError, match="store: expected an EtcdStore on one member"):
            remove_coordinator(several, HOSTS[2])


def test_force_removes_a_running_coordinator(cluster):
    with cluster.store(HOSTS[0]) as store:
        result = remove_coordinator(store, HOSTS[1], force=True, tls=cluster.tls[HOSTS[0]])
        assert result["changed"] and result["health"]["reachable"] is True
        assert _names(store) == [member_name(HOSTS[0]), member_name(HOSTS[2])]
        assert state_store.load_peer_registry(store).peers.get(HOSTS[1]) is None


def test_the_last_member_is_not_removed(tmp_path):
    host, (client, peer) = "127.0.0.1", free_ports(2)
    single = Etcd(str(tmp_path / "data"), client, peer, host=host, name=member_name(host))
    try:
        single.start()
        # Reached through another name than the one it advertises: not recognised as itself.
        with EtcdStore(["http://localhost:%d" % client]) as store:
            with pytest.raises(StateError, match="vpn_ip: 127.0.0.1 is the etcd cluster's last member"):
                remove_coordinator(store, host)
            assert len(store.member_list()) == 1
    finally:
        single.stop()


# --------------------------------------------------------------------------- this host's member


def _agent_state(tmp_path, host, role="coordinator"):
    state_dir = tmp_path / "agent"
    with FileStore(str(state_dir / "store.json")) as local:
        state_store.save_node_state(local, {"role": role, "vpn_ip": host, "vpn_priv_key": _key()})
    return str(state_dir)


def test_open_local_member_reads_the_agents_state(cluster, tmp_path):
    state_dir = _agent_state(tmp_path, HOSTS[0])
    data_dir = os.path.join(cluster.base, member_name(HOSTS[0]))
    local = open_local_member(state_dir, data_dir, cluster.members[HOSTS[0]].client_port)
    try:
        assert local.vpn_ip == HOSTS[0] and local.tls == cluster.tls[HOSTS[0]]
        assert local.store.endpoints == [cluster.members[HOSTS[0]].url]
        assert len(local.store.member_list()) == 3
    finally:
        local.close()


def test_open_local_member_refuses_what_is_not_a_coordinators_member(tmp_path):
    with pytest.raises(StateError, match="agent_state_dir: .*/none does not exist"):
        open_local_member(str(tmp_path / "none"))
    assert not (tmp_path / "none").exists()  # nothing created
    # A Node runs no etcd member: it has no member files (its sealed store is not read).
    node_dir = _agent_state(tmp_path, NODE_IP, role="node")
    with pytest.raises(StateError, match=r"etcd_data_dir: .*/etcd/tls/ca.pem \(the member's ca_cert\) does not exist"):
        open_local_member(node_dir)
    with pytest.raises(InputError, match="etcd_client_port: expected a port number"):
        open_local_member(node_dir, client_port=0)
    tls = tmp_path / "agent" / "etcd" / "tls"
    tls.mkdir(parents=True)
    for name in ("ca.pem", "member.key"):
        (tls / name).write_text("x")
    (tls / "member.pem").write_text("not a certificate")
    with pytest.raises(StateError, match="member.pem is not an etcd member certificate of this agent"):
        open_local_member(node_dir)


# --------------------------------------------------------------------------- the module


def _run_module(capsys, args):
    with patch_module_args(args), pytest.raises(SystemExit) as done:
        coordinator_member.main()
    result = json.loads(capsys.readouterr().out)
    assert (done.value.code == 0) != bool(result.get("failed"))
    return result


def test_module_removes_once_and_reports_in_check_mode(cluster, tmp_path, capsys):
    cluster.members[HOSTS[2]].kill()
    args = {"vpn_ip": HOSTS[2], "agent_state_dir": _agent_state(tmp_path, HOSTS[0]),
            "etcd_data_dir": os.path.join(cluster.base, member_name(HOSTS[0])),
            "etcd_client_port": cluster.members[HOSTS[0]].client_port}
    query = _run_module(capsys, dict(args, state="query"))
    assert query["changed"] is False and query["member"]["name"] == member_name(HOSTS[2])
    checked = _run_module(capsys, dict(args, _ansible_check_mode=True, _ansible_diff=True))
    assert checked["changed"] is True and checked["peer"]["vpn_ip"] == HOSTS[2]
    assert member_name(HOSTS[2]) in checked["diff"]["before"] and member_name(HOSTS[2]) not in checked["diff"]["after"]
    with cluster.store(HOSTS[0]) as store:
        assert len(store.member_list()) == 3
    done = _run_module(capsys, args)
    assert done["changed"] is True and len(done["members"]) == 2
    again = _run_module(capsys, args)
    assert again["changed"] is False and again["member"] is None and again["peer"] is None
    with cluster.store(HOSTS[1]) as store:
        assert _names(store) == [member_name(h) for h in HOSTS[:2]]


@pytest.mark.parametrize("args, message", [
    ({"vpn_ip": "10.118.0.x"}, "vpn_ip: expected the VPN IP of the dead Coordinator"),
    ({"vpn_ip": "10.118.0.2", "state": "present"}, "value of state must be one of: absent, query"),
    ({"vpn_ip": "10.118.0.2"}, "agent_state_dir: /nonexistent/agent does not exist"),
])
def test_module_bad_input_names_the_field(capsys, args, message):
    result = _run_module(capsys, dict({"agent_state_dir": "/nonexistent/agent"}, **args))
    assert result["failed"] and message in result["msg"]
