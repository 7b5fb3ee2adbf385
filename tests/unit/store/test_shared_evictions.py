# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Coordinators re-attested and evictions shared, on a real three-member etcd cluster with TLS (core/coordinator_removal.py's
fixture): three Coordinators' Cores (in-memory TPM and VPN, each on its own etcd member at 127.0.0.1-3, which
stand for their VPN IPs) share the cluster's state.

* 8: an eviction by one Coordinator is refused by every other, on every request (the vpnapi handlers,
  IssueRejoinTicket, re-admission), also when the evicting Coordinator died before it removed the peer;
* 7: the leader re-attests the other Coordinators; one that fails attestation is evicted from the registry
  and from the etcd membership, and named in every Coordinator's GetState; never below a live majority."""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
import time
from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from ansible_collections.constellation.cluster.plugins.module_utils import core, kms
from ansible_collections.constellation.cluster.plugins.module_utils.core.eviction import eviction_store
from ansible_collections.constellation.cluster.plugins.module_utils.core.records import state_store
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import expected_pcr15
from ansible_collections.constellation.cluster.plugins.module_utils.core.records.node_state import NodeState
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AccessDenied, AttestationError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import access, schema
from ansible_collections.constellation.cluster.plugins.module_utils.agent.wiring import vpnapi_handlers
from ansible_collections.constellation.cluster.plugins.module_utils.agent.peer_view import CorePeerView
from ansible_collections.constellation.cluster.plugins.module_utils.store import MemoryStore
from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd_member import member_name
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import generate_priv_key, pub_key_from_priv_key
from ansible_collections.constellation.cluster.tests.support.core_fakes import (
    FakePeerClient,
    FakeRejoinChannel,
    MemoryTPM,
    RecordingVPN,
)
from ansible_collections.constellation.cluster.tests.support.etcd_coordinators import HOSTS, Coordinators
from lab.etcd import tmpfs_dir

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/etcd"), reason="/usr/bin/etcd is missing")

VPN_CIDR = "127.0.0.0/24"
PUBLIC = {HOSTS[0]: "192.0.2.1", HOSTS[1]: "192.0.2.2", HOSTS[2]: "192.0.2.3"}
NODE_PUBLIC_IP = "192.0.2.11"


class LoopbackVPN(RecordingVPN):
    vpn_cidr = VPN_CIDR


class Member:
    """``ports.ClusterStoreMember`` around the fixture's running etcd member of one Coordinator."""

    running = True

    def __init__(self, cluster, host):
        self.cluster, self.host = cluster, host

    def member_name(self, vpn_ip):
        return member_name(vpn_ip)

    def peer_url(self, vpn_ip):
        return self.cluster.members[vpn_ip].peer_url

    def has_data(self):
        return True

    def start(self, vpn_ip, kms_, initial_cluster=None):  # pylint: disable=unused-argument
        self.running = True

    def open_store(self, vpn_ip):  # pylint: disable=unused-argument
        return self.cluster.store(self.host)

    def stop(self):
        self.running = False


class Log:
    def __init__(self):
        self.events = []

    def __call__(self, event, **fields):
        self.events.append(dict(fields, event=event))


def _core(tmp_path, name, tpm, store=None):
    state_dir = tmp_path / name
    state_dir.mkdir()
    log = Log()
    made = core.Core(store or MemoryStore(), tpm, LoopbackVPN(), str(state_dir), PUBLIC.get(name, "192.0.2.99"),
                     core.new_disk_uuid(), log=log)
    made.log_events = log.events
    return made


@pytest.fixture
def etcd():
    base = tempfile.mkdtemp(prefix="shared-evictions-", dir=tmpfs_dir())
    members = Coordinators(base)
    try:
        for member in members.members.values():
            member.start(wait=False)
        for member in members.members.values():
            member.wait_ready()
        yield members
    finally:
        members.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def coordinators(etcd, tmp_path):
    """Coordinator A (the first, at 127.0.0.1, moves its state to etcd), B and C (further Coordinators
    restarted from their stored state, each on its own member) and a Node recorded by A."""
    first = _core(tmp_path, HOSTS[0], MemoryTPM())
    first.context.etcd_member = Member(etcd, HOSTS[0])
    first.recovery.load()
    admin = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    secret = kms.MasterSecret.generate()
    first.coordinator.activate_as_coordinator(secret.to_uri(), os.urandom(32), admin, cluster_config={"vpn_cidr": VPN_CIDR})
    assert first.context.vpn_ip == HOSTS[0] and first.context.peer_registry.shared
    stored = first.context.stored_node()  # pylint: disable=protected-access
    cores = {HOSTS[0]: first}
    for host in HOSTS[1:]:
        priv_key = generate_priv_key()
        first.coordinator.add_node_peer(host, pub_key_from_priv_key(priv_key), PUBLIC[host], role="coordinator")
        local = MemoryStore()
        state_store.save_node_state(local, NodeState(
            role="coordinator", vpn_ip=host, vpn_priv_key=priv_key, cluster_id=stored.cluster_id,
            measurement_salt=stored.measurement_salt, admin_pub_key=admin, coordinator_vpn_ip=host,
            disk_uuid=core.new_disk_uuid(), peers=(), state=int(core.State.ACTIVATING_NODES)).to_dict())
        state_store.save_kms_data(local, {"kms_uri": secret.to_uri(), "storage_uri": kms.NO_STORE_URI})
        tpm = MemoryTPM()
        tpm.pcr = expected_pcr15(stored.cluster_id)
        further = _core(tmp_path, host, tpm, store=local)
        further.context.etcd_member = Member(etcd, host)
        assert further.recovery.load() == core.State.ACTIVATING_NODES and further.context.peer_registry.shared
        cores[host] = further
    node = {"vpn_pub_key": pub_key_from_priv_key(generate_priv_key()), "disk_uuid": core.new_disk_uuid()}
    node["vpn_ip"] = first.coordinator.reserve_node_ip()
    first.activation.record_node(node["vpn_ip"], node["vpn_pub_key"], NODE_PUBLIC_IP, node["disk_uuid"])
    yield cores, node
    for made in cores.values():
        made.context.store.close()


def _until(predicate, limit=10.0):
    deadline = time.monotonic() + limit
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate()


class Recorder:
    def __init__(self):
        self.sent = []

    def send_result(self, result):
        self.sent.append(result)


class PassingValidator:
    oid = "1.2.3"

    def validate(self, document, nonce):  # pylint: disable=unused-argument
        return SimpleNamespace(user_data=document, pcrs={})


def _attack_from_evicted_node(coordinator, node):
    """What the evicted Node tries at ``coordinator``: the vpnapi on a connection opened before the eviction
    (GetUpdate, GetStateDiskKey, GetDataKey), a rejoin ticket, a re-admission with another key. Returns
    every byte it received."""
    api = vpnapi_handlers(coordinator)
    # It proved its WireGuard key on this connection before it was evicted (PeerAuth).
    conn = SimpleNamespace(peer_ip=node["vpn_ip"], peer=(node["vpn_ip"], 40000), stream=Recorder(), admin=False,
                           authenticated_peer=True, vpn_peer_pub_key=node["vpn_pub_key"])
    assert api.accept_check(conn.peer) and "evicted" in api.accept_check(conn.peer)
    handlers, view = api.handlers(), CorePeerView(coordinator)
    for method, request in (("GetUpdate", schema.GetUpdateRequest(resource_version=0)), ("GetStateDiskKey", schema.Empty()),
                            ("GetDataKey", schema.GetDataKeyRequest(data_key_id="app", length=32))):
        with pytest.raises(AccessDenied) as err:  # as the vpnapi's FrameServer dispatches: authorise, then the handler
            conn.caller = access.authorise(method, schema.METHODS[method].access, conn, view)
            handlers[method](conn, request)
        assert err.value.reason == "evicted"
    channel = FakeRejoinChannel(FakeRejoinChannel.user_data(node["vpn_ip"], node["vpn_pub_key"], node["disk_uuid"]),
                                peer_ip=NODE_PUBLIC_IP)
    with pytest.raises(AccessDenied) as err:
        coordinator.peer_trust.serve_rejoin(node["vpn_ip"], node["vpn_pub_key"], node["disk_uuid"], channel, PassingValidator())
    assert err.value.reason == "evicted"
    with pytest.raises(StateError, match="evicted with another WireGuard key"):
        coordinator.evictions.check_readmission(node["vpn_ip"], pub_key_from_priv_key(generate_priv_key()))
    return repr(conn.stream.sent) + repr(channel.delivered)


def test_a_node_evicted_by_one_coordinator_is_refused_by_the_others(coordinators):
    cores, node = coordinators
    first, second, third = (cores[h] for h in HOSTS)
    disk_key = base64.b64encode(first.coordinator.state_disk_key(node["disk_uuid"])).decode()
    for other in (second, third):  # a peer in good standing before
        assert not other.evictions.is_evicted(node["vpn_ip"])
    first.peer_trust.evict_peer(node["vpn_ip"], "attestation failed: PCR 4 (test)")
    for other in (second, third):
        assert _until(lambda o=other: o.evictions.is_evicted(node["vpn_ip"]))
        received = _attack_from_evicted_node(other, node)
        assert disk_key not in received and "state_disk_key" not in received
        assert [e["vpn_ip"] for e in other.get_state()["evicted"]] == [node["vpn_ip"]]


def test_an_eviction_recorded_before_the_evicting_coordinator_died_is_refused_by_the_others(coordinators):
    """The eviction is written first, the registry change after: a Coordinator that dies in between
    leaves a peer still in the registry, which every other Coordinator must refuse all the same."""
    cores, node = coordinators
    second = cores[HOSTS[1]]
    record = {"vpn_ip": node["vpn_ip"], "vpn_pub_key": node["vpn_pub_key"], "public_ip": NODE_PUBLIC_IP,
              "role": "node", "reason": "attestation failed (test)", "ts": 0}
    eviction_store.save_eviction(cores[HOSTS[0]].context.store, node["vpn_ip"], record)
    assert second.coordinator.is_known_peer_ip(node["vpn_ip"])  # still in the registry
    assert _until(lambda: second.evictions.is_evicted(node["vpn_ip"]))
    disk_key = base64.b64encode(second.coordinator.state_disk_key(node["disk_uuid"])).decode()
    assert disk_key not in _attack_from_evicted_node(second, node)


def test_a_readmission_through_another_coordinator_clears_the_eviction_everywhere(coordinators):
    cores, node = coordinators
    first, second = cores[HOSTS[0]], cores[HOSTS[1]]
    first.peer_trust.evict_peer(node["vpn_ip"], "unreachable (test)")
    assert _until(lambda: second.evictions.is_evicted(node["vpn_ip"]))
    assert second.evictions.check_readmission(node["vpn_ip"], node["vpn_pub_key"]) is True
    second.activation.record_node(node["vpn_ip"], node["vpn_pub_key"], NODE_PUBLIC_IP, node["disk_uuid"])
    second.evictions.clear_eviction(node["vpn_ip"])
    assert _until(lambda: not first.evictions.is_evicted(node["vpn_ip"]))
    # The record and the cleared eviction are two keys: the first Coordinator's watch may see them in either order.
    assert _until(lambda: first.coordinator.is_known_peer_ip(node["vpn_ip"]))
    assert first.get_state()["evicted"] == []


def _connect(cores, node, tampered):
    first = cores[HOSTS[0]]
    ours = expected_pcr15(first.context.cluster_id)
    states = {PUBLIC[h]: {"vpn_ip": h, "vpn_pub_key": c.context.vpn_pub_key, "state": "ActivatingNodes", "role": "coordinator"}
              for h, c in cores.items()}
    states[NODE_PUBLIC_IP] = {"vpn_ip": node["vpn_ip"], "vpn_pub_key": node["vpn_pub_key"], "state": "IsNode"}

    def connect(public_ip):
        if public_ip == PUBLIC[tampered]:
            return FakePeerClient(None, {}, AttestationError("measurements mismatch: PCR 4: expected aa, found bb"))
        return FakePeerClient(ours, states[public_ip])

    return connect


def _members(store):
    deadline = time.monotonic() + 15
    while True:
        try:
            return sorted(m["name"] for m in store.member_list())
        except StateError:  # an election right after a removal
            if time.monotonic() >= deadline:
                raise
        time.sleep(0.1)


def test_the_leader_evicts_a_tampered_coordinator_from_the_registry_and_etcd(coordinators):
    cores, node = coordinators
    first, second, tampered = cores[HOSTS[0]], cores[HOSTS[1]], HOSTS[2]
    rows = {r["vpn_ip"]: r for r in first.peer_trust.reattest_peers(_connect(cores, node, tampered))}
    # Every peer but the leader itself is re-attested, the Coordinators too.
    assert set(rows) == {HOSTS[1], HOSTS[2], node["vpn_ip"]}
    assert rows[tampered]["outcome"] == "evicted" and rows[tampered]["role"] == "coordinator", first.get_state()["evicted"][0]["held"]
    assert rows[HOSTS[1]]["outcome"] == rows[node["vpn_ip"]]["outcome"] == "passed"
    registry = state_store.load_peer_registry(first.context.store)
    assert registry.peers.get(tampered) is None and registry.peers.get(HOSTS[1]) is not None
    assert registry.allocator.in_use(tampered)  # its VPN IP stays reserved: nobody else gets its eviction
    assert _members(first.context.store) == [member_name(HOSTS[0]), member_name(HOSTS[1])]
    assert tampered not in [p.vpn_ip for p in first.context.vpn.peers]
    for coordinator in (first, second):  # every Coordinator names it (GetState) and refuses it
        assert _until(lambda c=coordinator: c.evictions.is_evicted(tampered))
        (eviction,) = coordinator.get_state()["evicted"]
        assert eviction["vpn_ip"] == tampered and eviction["role"] == "coordinator"
        assert eviction["etcd_member"] == "removed" and "PCR 4" in eviction["reason"]
    assert _until(lambda: second.context.peer_registry.current().peers.get(tampered) is None)
    # The two that remain are the whole majority: the cluster keeps writing.
    second.context.store.put("probe", b"after the eviction")
    # The leader never evicts itself.
    assert first.peer_trust.evict_peer(first.context.vpn_ip, "test") is None and first.coordinator.is_known_peer_ip(first.context.vpn_ip)


def test_a_tampered_coordinator_is_not_removed_below_a_live_majority(coordinators, etcd):
    cores, node = coordinators
    first, tampered = cores[HOSTS[0]], HOSTS[2]
    etcd.members[HOSTS[1]].kill()  # B is down: A and the tampered C are the live majority of three
    rows = {r["vpn_ip"]: r for r in first.peer_trust.reattest_peers(_connect(cores, node, tampered))}
    assert rows[tampered]["outcome"] == "eviction_held"
    # Still a member and a peer (removing it would leave one live member of two: no writes), but named
    # as evicted with why, refused by the vpnapi, and logged as an error.
    assert len(_members(first.context.store)) == 3 and first.coordinator.is_known_peer_ip(tampered)
    (eviction,) = first.get_state()["evicted"]
    assert eviction["etcd_member"] == "kept" and "a majority needs 2" in eviction["held"]
    assert first.evictions.is_evicted(tampered)
    assert any(e["event"] == "coordinator_eviction_held" and e.get("level") == "error" for e in first.log_events)
    first.context.store.put("probe", b"the cluster still writes")
    # Once B is back, the next round evicts it.
    etcd.members[HOSTS[1]].start()
    assert _until(lambda: first.peer_trust.reattest_peers(_connect(cores, node, tampered))
                  and not first.coordinator.is_known_peer_ip(tampered), limit=60)
    assert _members(first.context.store) == [member_name(HOSTS[0]), member_name(HOSTS[1])]
    assert first.get_state()["evicted"][0]["etcd_member"] == "removed"


def test_the_shared_eviction_check_reads_the_store_at_most_once_per_interval(coordinators):
    from ansible_collections.constellation.cluster.plugins.module_utils.core.eviction.evictions import EvictionCache

    cores, node = coordinators
    second = cores[HOSTS[1]]
    now = [100.0]
    cache = EvictionCache(second.context.store, shared=True, follow_interval=0.1, clock=lambda: now[0])
    for _request in range(1000):  # a burst of requests within one interval: one version read
        assert node["vpn_ip"] not in cache.current()
    assert cache.peeks == 1 and cache.reloads == 1
    cores[HOSTS[0]].peer_trust.evict_peer(node["vpn_ip"], "test")
    assert node["vpn_ip"] not in cache.current()  # still within the interval: memory
    intervals = 0
    while node["vpn_ip"] not in cache.current() and intervals < 500:  # the member's copy may lag a little
        now[0] += 1.0
        intervals += 1
        time.sleep(0.01)
    assert node["vpn_ip"] in cache.current() and cache.reloads == 2  # the version changed: reloaded once
    peeks = cache.peeks
    now[0] += 1.0
    cache.current()
    assert cache.peeks == peeks + 1 and cache.reloads == 2  # nothing changed: the version read only
