# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Disk UUID ownership, against the real Core: the attacker asks for the disk key of a disk UUID it does not
own (UUIDs are public: GetState). A disk UUID belongs to the first peer
recorded with it (by its WireGuard key): a join or activation naming a UUID of another peer (a Node's,
or the Coordinator's own) gets nothing, with an AccessDenied naming the UUID as taken."""

from __future__ import annotations

import os

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils import core, kms
from ansible_collections.constellation.cluster.plugins.module_utils.core.records import node_records
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import DummyIssuer, DummyValidator
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AccessDenied, ConnectionLost
from ansible_collections.constellation.cluster.plugins.module_utils.store import MemoryStore
from ansible_collections.constellation.cluster.tests.support.core_fakes import (
    FakeJoinChannel,
    FakeNodeClient,
    MemoryTPM,
    admitted_issuer,
    coordinator,
)


@pytest.fixture
def secret():
    return kms.MasterSecret.generate()


def join(coord, disk_uuid, node_vpn_pub_key, confirm=True):
    """A join with a valid attestation by an admitted TPM (the attacker runs the cluster's image on a node the
    admin admitted) for ``disk_uuid``; returns (what the Coordinator answered, the tickets the node received)."""
    received = []
    channel = FakeJoinChannel(admitted_issuer(coord), lambda ticket, _binding: received.append(ticket), confirm=confirm)
    channel.node_vpn_pub_key, channel.disk_uuid = node_vpn_pub_key, disk_uuid
    return coord.join_service.serve_join(disk_uuid, node_vpn_pub_key, channel, DummyValidator()), received


def test_a_join_naming_another_nodes_disk_uuid_gets_nothing(make_core, secret):
    coord, _vpn = coordinator(make_core, secret)
    victim_uuid = core.new_disk_uuid()
    answer, _tickets = join(coord, victim_uuid, os.urandom(32))  # node A joined with U
    state = coord.get_state()  # UUIDs are public: the attacker reads U (and the Coordinator's own)
    for taken, owner in ((victim_uuid, answer["node_vpn_ip"]), (state["state_disk_uuid"], state["vpn_ip"])):
        attacker_pub = os.urandom(32)
        with pytest.raises(AccessDenied) as err:
            join(coord, taken, attacker_pub)
        assert "disk UUID %s is taken" % taken in str(err.value) and owner in str(err.value)
    # Nothing left for the attacker: no ticket was delivered, no IP kept, the victim's record intact.
    assert coord.coordinator.reserve_node_ip() == "10.118.0.12"
    assert node_records.load_node_disk_uuid(coord.context.store, answer["node_vpn_ip"]) == victim_uuid
    assert node_records.disk_uuid_owner(coord.context.store, victim_uuid)["vpn_ip"] == answer["node_vpn_ip"]


def test_the_attacker_gets_no_ticket_even_when_the_refusal_comes_late(make_core, secret):
    """The ownership is decided in the store transaction right before the ticket leaves (not only by the
    early check): two joins racing for one UUID, one wins."""
    coord, _vpn = coordinator(make_core, secret)
    uuid = core.new_disk_uuid()
    first_pub, second_pub = os.urandom(32), os.urandom(32)
    coord.peer_access.require_disk_uuid_free(uuid, core.inputs.b64(second_pub), "IssueJoinTicket")  # both pass the early check
    join(coord, uuid, first_pub)
    tickets = []
    with pytest.raises(AccessDenied, match="disk UUID %s is taken" % uuid):
        vpn_ip = coord.coordinator.reserve_node_ip()
        try:
            coord.peer_access.claim_disk_uuid(uuid, vpn_ip, core.inputs.b64(second_pub), "IssueJoinTicket")
            tickets.append(coord.join_service.issue_join_ticket(uuid, vpn_ip))
        finally:
            coord.coordinator.release_node_ip(vpn_ip)
    assert tickets == []


def test_the_same_node_may_retry_with_its_own_uuid(make_core, secret):
    coord, _vpn = coordinator(make_core, secret)
    uuid, pub = core.new_disk_uuid(), os.urandom(32)
    with pytest.raises(ConnectionLost):  # the ticket was sent, the confirmation never came
        join(coord, uuid, pub, confirm=False)
    answer, tickets = join(coord, uuid, pub)  # the same node (its WireGuard key) joins again
    assert answer["node_vpn_ip"] and tickets[-1]["state_disk_key"]


def test_an_activation_reporting_a_taken_uuid_is_refused(make_core, secret):
    coord, _vpn = coordinator(make_core, secret)
    joined_uuid = core.new_disk_uuid()
    join(coord, joined_uuid, os.urandom(32))
    # A fresh node whose agent reports that UUID (its disk_uuid file says so).
    node, _node_vpn = make_core(MemoryTPM(), store=MemoryStore(), disk_uuid=joined_uuid)
    node.recovery.load()
    rows = coord.activation.activate_nodes(["10.42.0.50:9000"], lambda endpoint: FakeNodeClient(node))
    assert not rows[0]["ok"] and "disk UUID %s is taken" % joined_uuid in rows[0]["error"]
    assert node.context.read_disk_key() is None  # the key never left


def test_the_store_records_owner_and_node_in_one_transaction():
    store = MemoryStore()
    uuid = core.new_disk_uuid()
    assert node_records.claim_disk_uuid(store, uuid, "10.118.0.11", "A" * 43 + "=") is None
    assert node_records.claim_disk_uuid(store, uuid, "10.118.0.11", "A" * 43 + "=") is None  # again: its own
    assert node_records.claim_disk_uuid(store, uuid, "10.118.0.12", "B" * 43 + "=") == "10.118.0.11"
    assert node_records.load_node_disk_uuid(store, "10.118.0.12") is None  # nothing written for the refused
    # A UUID recorded by an older version (no owner record) belongs to the node it was recorded for.
    legacy = core.new_disk_uuid()
    node_records.save_node_disk_uuid(store, "10.118.0.13", legacy)
    assert node_records.claim_disk_uuid(store, legacy, "10.118.0.14", "C" * 43 + "=") == "10.118.0.13"
    assert node_records.claim_disk_uuid(store, legacy, "10.118.0.13", "D" * 43 + "=") is None


def test_a_coordinator_without_an_owner_record_keeps_its_own_disk(make_core, secret):
    """A Coordinator activated before ownership records existed: its own disk UUID is still refused."""
    coord, _vpn = coordinator(make_core, secret)
    coord.context.store.delete(node_records.KEY_DISK_UUID_OWNER_PREFIX + coord.context.disk_uuid)  # as an older version left it
    with pytest.raises(AccessDenied, match="disk UUID %s is taken" % coord.context.disk_uuid):
        join(coord, coord.context.disk_uuid, os.urandom(32))


def test_a_rejoin_naming_another_nodes_disk_gets_nothing(make_core, secret):
    coord, _vpn = coordinator(make_core, secret)
    victim_uuid, attacker_uuid, attacker_pub = core.new_disk_uuid(), core.new_disk_uuid(), os.urandom(32)
    join(coord, victim_uuid, os.urandom(32))
    attacker = join(coord, attacker_uuid, attacker_pub)[0]
    channel = FakeJoinChannel(DummyIssuer(), lambda *_ticket: pytest.fail("a ticket was delivered"))
    channel.user_data = lambda vpn_ip, pub, uuid: b"bound:" + vpn_ip.encode() + pub.encode() + uuid.encode()
    with pytest.raises(AccessDenied, match="not a recorded Node of this cluster with this WireGuard key and disk"):
        coord.peer_trust.serve_rejoin(attacker["node_vpn_ip"], core.inputs.b64(attacker_pub), victim_uuid, channel,
                                      DummyValidator())
