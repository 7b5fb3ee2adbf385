# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Core's state machine and node lock, on a real swtpm."""

from __future__ import annotations

import base64
import os
import threading
import time

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils import core, kms
from ansible_collections.constellation.cluster.plugins.module_utils.core.records import state_store
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import expected_pcr15
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.store import MemoryStore
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import generate_priv_key, pub_key_from_priv_key
from ansible_collections.constellation.cluster.tests.support.core_fakes import MemoryTPM, RecordingVPN, admin_pem

State = core.State


@pytest.fixture
def secret():
    return kms.MasterSecret.generate()


def activate(c, secret, salt=None, pem=None):
    return c.coordinator.activate_as_coordinator(secret.to_uri(), salt or os.urandom(32), pem or admin_pem())


def test_fresh_node_accepts_init_and_coordinator_activation_locks_pcr15_first(swtpm, make_core, secret):
    c, vpn = make_core(swtpm)
    assert c.recovery.load() == State.ACCEPTING_INIT
    salt = os.urandom(32)
    result = activate(c, secret, salt)
    cluster_id = kms.ClusterKMS(secret).cluster_id(salt)
    assert result.cluster_id == cluster_id
    assert result.coordinator_vpn_ip == "10.118.0.1"
    assert c.state == State.ACTIVATING_NODES and c.role == "coordinator"
    assert c.context.tpm.pcr15() == expected_pcr15(cluster_id)
    assert vpn.address == "10.118.0.1"
    assert c.context.read_disk_key() == kms.ClusterKMS(secret).state_disk_key(c.context.disk_uuid)
    assert oct(os.stat(os.path.join(c.context.state_dir, core.STATE_DISK_KEY_FILE)).st_mode & 0o777) == "0o600"


def test_second_activation_is_refused_and_pcr15_extended_once(swtpm, make_core, secret):
    c, _vpn = make_core(swtpm)
    c.recovery.load()
    salt = os.urandom(32)
    activate(c, secret, salt)
    with pytest.raises(StateError, match="AcceptingInit"):
        activate(c, secret, salt)
    with pytest.raises(StateError, match="AcceptingInit"):
        c.node.activate_as_node_begin({})
    assert c.context.tpm.pcr15() == expected_pcr15(kms.ClusterKMS(secret).cluster_id(salt))


def test_concurrent_activations_exactly_one_wins(swtpm, make_core, secret):
    c, _vpn = make_core(swtpm)
    c.recovery.load()
    salts = [os.urandom(32) for _attempt in range(4)]
    barrier = threading.Barrier(len(salts))
    outcomes = []

    def run(salt):
        barrier.wait()
        try:
            outcomes.append(("ok", activate(c, secret, salt)))
        except StateError as err:
            outcomes.append(("refused", err))

    threads = [threading.Thread(target=run, args=(s,)) for s in salts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    winners = [o for kind, o in outcomes if kind == "ok"]
    assert len(winners) == 1 and len(outcomes) == len(salts)
    # PCR 15 was extended exactly once, with the winner's cluster ID.
    assert c.context.tpm.pcr15() == expected_pcr15(winners[0].cluster_id)


def test_bad_input_is_refused_before_the_point_of_no_return(swtpm, make_core, secret):
    c, _vpn = make_core(swtpm)
    c.recovery.load()
    with pytest.raises(InputError, match="measurement_salt"):
        c.coordinator.activate_as_coordinator(secret.to_uri(), os.urandom(31), admin_pem())
    with pytest.raises(InputError, match="admin_pub_key"):
        c.coordinator.activate_as_coordinator(secret.to_uri(), os.urandom(32), "not a key")
    with pytest.raises(InputError, match="kms_uri"):
        c.coordinator.activate_as_coordinator("kms://cluster-kms?key=&salt=", os.urandom(32), admin_pem())
    assert c.state == State.ACCEPTING_INIT
    assert c.context.tpm.pcr15() == bytes(32)


def _node_params(cluster_id, salt, coordinator_pub, admin, secret=None):
    signing_key = kms.coordinator_pub_key(kms.ClusterKMS(secret or kms.MasterSecret.generate()))
    return {"node_vpn_ip": "10.118.0.11", "coordinator_vpn_ip": "10.118.0.1", "cluster_id": base64.b64encode(cluster_id).decode(),
            "measurement_salt": base64.b64encode(salt).decode(), "admin_pub_key": admin, "coordinator_pub_key": signing_key,
            "peers": [{"vpn_ip": "10.118.0.1", "vpn_pub_key": coordinator_pub, "public_ip": "10.42.0.11",
                       "role": "coordinator"}]}


def test_a_node_asks_its_coordinator_first_then_every_other_one_it_knows(swtpm, make_core, secret):
    """Several Coordinators (#18): the Node's update loop tries them in this order (agent/update_loop.py)."""
    c, _vpn = make_core(swtpm)
    c.recovery.load()
    assert c.recovery.coordinator_vpn_ips() == []
    salt = os.urandom(32)
    params = _node_params(kms.ClusterKMS(secret).cluster_id(salt), salt, pub_key_from_priv_key(generate_priv_key()),
                          admin_pem())
    params["peers"] += [{"vpn_ip": ip, "vpn_pub_key": pub_key_from_priv_key(generate_priv_key()), "public_ip": public,
                         "role": role}
                        for ip, public, role in (("10.118.0.3", "10.42.0.13", "coordinator"),
                                                 ("10.118.0.12", "10.42.0.22", "node"),
                                                 ("10.118.0.2", "10.42.0.12", "coordinator"))]
    step = c.node.activate_as_node_begin(params)
    c.node.activate_as_node_finish(kms.ClusterKMS(secret).state_disk_key(step.state_disk_uuid))
    assert c.recovery.coordinator_vpn_ips() == ["10.118.0.1", "10.118.0.2", "10.118.0.3"]


def test_node_activation_two_steps(tmp_path, swtpm, make_core, secret):
    c, vpn = make_core(swtpm)
    c.recovery.load()
    salt = os.urandom(32)
    cluster_id = kms.ClusterKMS(secret).cluster_id(salt)
    coordinator_pub = pub_key_from_priv_key(generate_priv_key())
    step = c.node.activate_as_node_begin(_node_params(cluster_id, salt, coordinator_pub, admin_pem()))
    assert c.state == State.NODE_WAITING_FOR_CLUSTER_JOIN
    assert c.context.tpm.pcr15() == expected_pcr15(cluster_id)
    assert step.state_disk_uuid == c.context.disk_uuid
    assert vpn.address == "10.118.0.11" and [p.vpn_ip for p in vpn.peers] == ["10.118.0.1"]
    disk_key = kms.ClusterKMS(secret).state_disk_key(step.state_disk_uuid)
    assert c.node.activate_as_node_finish(disk_key)["state"] == "IsNode"
    assert c.context.read_disk_key() == disk_key
    with pytest.raises(StateError):
        c.node.activate_as_node_begin(_node_params(cluster_id, salt, coordinator_pub, admin_pem()))


def test_node_activation_interrupted_between_steps_waits_and_resumes(swtpm, make_core, secret):
    """The Coordinator went away after the node lock: the node keeps its lock and state (not Failed),
    survives an agent restart in that state, and finishes with the disk key fetched later; a second
    finish with the same key changes nothing, another key is refused."""
    store = MemoryStore()
    c, _vpn = make_core(swtpm, store=store)
    c.recovery.load()
    salt = os.urandom(32)
    cluster_id = kms.ClusterKMS(secret).cluster_id(salt)
    step = c.node.activate_as_node_begin(_node_params(cluster_id, salt, pub_key_from_priv_key(generate_priv_key()),
                                                      admin_pem()))
    c.node.abort_node_activation("coordinator went away")
    assert c.state == State.NODE_WAITING_FOR_CLUSTER_JOIN
    restarted, vpn2 = make_core(swtpm, store=store)  # the node's agent restarts
    assert restarted.recovery.load() == State.NODE_WAITING_FOR_CLUSTER_JOIN
    assert vpn2.address == "10.118.0.11" and [p.vpn_ip for p in vpn2.peers] == ["10.118.0.1"]
    assert restarted.get_state()["state_disk_uuid"] == step.state_disk_uuid
    with pytest.raises(StateError):  # nobody else can take the node over
        restarted.node.activate_as_node_begin(_node_params(cluster_id, salt, pub_key_from_priv_key(generate_priv_key()),
                                                           admin_pem()))
    disk_key = kms.ClusterKMS(secret).state_disk_key(step.state_disk_uuid)
    assert restarted.node.finish_activation(lambda: disk_key)["state"] == "IsNode"
    assert restarted.context.read_disk_key() == disk_key
    assert restarted.node.activate_as_node_finish(disk_key)["state"] == "IsNode"  # the late second step
    with pytest.raises(StateError):
        restarted.node.activate_as_node_finish(os.urandom(32))
    assert restarted.context.read_disk_key() == disk_key and restarted.state == State.IS_NODE


def test_restart_restores_the_state(swtpm, make_core, secret):
    store = MemoryStore()
    c, _vpn = make_core(swtpm, store=store)
    c.recovery.load()
    result = activate(c, secret)
    version = c.coordinator.add_node_peer(c.coordinator.reserve_node_ip(), pub_key_from_priv_key(generate_priv_key()), "10.42.0.20")
    again, vpn2 = make_core(swtpm, store=store)
    assert again.recovery.load() == State.ACTIVATING_NODES
    assert again.context.cluster_id == result.cluster_id and again.role == "coordinator"
    assert vpn2.address == "10.118.0.1" and [p.vpn_ip for p in vpn2.peers] == ["10.118.0.11"]
    assert again.coordinator.get_update(version) == {"resource_version": version}
    # The restored Coordinator still refuses a second activation.
    with pytest.raises(StateError):
        activate(again, secret)


def test_initialized_tpm_without_state_is_failed(swtpm, make_core, secret):
    c, _vpn = make_core(swtpm)
    c.recovery.load()
    activate(c, secret)
    stranger, _unused = make_core(swtpm)  # empty store, same (initialized) TPM
    assert stranger.recovery.load() == State.FAILED
    with pytest.raises(StateError):
        activate(stranger, secret)


def test_recover_after_tpm_reset(swtpm_factory, make_core, secret):
    tpm = swtpm_factory()
    store = MemoryStore()
    c, _vpn = make_core(tpm, store=store)
    c.recovery.load()
    result = activate(c, secret)
    tpm.stop()
    tpm.start()  # a reboot: PCRs reset
    again, _unused = make_core(tpm, store=store, disk_uuid=c.context.disk_uuid)
    assert again.recovery.load() == State.ACCEPTING_INIT and again.context.recovery_pending
    with pytest.raises(StateError):
        activate(again, secret)  # a node holding a cluster's state is not fresh
    with pytest.raises(StateError, match="cluster ID"):
        again.recovery.recover(kms.MasterSecret.generate().to_uri())
    assert again.context.tpm.pcr15() == bytes(32)
    assert again.recovery.recover(secret.to_uri())["state"] == "ActivatingNodes"
    assert again.context.tpm.pcr15() == expected_pcr15(result.cluster_id)
    with pytest.raises(StateError):
        again.recovery.recover(secret.to_uri())


def test_join_ticket_with_inconsistent_cluster_id_is_refused_before_lock(swtpm, make_core, secret):
    c, _vpn = make_core(swtpm)
    c.recovery.load()
    salt = os.urandom(32)
    ticket = core.JoinTicket(os.urandom(32), salt, os.urandom(32), os.urandom(32), "10.118.0.12", (), "10.118.0.1",
                             admin_pem())
    signer = core.signing.Signer(kms.ClusterKMS(secret))  # signed by the Coordinators' key the node pins
    c.context.join_coordinator_pub_key = signer.pub_key
    ticket = ticket.signed(signer.sign_ticket(core.signing.CONTEXT_JOIN_TICKET, ticket.to_dict(), b"binding"))
    with pytest.raises(StateError, match="cluster ID"):
        c.node.join(ticket, b"binding")
    assert c.context.tpm.pcr15() == bytes(32) and c.state == State.ACCEPTING_INIT


def test_join_then_update(swtpm, swtpm_factory, make_core, secret):
    coordinator_tpm = swtpm
    coord, _unused = make_core(coordinator_tpm)
    coord.recovery.load()
    activate(coord, secret)
    ip = coord.coordinator.reserve_node_ip()
    node_dir_tpm = swtpm_factory()
    node, vpn = make_core(node_dir_tpm)
    node.recovery.load()
    ticket = coord.signing.signed_join_ticket(coord.join_service.issue_join_ticket(node.context.disk_uuid, ip), b"binding")
    assert "secrets" in repr(ticket) and base64.b64encode(ticket.state_disk_key).decode() not in repr(ticket)
    node.context.join_coordinator_pub_key = kms.coordinator_pub_key(kms.ClusterKMS(secret))  # agent config
    node.node.join(core.JoinTicket.from_dict(ticket.to_dict()), b"binding")
    assert node.state == State.IS_NODE
    assert node.context.tpm.pcr15() == expected_pcr15(coord.context.cluster_id)
    assert node.context.read_disk_key() == kms.ClusterKMS(secret).state_disk_key(node.context.disk_uuid)
    coord.coordinator.add_node_peer(ip, node.context.vpn_pub_key, "10.42.0.30")
    other = pub_key_from_priv_key(generate_priv_key())
    coord.coordinator.add_node_peer(coord.coordinator.reserve_node_ip(), other, "10.42.0.31")
    assert node.node.apply_update(coord.coordinator.get_update(node.context.resource_version))
    assert other in [p.vpn_pub_key for p in vpn.peers]
    assert not node.node.apply_update(coord.coordinator.get_update(node.context.resource_version))
    assert coord.coordinator.get_update(node.context.resource_version) == {"resource_version": node.context.resource_version}


def test_get_data_key_refuses_reserved_ids_and_disk_uuids(swtpm, make_core, secret):
    c, _unused = make_core(swtpm)
    c.recovery.load()
    with pytest.raises(StateError):
        c.peer_access.get_data_key("foo", 32)
    activate(c, secret)
    # Namespaced per caller (peer/<WireGuard key>/): never the bare ID's key.
    caller = "B" * 43 + "="
    assert c.peer_access.get_data_key("foo", 16, caller) == kms.ClusterKMS(secret).derive_key("peer/%s/foo" % caller, 16)
    assert c.peer_access.get_data_key("foo", 16) == kms.ClusterKMS(secret).derive_key("peer/%s/foo" % c.context.vpn_pub_key, 16)
    assert kms.ClusterKMS(secret).derive_key("foo", 16) not in (c.peer_access.get_data_key("foo", 16), c.peer_access.get_data_key("foo", 16, caller))
    for bad in ("measurementSecret", "ca_emergency_ssh", "", c.context.disk_uuid):
        with pytest.raises(InputError):
            c.peer_access.get_data_key(bad, 32)
    with pytest.raises(InputError, match="length"):
        c.peer_access.get_data_key("foo", 0)
    assert state_store.load_kms_data(c.context.store)["kms_uri"] == secret.to_uri()


def test_get_state_reports_vpn_ip_and_key_once_activated(swtpm, make_core, secret):
    c, _vpn = make_core(swtpm)
    c.recovery.load()
    fresh = c.get_state()
    assert fresh["vpn_ip"] is None and fresh["vpn_pub_key"] is None
    result = activate(c, secret)
    state = c.get_state()
    assert state["state"] == "ActivatingNodes" and state["role"] == "coordinator"
    assert state["vpn_ip"] == result.coordinator_vpn_ip
    assert state["vpn_pub_key"] == result.coordinator_vpn_pub_key


def test_recover_refusal_carries_a_machine_readable_reason(swtpm, make_core, secret):
    from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
        REASON_NOT_WAITING_FOR_RECOVERY)

    c, _vpn = make_core(swtpm)
    c.recovery.load()
    with pytest.raises(StateError) as err:
        c.recovery.recover(secret.to_uri())
    assert err.value.reason == REASON_NOT_WAITING_FOR_RECOVERY


def test_two_nodes_added_at_once_leave_both_in_the_coordinators_wireguard(make_core, secret):
    """Two threads each commit a peer; the one whose WireGuard update runs last must apply the newer list.
    The first thread is held inside its update until the second one committed (what a slow `wg` does)."""

    class SlowFirstVPN(RecordingVPN):
        def __init__(self):
            super().__init__()
            self.calls = 0
            self.inside, self.go = threading.Event(), threading.Event()

        def set_peers(self, records, own_pub_key):
            self.calls += 1
            if self.calls == 1:  # the first node's update
                self.inside.set()
                self.go.wait(5)
            return super().set_peers(records, own_pub_key)

    c = make_core(MemoryTPM())[0]
    c.context.vpn = vpn = SlowFirstVPN()
    c.recovery.load()
    activate(c, secret)
    keys = [pub_key_from_priv_key(generate_priv_key()), pub_key_from_priv_key(generate_priv_key())]
    ips = [c.coordinator.reserve_node_ip(), c.coordinator.reserve_node_ip()]
    first = threading.Thread(target=c.coordinator.add_node_peer, args=(ips[0], keys[0], "10.42.0.31"))
    first.start()
    assert vpn.inside.wait(5)
    second = threading.Thread(target=c.coordinator.add_node_peer, args=(ips[1], keys[1], "10.42.0.32"))
    second.start()
    deadline = time.monotonic() + 5
    while c.context.peer_registry.current().peers.get(ips[1]) is None and time.monotonic() < deadline:
        time.sleep(0.02)  # until the second one committed its peer
    vpn.go.set()
    first.join(5)
    second.join(5)
    assert {p.vpn_pub_key for p in vpn.peers} == set(keys)
