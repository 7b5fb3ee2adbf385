# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A Coordinator's etcd member that dies while its agent lives (core/cluster.py,
``supervise_etcd_member``; docs/store.md, "Losing Coordinators"): the agent's loop starts it again from
its data, and GetState reports it (``etcd_member``), so verify.yml can tell. The member here is a
stand-in for the port ``ClusterStoreMember`` whose process the test ends; the real etcd member, killed
and started again by a real agent, is tested in tests/integration/test_coordinators.py."""

from __future__ import annotations

import os

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from ansible_collections.constellation.cluster.plugins.module_utils import core, kms
from ansible_collections.constellation.cluster.plugins.module_utils.errors import StateError
from ansible_collections.constellation.cluster.plugins.module_utils.store import MemoryStore
from ansible_collections.constellation.cluster.tests.support.core_fakes import MemoryTPM, RecordingVPN


class StoppableMember:
    """``ports.ClusterStoreMember``: ``running`` is its process; ``open_store`` hands out the cluster's store."""

    def __init__(self):
        self.cluster = MemoryStore()
        self.starts = []
        self.running = False
        self.refuse = None  # an error the next start raises (etcd exited before it served)

    @staticmethod
    def member_name(vpn_ip):
        return "coordinator-" + vpn_ip.replace(".", "-")

    @staticmethod
    def peer_url(vpn_ip):
        return "https://%s:2380" % vpn_ip

    def has_data(self):
        return bool(self.starts)

    def start(self, vpn_ip, kms_, initial_cluster=None):
        assert kms_ is not None  # the member's TLS comes from the KMS
        if self.refuse is not None:
            raise self.refuse
        self.starts.append((vpn_ip, initial_cluster))
        self.running = True

    def open_store(self, _vpn_ip):
        return self.cluster

    def stop(self):
        self.running = False


def coordinator(tmp_path, member):
    """An activated Coordinator (memory TPM and store) with ``member``; returns it and its log."""
    events = []
    c = core.Core(MemoryStore(), MemoryTPM(), RecordingVPN(), str(tmp_path), "10.42.0.10", core.new_disk_uuid(),
                  log=lambda event, **fields: events.append(dict(fields, event=event)))
    c.context.etcd_member = member
    c.recovery.load()
    pem = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    c.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), pem)
    return c, events


def named(events, event):
    return [e for e in events if e["event"] == event]


def test_a_member_that_died_is_reported_then_started_again_from_its_data(tmp_path):
    member = StoppableMember()
    c, events = coordinator(tmp_path, member)
    assert c.state == core.State.ACTIVATING_NODES and c.context.store is member.cluster
    assert c.get_state()["etcd_member"] == "running"
    assert c.shared_store.supervise_etcd_member() is False and len(member.starts) == 1  # running: nothing to do
    member.running = False  # the process died; the agent lives
    assert c.get_state()["etcd_member"] == "stopped"
    assert c.shared_store.supervise_etcd_member() is True
    assert member.starts[-1] == (c.context.vpn_ip, None)  # its data decides: it rejoins, no new cluster
    assert [e["level"] for e in named(events, "etcd_member_exited")] == ["warning"]
    assert named(events, "etcd_member_started")[-1]["cluster"] == "restart"
    assert c.get_state()["etcd_member"] == "running"
    assert c.context.store is member.cluster  # the same shared state, served on


def test_a_start_that_fails_raises_for_the_loop_and_is_tried_again(tmp_path):
    member = StoppableMember()
    c, events = coordinator(tmp_path, member)
    member.running = False
    member.refuse = StateError("etcd_member: etcd exited (1) before it could accept connections")
    with pytest.raises(StateError, match="etcd exited"):
        c.shared_store.supervise_etcd_member()
    assert c.get_state()["etcd_member"] == "stopped" and not named(events, "etcd_member_started")[1:]
    member.refuse = None
    assert c.shared_store.supervise_etcd_member() is True
    assert len(named(events, "etcd_member_exited")) == 2
    assert c.get_state()["etcd_member"] == "running"


def test_without_a_shared_state_there_is_nothing_to_supervise_or_report(tmp_path):
    (tmp_path / "alone").mkdir()
    alone, _events = coordinator(tmp_path / "alone", None)  # one Coordinator, its own store
    assert "etcd_member" not in alone.get_state() and alone.shared_store.supervise_etcd_member() is False
    fresh = core.Core(MemoryStore(), MemoryTPM(), RecordingVPN(), str(tmp_path), "10.42.0.11", core.new_disk_uuid())
    fresh.context.etcd_member = member = StoppableMember()  # configured, but not activated: no member yet
    fresh.recovery.load()
    assert "etcd_member" not in fresh.get_state()
    assert fresh.shared_store.supervise_etcd_member() is False and member.starts == []


# --------------------------------------------------------------------------- verify.yml's verdict


def verify_problems(name, status, coordinators=("h1", "h2")):
    """verify_peer.yml's verdict (the filter verify_problems) on an attested peer whose agent_state
    result is ``status.to_dict()`` (the mesh check left out: no WireGuard here)."""
    from ansible_collections.constellation.cluster.plugins.filter.verify import verify_problems as verdict

    return verdict(name, peer=status.to_dict(), attested=True, coordinator=name in coordinators, cluster_id="set")


@pytest.mark.parametrize("etcd_member, problems", [
    ("stopped", ["h2: its etcd member is not running (the Coordinators' shared state has one member less)"]),
    ("running", []),
    (None, []),  # one Coordinator, no etcd member: nothing to report
])
def test_verify_fails_a_coordinator_whose_member_is_stopped(etcd_member, problems):
    from ansible_collections.constellation.cluster.plugins.plugin_utils.controller import PeerReport

    status = PeerReport(endpoint="192.0.2.2:9000", state="ActivatingNodes", role="coordinator", membership="ours",
                        etcd_member=etcd_member)
    assert verify_problems("h2", status) == problems


def test_a_coordinator_whose_state_is_local_refuses_further_coordinators(tmp_path):
    """Activated without an etcd member, then given one in its config (an upgrade): its state stays in its
    local store, so ActivateAdditionalNodes with Coordinators is refused, naming why - not a foreign error
    from a store that has no members."""
    c, _events = coordinator(tmp_path, None)
    c.context.etcd_member = StoppableMember()  # configured after the activation
    assert c.context.store is c.context.local_store
    with pytest.raises(StateError, match="keeps the cluster's state in its local store"):
        c.cluster.activate_coordinators(["10.42.0.12:9000"], lambda endpoint: pytest.fail("nothing may be contacted"))
    member = StoppableMember()
    (tmp_path / "shared").mkdir()
    shared, _events = coordinator(tmp_path / "shared", member)
    assert shared.context.store is member.cluster and shared.context.shares_state()  # pylint: disable=protected-access
