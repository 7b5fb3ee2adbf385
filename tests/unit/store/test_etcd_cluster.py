# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The store on a real three-member etcd cluster (several Coordinators): no lost update when two
write at once, a dead member passed over and caught up, a majority loss as a clear error, and one
leader at a time with a hand-over (core/leadership.py)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.core.leadership import Leadership
from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_write
from ansible_collections.constellation.cluster.plugins.module_utils.kms import ClusterKMS, MasterSecret
from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd_pki import (
    ETCD_CA_INFO, etcd_ca, member_credentials)
from ansible_collections.constellation.cluster.plugins.module_utils.store import EtcdStore, MemoryStore, StoreError
from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd_argv import initial_cluster
from lab.etcd import Etcd, EtcdCluster, free_ports, tmpfs_dir
from tests.support.procs import is_zombie
from tests.support.threads import run_in_threads

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/etcd"), reason="/usr/bin/etcd is missing")


@pytest.fixture
def cluster():
    base = tempfile.mkdtemp(prefix="store-etcd-cluster-", dir=tmpfs_dir())
    members = EtcdCluster(base, size=3)
    try:
        yield members.start()
    finally:
        members.stop()
        shutil.rmtree(base, ignore_errors=True)


def _store_on(cluster, first: int, timeout: float = 2) -> EtcdStore:
    """A store that talks to member ``first`` and fails over to the others in turn."""
    endpoints = cluster.endpoints[first:] + cluster.endpoints[:first]
    return EtcdStore(endpoints, prefix="ha/", timeout=timeout)


def _until(predicate, limit: float = 15.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return predicate()


def test_two_coordinators_writing_at_once_lose_no_update(cluster):
    stores = [_store_on(cluster, 0), _store_on(cluster, 1)]
    rounds = 25

    def writer(index):
        def bump(tx):
            count = int(tx.get_default("peersResourceVersion", b"0"))
            tx.put("peersResourceVersion", str(count + 1).encode())
            tx.put("peerPrefix10.118.%d.%d" % (index, count), b"{}")

        for dummy in range(rounds):
            stores[index].update(bump)

    run_in_threads(writer, 2, 60)
    third = _store_on(cluster, 2)
    assert third.get("peersResourceVersion") == str(2 * rounds).encode()
    # Every write of both is there, each under the version it read: no two took the same one.
    peers = third.items("peerPrefix")
    assert len(peers) == 2 * rounds
    assert sorted(int(key.rsplit(".", 1)[1]) for key, dummy in peers) == list(range(2 * rounds))


def test_a_dead_member_is_passed_over_and_catches_up(cluster):
    store = _store_on(cluster, 0)
    store.put("masterSecret", b"\x01" * 32)
    cluster.members[0].kill()
    store.put("peersResourceVersion", b"2")  # member 1 takes over for this handle
    assert store.get("masterSecret") == b"\x01" * 32
    cluster.members[0].start()
    only_first = EtcdStore([cluster.members[0].endpoint], prefix="ha/", timeout=2)
    assert _until(lambda: only_first.get_default("peersResourceVersion") == b"2")
    assert only_first.get("masterSecret") == b"\x01" * 32


def test_a_majority_loss_stops_writes_with_a_clear_error(cluster):
    store = _store_on(cluster, 2, timeout=1)
    store.put("peersResourceVersion", b"1")
    cluster.members[0].kill()
    cluster.members[1].kill()
    with pytest.raises(StoreError) as info:
        store.put("peersResourceVersion", b"2")
    message = str(info.value)
    assert "etcd has no quorum" in message and cluster.members[2].endpoint in message
    assert "writes stop until a majority" in message
    # What the Coordinators' registry caches check on every poll: the member's own copy still answers,
    # at once (a linearizable read would wait for the timeout and fail like the write).
    assert store.peek("peersResourceVersion") == b"1"
    with pytest.raises(StoreError, match="no quorum"):
        store.get_default("peersResourceVersion")
    cluster.members[0].start(wait=False)
    cluster.members[1].start(wait=False)
    cluster.members[0].wait_ready()
    store.put("peersResourceVersion", b"3")
    assert _store_on(cluster, 0).get("peersResourceVersion") == b"3"


def test_one_leader_at_a_time_and_a_hand_over_when_it_stops(cluster):
    first = Leadership(_store_on(cluster, 0), "coordinator-0", ttl=1)
    second = Leadership(_store_on(cluster, 1), "coordinator-1", ttl=1)
    assert first.step() is True
    assert second.step() is False and second.current == "coordinator-0"
    assert first.step() is True  # renewing keeps it
    # The first stops renewing (a crash): the second takes over once the lease ran out, and never
    # while the first could still believe it leads.
    took_over = _until(second.step)
    assert took_over and not first.leads()
    assert first.step() is False and first.current == "coordinator-1"


def test_a_resigning_leader_hands_over_at_once(cluster):
    first = Leadership(_store_on(cluster, 0), "coordinator-0", ttl=30)
    second = Leadership(_store_on(cluster, 1), "coordinator-1", ttl=30)
    assert first.step() and not second.step()
    first.resign()
    assert not first.leads()
    assert second.step() is True


def test_a_leader_cut_off_from_the_majority_stops_leading(cluster):
    leader = Leadership(_store_on(cluster, 2, timeout=0.5), "coordinator-2", ttl=1)
    assert leader.step()
    cluster.members[0].kill()
    cluster.members[1].kill()
    assert _until(lambda: not leader.step())
    assert "etcd has no quorum" in leader.last_error


def test_a_store_of_one_coordinator_has_no_rival():
    leadership = Leadership(MemoryStore(), "coordinator-0")
    assert leadership.step() and leadership.leads() and leadership.current == "coordinator-0"


@pytest.mark.parametrize("holder,ttl,field", [("", 5, "holder"), ("c", 0, "ttl"), ("c", 1.5, "ttl")])
def test_bad_leadership_settings_name_the_field(holder, ttl, field):
    with pytest.raises(Exception) as info:
        Leadership(MemoryStore(), holder, ttl=ttl)
    assert info.value.__class__.__name__ == "InputError" and field in str(info.value)


def test_every_coordinator_derives_the_same_etcd_ca_and_no_node_can_ask_for_it():
    secret = MasterSecret.generate()
    one, two = ClusterKMS.from_uri(secret.to_uri()), ClusterKMS.from_uri(secret.to_uri())
    assert etcd_ca(one)[1] == etcd_ca(two)[1]
    assert etcd_ca(ClusterKMS(MasterSecret.generate()))[1] != etcd_ca(one)[1]
    # GetDataKey derives "key-<id>" only: the CA's HKDF info is out of its reach.
    assert not ETCD_CA_INFO.startswith("key-")


def test_a_tls_cluster_takes_only_certificates_of_its_own_cluster(tmp_path, monkeypatch):
    # The environment's CA bundle must not replace the cluster's CA (requests lets it win).
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    kms = ClusterKMS(MasterSecret.generate())
    members = EtcdCluster(str(tmp_path / "etcd"), size=3, kms=kms)
    try:
        members.start()
        store = EtcdStore(members.endpoints, prefix="ha/", tls=members.client_tls)
        store.put("masterSecret", b"\x02" * 32)
        members.members[0].kill()  # TLS between the remaining peers keeps the majority
        store.put("peersResourceVersion", b"1")
        # A client certificate of another cluster's CA, and no client certificate, are refused.
        other_key, other_ca = etcd_ca(ClusterKMS(MasterSecret.generate()))
        cert, key = member_credentials(other_key, other_ca, "intruder", [])
        (tmp_path / "other.pem").write_bytes(cert)
        atomic_write(str(tmp_path / "other.key"), key)  # 0600
        for tls in ({"ca_cert": members.client_tls["ca_cert"], "cert": str(tmp_path / "other.pem"),
                     "key": str(tmp_path / "other.key")},
                    {"ca_cert": members.client_tls["ca_cert"]}):
            with pytest.raises(StoreError, match="etcd is unreachable"):
                EtcdStore(members.endpoints[1:], prefix="ha/", tls=tls, timeout=2)
        with pytest.raises(StoreError, match="etcd is unreachable"):
            EtcdStore([url.replace("https://", "http://") for url in members.endpoints[1:]], timeout=2)
        assert store.get("masterSecret") == b"\x02" * 32
    finally:
        members.stop()


def test_member_credentials_refuse_bad_input():
    key, ca = etcd_ca(ClusterKMS(MasterSecret.generate()))
    with pytest.raises(Exception, match="ips"):
        member_credentials(key, ca, "m0", ["not-an-ip"])
    with pytest.raises(Exception, match="name"):
        member_credentials(key, ca, "", [])


def test_coordinators_join_one_by_one_and_a_dead_one_is_replaced(tmp_path):
    """The first Coordinator's member starts a cluster of one; each further one is added by the leader
    and starts with the initial_cluster it returns; a dead one is removed and a new one added."""
    kms = ClusterKMS(MasterSecret.generate())
    ca_key, ca_pem = etcd_ca(kms)
    (tmp_path / "ca.pem").write_bytes(ca_pem)
    ports = iter(free_ports(10))

    def credentials(name):
        cert, key = member_credentials(ca_key, ca_pem, name, [])
        (tmp_path / (name + ".pem")).write_bytes(cert)
        atomic_write(str(tmp_path / (name + ".key")), key)  # 0600
        return {"ca_cert": str(tmp_path / "ca.pem"), "cert": str(tmp_path / (name + ".pem")),
                "key": str(tmp_path / (name + ".key"))}

    def member(name, initial=None, state="new"):
        return Etcd(str(tmp_path / name), next(ports), next(ports), name=name, initial_cluster=initial,
                    initial_cluster_state=state, tls=credentials(name), heartbeat_ms=50, election_ms=500)

    def join(store, name):
        new = member(name)
        store.member_add(new.peer_url)
        new.initial_cluster = initial_cluster(store.member_list(), name, new.peer_url)
        new.initial_cluster_state = "existing"
        return new.start()

    started = [member("c0").start()]
    try:
        store = EtcdStore([started[0].url], prefix="ha/", tls=credentials("client"))
        store.put("masterSecret", b"\x03" * 32)
        for name in ("c1", "c2"):
            started.append(join(store, name))
        assert sorted(m["name"] for m in store.member_list()) == ["c0", "c1", "c2"]
        assert EtcdStore([started[2].url], prefix="ha/", tls=credentials("c2")).get("masterSecret") == b"\x03" * 32
        # c1 is gone for good: the operator removes its member and a new Coordinator takes its place.
        started[1].kill()
        store.member_remove(next(m["id"] for m in store.member_list() if m["name"] == "c1"))
        started.append(join(store, "c3"))
        assert sorted(m["name"] for m in store.member_list()) == ["c0", "c2", "c3"]
        store.put("peersResourceVersion", b"9")
        fresh = EtcdStore([started[3].url], prefix="ha/", tls=credentials("c3"))
        assert fresh.items("") == [("masterSecret", b"\x03" * 32), ("peersResourceVersion", b"9")]
    finally:
        for etcd in started:
            etcd.stop()


@pytest.mark.parametrize("config, field", [
    ("not a mapping", "etcd_member"),
    ({"clientport": 1}, "etcd_member"),
    ({"client_port": 0}, "etcd_member.client_port"),
    ({"peer_port": True}, "etcd_member.peer_port"),
    ({"client_port": 2380}, "etcd_member.peer_port"),
    ({"heartbeat_ms": 1}, "etcd_member.heartbeat_ms"),
    ({"election_ms": "1000"}, "etcd_member.election_ms"),
    ({"data_dir": ""}, "etcd_member.data_dir"),
])
def test_the_agents_etcd_member_config_names_a_bad_field(config, field):
    from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
    from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd_member import EtcdMember

    with pytest.raises(InputError) as info:
        EtcdMember.from_config(config, "/var/lib/agent")
    assert info.value.field == field
    member = EtcdMember.from_config({}, "/var/lib/agent")
    assert (member.data_dir, member.peer_url("10.118.0.2")) == ("/var/lib/agent/etcd", "https://10.118.0.2:2380")


def test_the_agents_etcd_member_starts_a_cluster_and_a_learner_joins_it():
    """store/etcd_member.py on loopback: a member of a new cluster (TLS from the KMS), a second one added
    as a learner that serves no reads until promoted, then both serve the same data; a killed agent's
    member is ended by the next start (pid file)."""
    from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd_member import EtcdMember

    kms = ClusterKMS(MasterSecret.generate())
    base = tempfile.mkdtemp(prefix="store-etcd-member-", dir=tmpfs_dir())
    first_ports, second_ports = free_ports(2), free_ports(2)
    first = EtcdMember(os.path.join(base, "one"), *first_ports, heartbeat_ms=20, election_ms=200)
    second = EtcdMember(os.path.join(base, "two"), *second_ports, heartbeat_ms=20, election_ms=200)
    try:
        first.start("127.0.0.1", kms)
        store = first.open_store("127.0.0.1")
        store.put("peersResourceVersion", b"7")
        # A learner that never starts leaves again without a majority changing (writes go on meanwhile).
        member_id = store.member_add(second.peer_url("127.0.0.2"), learner=True)
        store.put("peersResourceVersion", b"8")
        store.member_remove(member_id)
        assert [m["name"] for m in store.member_list()] == ["coordinator-127-0-0-1"]
        pid = first.pid
        first._proc = None  # pylint: disable=protected-access  # the agent "dies", its member runs on
        first.start("127.0.0.1", kms)  # ends the member left behind, starts from the same data
        assert first.pid != pid and not os.path.exists("/proc/%d/cmdline" % pid) or is_zombie(pid)
        store = first.open_store("127.0.0.1")
        assert store.get("peersResourceVersion") == b"8"
        # A learner that starts (127.0.0.2: another loopback address, as another Coordinator's VPN IP)
        # serves no reads until it is promoted; then it has everything.
        member_id = store.member_add(second.peer_url("127.0.0.2"), learner=True)
        members = initial_cluster(store.member_list(), second.member_name("127.0.0.2"), second.peer_url("127.0.0.2"))
        second.start("127.0.0.2", kms, members)
        with pytest.raises(StoreError):
            EtcdStore([second.client_url("127.0.0.2")], timeout=2, tls=second._tls)  # pylint: disable=protected-access
        store.member_promote(member_id)
        assert second.open_store("127.0.0.2").get("peersResourceVersion") == b"8"
        assert sorted(m["name"] for m in store.member_list()) == ["coordinator-127-0-0-1", "coordinator-127-0-0-2"]
    finally:
        first.stop()
        second.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_a_member_removal_survives_a_crash_right_after_it():
    """etcd 3.4 forgets a removal when the member is killed before its next write (etcd-io/etcd#19571):
    the survivor then counts the removed member again and, alone, cannot elect itself. member_remove writes
    once after the removal, so a SIGKILL right after it changes nothing."""
    from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd_member import EtcdMember

    kms = ClusterKMS(MasterSecret.generate())
    base = tempfile.mkdtemp(prefix="store-etcd-remove-", dir=tmpfs_dir())
    first = EtcdMember(os.path.join(base, "one"), *free_ports(2), heartbeat_ms=20, election_ms=200, ready_timeout=8)
    second = EtcdMember(os.path.join(base, "two"), *free_ports(2), heartbeat_ms=20, election_ms=200)
    try:
        first.start("127.0.0.1", kms)
        store = first.open_store("127.0.0.1")
        store.put("peersResourceVersion", b"1")
        member_id = store.member_add(second.peer_url("127.0.0.2"), learner=True)
        second.start("127.0.0.2", kms, initial_cluster(store.member_list(), second.member_name("127.0.0.2"),
                                                       second.peer_url("127.0.0.2")))
        store.member_promote(member_id)
        second.open_store("127.0.0.2").close()
        store.member_remove(member_id)
        second.stop()
        first._proc.kill()  # pylint: disable=protected-access  # a crash right after the removal
        first._proc.wait()  # pylint: disable=protected-access
        first._proc = None  # pylint: disable=protected-access
        first.start("127.0.0.1", kms)
        store = first.open_store("127.0.0.1")  # alone, it has its majority: the removal was kept
        assert [m["name"] for m in store.member_list()] == ["coordinator-127-0-0-1"]
        assert store.get("peersResourceVersion") == b"1"
    finally:
        first.stop()
        second.stop()
        shutil.rmtree(base, ignore_errors=True)
