# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The AKs a Coordinator certified survive its restart (core/eviction/certified_ak_store.py): they are kept in its sealed
store, so a restarted Coordinator re-attests a Node without EnrollAK, and no budget a stranger drains (or a
restart of the Coordinator's agent) makes every Node enroll again. A stored record is checked against the EK
roots configured now: one whose EK does not chain to them is dropped. A real Node pubapi (qemu-vtpm-ek issuer
on a swtpm with an EK certificate) on loopback; the Coordinator's store is a file sealed with a storage key
sealed by its own swtpm (core/at_rest.py), reopened by a new Core as after a restart."""

from __future__ import annotations

import json

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils import core
from ansible_collections.constellation.cluster.plugins.module_utils.agent.pubapi import PubAPI
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose, tpm
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.ek import VTPMEKIssuer, VTPMEKValidator
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import Measurements
from ansible_collections.constellation.cluster.plugins.module_utils.core.at_rest import SealedStorage
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient, connect_enrolling
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import AgentServerContext, FrameServer
from ansible_collections.constellation.cluster.plugins.module_utils.store.file import FileStore
from ansible_collections.constellation.cluster.tests.support.core_fakes import RecordingVPN

PCRS = [4, 9, 11]


@pytest.fixture
def node(swtpm_ek):
    """A Node's pubapi (qemu-vtpm-ek on a swtpm with an EK certificate) that counts the EnrollAK requests it
    serves; (endpoint, the count, the Node's issuer, the fleet CA's certificate paths)."""
    issuer = VTPMEKIssuer(swtpm_ek.tcti, event_log_path=None)
    api = PubAPI(issuer=issuer)
    enrolled = []
    handlers = api.handlers()
    enroll = handlers["EnrollAK"]

    def counting(conn, request):
        enrolled.append(conn.peer_ip)
        return enroll(conn, request)

    handlers["EnrollAK"] = counting
    tls = AgentServerContext(issuer, key_pool_size=0)
    server = FrameServer("pubapi", ("127.0.0.1", 0), handlers, tls=tls).start()
    yield "127.0.0.1:%d" % server.address[1], enrolled, issuer, swtpm_ek.ca_cert_paths()
    server.stop()
    tls.close()
    issuer.close()


class Coordinator:
    """A Coordinator's agent as far as re-attestation's AK trust goes: its sealed store (a file encrypted with
    a storage key sealed by its own swtpm), a Core over it, the EK roots of its config, and the connection
    re-attestation opens (``connect_enrolling``, as agent/wiring.py's ``connect_peer``)."""

    def __init__(self, state_dir, tcti, ca_paths, log):
        state_dir.mkdir(exist_ok=True)
        self.storage = SealedStorage.open(str(state_dir), lambda: tpm.open_tpm(tcti), PCRS)
        self.store = FileStore(str(state_dir / "store.json"), cipher=self.storage)
        self.core = core.Core(self.store, core.TPMDevice(tcti), RecordingVPN(), str(state_dir), "127.0.0.1",
                              core.new_disk_uuid(), log=log)
        self.trust = choose.load_trust("qemu-vtpm-ek", ca_paths)
        self.validator = VTPMEKValidator(Measurements(), ca_paths, certified_aks=self.trust.certified_aks)
        keep = getattr(self.core.peer_trust, "keep_certified_aks", None)  # without it: the AKs live in memory only
        self.loaded = keep(self.trust.certified_aks) if keep is not None else 0

    def reattest(self, endpoint):
        with connect_enrolling(lambda v: AgentClient.connect(endpoint, v, timeout=10), [self.validator]) as client:
            return client.attested_pcrs()


def test_a_restarted_coordinator_reattests_without_enrolling_again(node, fresh_swtpm, tmp_path):
    """Attack: after any restart of the Coordinator's agent every Node had to enroll again, so a stranger who
    keeps EnrollAK's budget empty (or only slows the TPM) got every Node counted unreachable. Now the first
    re-attestation enrolls the Node's AK once; the Coordinator restarts (a new Core over the same sealed store,
    the same swtpm) and re-attests the Node, fully validated, without a second EnrollAK."""
    endpoint, enrolled, issuer, ca_paths = node
    logs = []
    first = Coordinator(tmp_path / "coordinator", fresh_swtpm.tcti, ca_paths, lambda event, **f: logs.append(event))
    assert first.loaded == 0
    assert first.reattest(endpoint) and len(enrolled) == 1
    assert first.reattest(endpoint) and len(enrolled) == 1  # the same process: certified already
    restarted = Coordinator(tmp_path / "coordinator", fresh_swtpm.tcti, ca_paths, lambda event, **f: logs.append(event))
    assert restarted.reattest(endpoint)
    assert len(enrolled) == 1, "the restarted Coordinator enrolled the Node's AK again"
    assert restarted.loaded == 1 and restarted.trust.certified_aks.get(issuer.ak_pub) is not None
    raw = (tmp_path / "coordinator" / "store.json").read_bytes()
    assert issuer.ak_pub not in raw and b"certifiedAK" not in raw  # sealed: not readable without the key


def test_a_stored_ak_whose_ek_does_not_chain_to_the_configured_roots_is_dropped(node, swtpm_other_ca, fresh_swtpm,
                                                                                tmp_path):
    """A record in the store vouches that its AK lives in the TPM of its EK certificate: one whose EK does not
    chain to the EK roots configured now (another fleet's CA, or a root the admin removed) is not taken at the
    start, and it is dropped from the store (logged); the genuine record is kept."""
    from ansible_collections.constellation.cluster.plugins.module_utils.core.eviction import certified_ak_store

    endpoint, enrolled, issuer, ca_paths = node
    logs = []
    first = Coordinator(tmp_path / "coordinator", fresh_swtpm.tcti, ca_paths, lambda event, **f: logs.append((event, f)))
    first.reattest(endpoint)
    other = VTPMEKIssuer(swtpm_other_ca.tcti, event_log_path=None)
    try:
        foreign = {"ak_pub": other.enrollment_request()["ak_pub"], "ek_cert": other.enrollment_request()["ek_cert"]}
        foreign_ak = other.ak_pub
    finally:
        other.close()
    certified_ak_store.save_certified_ak(first.store, foreign_ak, foreign, 8192)
    assert len(certified_ak_store.load_certified_aks(first.store)) == 2
    restarted = Coordinator(tmp_path / "coordinator", fresh_swtpm.tcti, ca_paths, lambda event, **f: logs.append((event, f)))
    assert restarted.loaded == 1
    assert restarted.trust.certified_aks.get(foreign_ak) is None
    assert restarted.trust.certified_aks.get(issuer.ak_pub) is not None
    stored = [json.dumps(data) for _key, data in certified_ak_store.load_certified_aks(restarted.store)]
    assert len(stored) == 1 and foreign["ek_cert"] not in stored[0]
    assert [event for event, _f in logs].count("certified_ak_dropped") == 1
    restarted.reattest(endpoint)
    assert len(enrolled) == 1


def test_the_stored_records_are_bounded_oldest_first(tmp_path):
    """At most the registry's cap: a new certification beyond it pushes out the oldest record."""
    from ansible_collections.constellation.cluster.plugins.module_utils.core.eviction import certified_ak_store

    store = FileStore(str(tmp_path / "store.json"))
    now = [100.0]
    for index in range(5):
        now[0] += 1
        certified_ak_store.save_certified_ak(store, b"ak%d" % index, {"ak_pub": "ak%d" % index}, 3, clock=lambda: now[0])
    kept = [data["ak_pub"] for _key, data in certified_ak_store.load_certified_aks(store)]
    assert kept == ["ak2", "ak3", "ak4"]
