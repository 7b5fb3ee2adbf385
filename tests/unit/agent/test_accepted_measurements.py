# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The accepted measurement sets on a running cluster (an image upgrade), attacked over real sockets:
SetMeasurements on the admin channel (no admin key, a Node, an unsigned or altered document where a key is
pinned, a stale version, retiring a set a peer still runs) and GetMeasurements on the vpnapi (no PeerAuth, a
stranger, a Node's own vpnapi). A real Core (Coordinator, in-memory TPM and store), loopback as the VPN
(127.78.0.0/16: each client binds the address of the peer it claims to be)."""

from __future__ import annotations

import base64
import json
import os
import socket

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from ansible_collections.constellation.cluster.plugins.module_utils import core as core_mod
from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.module_utils.agent.wiring import vpnapi_handlers
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import signature
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import DummyValidator
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import parse_policy
from ansible_collections.constellation.cluster.plugins.module_utils.core.accepted_measurements import KEY_PEER_AGENT_PREFIX, UNKNOWN
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import schema
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import RemoteError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import FrameServer
from ansible_collections.constellation.cluster.plugins.module_utils.store import MemoryStore
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import generate_priv_key, pub_key_from_priv_key
from ansible_collections.constellation.cluster.tests.support.core_fakes import MemoryTPM, RecordingVPN, pubapi_server
from ansible_collections.constellation.cluster.plugins.module_utils.agent.peer_view import CorePeerView
from ansible_collections.constellation.cluster.tests.support.keys import measurements_key

VPN_CIDR = "127.78.0.0/16"


class LoopbackVPN(RecordingVPN):
    vpn_cidr = VPN_CIDR


def _set(byte):
    return {str(i): {"expected": (bytes([byte + i]) * 32).hex(), "warnOnly": False} for i in (4, 9, 11)}


def document(version, *names):
    sets = {"v1": _set(0x10), "v2": _set(0x20), "v3": _set(0x30)}
    return json.dumps({"version": version, "accepted": {n: sets[n] for n in names}}, indent=2).encode()


def set_measurements(client, doc, sig=None, check=False):
    """SetMeasurements as the accepted_measurements action calls it (the generic client of the table)."""
    return client.invoke("SetMeasurements", document=doc, signature=sig, check=check)


def get_measurements(client):
    answer = client.invoke("GetMeasurements")
    return dict(answer, document=base64.b64decode(answer["document"]))


def admin_keypair():
    key = ed25519.Ed25519PrivateKey.generate()
    return key, key.public_key().public_bytes(serialization.Encoding.PEM,
                                              serialization.PublicFormat.SubjectPublicKeyInfo).decode()


class Cluster:
    """A Coordinator whose policy in force is ``document(1, "v1")``, its pubapi + admin channel and its vpnapi on
    loopback, and whatever the agent wires (applied documents are recorded in ``applied``)."""

    def __init__(self, tmp_path, pub_key=None):
        state_dir = tmp_path / "coordinator"
        state_dir.mkdir()
        self.core = core_mod.Core(MemoryStore(), MemoryTPM(), LoopbackVPN(), str(state_dir), "10.42.0.10",
                                  core_mod.new_disk_uuid())
        self.core.recovery.load()
        self.admin_key, admin_pem = admin_keypair()
        self.core.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), admin_pem,
                                                      cluster_config={"vpn_cidr": VPN_CIDR})
        self.policy = parse_policy(json.loads(document(1, "v1")))
        self.applied = []
        service = self.core.accepted_measurements
        service.pub_key = pub_key
        service.current = lambda: self.policy
        service.own_set = lambda: "v1"
        service.on_apply = self._apply
        self.vpnapi = vpnapi_handlers(self.core)
        self.vpn_server = FrameServer("vpnapi", ("127.78.0.1", 0), self.vpnapi.handlers(),
                                      accept_check=self.vpnapi.accept_check, apis=(schema.VPNAPI,),
                                      peer_view=CorePeerView(self.core)).start()
        self.keys = {}

    def _apply(self, doc, sig, sets):
        self.applied.append((doc, sig))
        self.policy = sets

    def add_node(self, public_ip):
        vpn_ip = self.core.coordinator.reserve_node_ip()
        priv_key = generate_priv_key()
        self.core.activation.record_node(vpn_ip, pub_key_from_priv_key(priv_key), public_ip, core_mod.new_disk_uuid(),
                                         False)
        self.keys[vpn_ip] = priv_key
        return vpn_ip

    def vpn_client(self, source_ip, authenticate=True):
        sock = socket.create_connection(("127.78.0.1", self.vpn_server.address[1]), timeout=10,
                                        source_address=(source_ip, 0))
        client = AgentClient.connect_plain("127.78.0.1:%d" % self.vpn_server.address[1], sock=sock, timeout=10)
        if authenticate and source_ip in self.keys:
            client.peer_auth(self.keys[source_ip], self.core.context.vpn_pub_key)
        return client

    def close(self):
        self.vpn_server.stop()


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.close()


@pytest.fixture
def admin(cluster):
    with pubapi_server(cluster.core) as server:
        with AgentClient.connect("127.0.0.1:%d" % server.address[1], [DummyValidator()]) as client:
            yield client


def test_the_admin_sets_new_sets_idempotently_and_check_mode_changes_nothing(cluster, admin):
    admin.admin_auth(cluster.admin_key)
    predicted = set_measurements(admin, document(2, "v1", "v2"), check=True)
    assert predicted["changed"] is True and predicted["added"] == ["v2"] and predicted["removed"] == []
    assert cluster.applied == [] and cluster.core.accepted_measurements.stored() is None
    answer = set_measurements(admin, document(2, "v1", "v2"))
    assert answer["changed"] is True and answer["sets"] == ["v1", "v2"] and answer["version"] == 2
    assert cluster.applied == [(document(2, "v1", "v2"), None)]
    again = set_measurements(admin, document(2, "v1", "v2"))
    assert again["changed"] is False and len(cluster.applied) == 1
    report = set_measurements(admin, None)  # no document: what is in force, and who runs what
    assert (report["changed"], report["version"], report["sets"]) == (False, 2, ["v1", "v2"])
    assert report["peers"] == {cluster.core.context.vpn_ip: "v1"}


def test_without_the_admin_key_nothing_is_set(cluster, admin):
    with pytest.raises(RemoteError) as err:
        set_measurements(admin, document(2, "v1", "v2"))
    assert err.value.kind == "AccessDenied" and "AdminAuth first" in str(err.value)
    other, _pem = admin_keypair()
    with pytest.raises(RemoteError):
        admin.admin_auth(other)
    with pytest.raises(RemoteError) as err:
        set_measurements(admin, document(2, "v1", "v2"))
    assert err.value.kind == "AccessDenied"
    assert cluster.applied == [] and cluster.core.accepted_measurements.stored() is None


def test_a_stale_or_reused_version_is_refused(cluster, admin):
    admin.admin_auth(cluster.admin_key)
    set_measurements(admin, document(3, "v1", "v2"))
    with pytest.raises(RemoteError, match="a version of at least 3"):
        set_measurements(admin, document(2, "v1", "v3"))  # an old document replayed
    with pytest.raises(RemoteError, match="version 3 is in force with other sets"):
        set_measurements(admin, document(3, "v1", "v3"))
    assert len(cluster.applied) == 1


def test_retiring_a_set_a_peer_still_runs_is_refused_naming_the_peers(cluster, admin):
    admin.admin_auth(cluster.admin_key)
    node_a, node_b = cluster.add_node("10.42.0.21"), cluster.add_node("10.42.0.22")
    set_measurements(admin, document(2, "v1", "v2"))
    with pytest.raises(RemoteError) as err:
        set_measurements(admin, document(3, "v2"))
    text = str(err.value)
    assert "cannot retire v1" in text and node_a in text and node_b in text and UNKNOWN in text
    cluster.core.accepted_measurements.record_peer_set(node_a, "v2")
    cluster.core.accepted_measurements.record_peer_set(node_b, "v1")
    with pytest.raises(RemoteError) as err:
        set_measurements(admin, document(3, "v2"))
    assert "%s (v1)" % node_b in str(err.value) and node_a not in str(err.value)
    assert "%s (v1)" % cluster.core.context.vpn_ip in str(err.value)  # the Coordinator itself runs v1
    cluster.core.accepted_measurements.record_peer_set(node_b, "v2")
    cluster.core.accepted_measurements.own_set = lambda: "v2"
    assert set_measurements(admin, document(3, "v2"))["removed"] == ["v1"]


def test_a_document_stored_but_not_applied_is_applied_on_the_next_call(cluster, admin):
    admin.admin_auth(cluster.admin_key)
    apply = cluster.core.accepted_measurements.on_apply

    def fail_once(doc, sig, sets):
        cluster.core.accepted_measurements.on_apply = apply
        raise OSError("disk full")

    cluster.core.accepted_measurements.on_apply = fail_once
    with pytest.raises(RemoteError):
        set_measurements(admin, document(2, "v1", "v2"))
    assert cluster.applied == [] and cluster.core.accepted_measurements.version() == 2  # stored, not in force here
    assert set_measurements(admin, document(2, "v1", "v2"))["changed"] is False
    assert cluster.applied == [(document(2, "v1", "v2"), None)]


def test_a_set_renamed_is_not_retired(cluster, admin):
    """The plain policy's one set ("default") named after its image: the same measurements, no peer left behind."""
    admin.admin_auth(cluster.admin_key)
    cluster.add_node("10.42.0.21")  # not re-attested yet: would block a real retirement
    cluster.policy = parse_policy(json.loads(document(1, "v1"))["accepted"]["v1"])
    answer = set_measurements(admin, document(2, "v1", "v2"))
    assert answer["changed"] and answer["removed"] == ["default"]


def test_a_node_cannot_set_measurements(swtpm, make_core):
    node, _vpn = make_core(MemoryTPM())
    node.recovery.load()
    with pubapi_server(node) as server:
        with AgentClient.connect("127.0.0.1:%d" % server.address[1], [DummyValidator()]) as client:
            with pytest.raises(RemoteError) as err:
                set_measurements(client, document(2, "v1", "v2"))
    assert "only after activation" in str(err.value)


def test_with_a_pinned_key_only_a_signed_document_is_taken(tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    cluster = Cluster(tmp_path, pub_key=key.public_key())
    try:
        with pubapi_server(cluster.core) as server:
            with AgentClient.connect("127.0.0.1:%d" % server.address[1], [DummyValidator()]) as admin:
                admin.admin_auth(cluster.admin_key)
                doc = document(2, "v1", "v2")
                with pytest.raises(RemoteError, match="an unsigned document is never accepted"):
                    set_measurements(admin, doc)
                forged = document(2, "v1", "v3")
                with pytest.raises(RemoteError, match="does not verify"):
                    set_measurements(admin, forged, signature.sign_blob(key, doc))  # a signature of another file
                signed = signature.sign_blob(key, doc)
                assert set_measurements(admin, doc, signed)["changed"] is True
        assert cluster.applied == [(doc, signed)]
    finally:
        cluster.close()


def test_get_measurements_only_for_an_authenticated_peer_and_get_update_says_the_version(cluster, admin):
    admin.admin_auth(cluster.admin_key)
    node = cluster.add_node("10.42.0.21")
    with cluster.vpn_client(node) as client:
        assert client.get_update(0)["measurements_version"] == 1  # the policy in force
        with pytest.raises(RemoteError, match="no measurements document was set"):
            get_measurements(client)
    set_measurements(admin, document(2, "v1", "v2"))
    with cluster.vpn_client(node) as client:
        assert client.get_update(0)["measurements_version"] == 2
        answer = get_measurements(client)
        assert answer["version"] == 2 and answer["document"] == document(2, "v1", "v2")
    with cluster.vpn_client(node, authenticate=False) as client:  # the node's address, not its WireGuard key
        with pytest.raises(RemoteError, match="PeerAuth first"):
            get_measurements(client)
    with pytest.raises((RemoteError, OSError)):  # a stranger's address: refused at accept
        with cluster.vpn_client("127.78.9.9", authenticate=False) as client:
            get_measurements(client)


def test_the_policy_file_and_its_signature_change_together_even_across_a_stop(tmp_path):
    from ansible_collections.constellation.cluster.plugins.module_utils.agent.policy_file import NEXT_SIGNATURE, PolicyFile
    from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError

    pub = tmp_path / "m.pub"
    key = measurements_key(pub)
    path = tmp_path / "measurements.json"
    policy_file = PolicyFile(str(path), str(pub))
    policy_file.write(document(1, "v1"), signature.sign_blob(key, document(1, "v1")))
    assert list(policy_file.load().sets) == ["v1"] and not (tmp_path / ("measurements.json" + NEXT_SIGNATURE)).exists()
    # A stop after the document was written, before its signature was put in place: finished at the next start.
    (tmp_path / ("measurements.json" + NEXT_SIGNATURE)).write_text(signature.sign_blob(key, document(2, "v1", "v2")))
    path.write_bytes(document(2, "v1", "v2"))
    assert list(PolicyFile(str(path), str(pub)).load().sets) == ["v1", "v2"]
    # Without a pending signature an altered file is still refused.
    path.write_bytes(document(3, "v3"))
    with pytest.raises(InputError, match="does not verify"):
        PolicyFile(str(path), str(pub)).load()


def test_get_update_says_the_version_in_memory_when_the_store_cannot_answer(cluster, admin, monkeypatch):
    """A poll never waits for, or fails with, the store (an etcd without a majority): GetUpdate's version is the
    last one read, from a peek (the member's own copy) at most once a second."""
    from ansible_collections.constellation.cluster.plugins.module_utils.core import accepted_measurements
    from ansible_collections.constellation.cluster.plugins.module_utils.store import StoreError

    admin.admin_auth(cluster.admin_key)
    set_measurements(admin, document(2, "v1", "v2"))
    node = cluster.add_node("10.42.0.22")
    monkeypatch.setattr(accepted_measurements, "VERSION_CACHE_SECONDS", 0.0)
    store = cluster.core.context.store
    peeks = []

    def no_majority(key, default=None):
        peeks.append(key)
        raise StoreError("etcd has no quorum")

    monkeypatch.setattr(store, "peek", no_majority)
    monkeypatch.setattr(store, "get_default", lambda *a, **k: pytest.fail("a poll read the store with a majority read"))
    with cluster.vpn_client(node) as client:
        assert client.get_update(0)["measurements_version"] == 2
        assert client.get_update(0)["measurements_version"] == 2
    assert peeks  # it did ask, and answered from memory when the store could not


AGENT_OLD, AGENT_NEW, AGENT_OTHER = bytes([0xa1]) * 32, bytes([0xb2]) * 32, bytes([0xc3]) * 32


def agents_document(version, agents):
    doc = json.loads(document(version, "v1"))
    doc["agents"] = {name: {"pcr": 13, "value": value.hex()} for name, value in agents.items()}
    return json.dumps(doc, indent=2).encode()


def test_no_longer_accepting_the_agent_a_peer_runs_is_refused_naming_the_peers_in_check_mode_too(cluster, admin):
    admin.admin_auth(cluster.admin_key)
    service = cluster.core.accepted_measurements
    coordinator = cluster.core.context.vpn_ip
    service.own_agent = lambda: ("self", AGENT_OLD)  # the policy in force lists no agents: its own value
    node_a, node_b = cluster.add_node("10.42.0.21"), cluster.add_node("10.42.0.22")
    assert set_measurements(admin, None)["agents"] == {coordinator: "self", node_a: UNKNOWN, node_b: UNKNOWN}
    # Accepting the running agent and the next one retires nothing: taken although the nodes were not re-attested.
    answer = set_measurements(admin, agents_document(2, {"0.2.0": AGENT_OLD, "0.3.0": AGENT_NEW}))
    assert answer["changed"] and cluster.policy.agents.keys() == {"0.2.0", "0.3.0"}
    service.own_agent = lambda: ("0.2.0", AGENT_OLD)
    service.record_peer_agent(node_a, ("0.3.0", AGENT_NEW))
    # Retiring 0.2.0: the Coordinator runs it and node_b was not re-attested since; check mode says so too.
    for check in (True, False):
        with pytest.raises(RemoteError) as err:
            set_measurements(admin, agents_document(3, {"0.3.0": AGENT_NEW}), check=check)
        text = str(err.value)
        assert "cannot retire the agent 0.2.0" in text and "%s (%s)" % (node_b, UNKNOWN) in text, text
        assert "%s (0.2.0=%s)" % (coordinator, AGENT_OLD.hex()) in text and "%s (" % node_a not in text
    assert service.version() == 2 and len(cluster.applied) == 1  # nothing stored or applied
    # A document that renames the agent node_a runs still accepts its value; one that accepts none of it does not.
    service.record_peer_agent(node_b, ("0.2.0", AGENT_OLD))
    with pytest.raises(RemoteError) as err:
        set_measurements(admin, agents_document(3, {"0.2.0": AGENT_OLD, "evil": AGENT_OTHER}))
    assert "cannot retire the agent 0.3.0" in str(err.value) and "%s (0.3.0=" % node_a in str(err.value)
    assert "%s (" % node_b not in str(err.value) and "%s (" % coordinator not in str(err.value)
    # Every peer on 0.3.0 (re-attested): 0.2.0 is retired; the answer says who runs what.
    service.record_peer_agent(node_b, ("0.3.0", AGENT_NEW))
    service.own_agent = lambda: ("0.3.0", AGENT_NEW)
    answer = set_measurements(admin, agents_document(3, {"next": AGENT_NEW}))
    assert answer["changed"] and answer["agents"] == {coordinator: "0.3.0", node_a: "0.3.0", node_b: "0.3.0"}
    assert cluster.core.context.store.get(KEY_PEER_AGENT_PREFIX + node_a) is not None


def test_a_node_image_peer_runs_no_agent_on_pcr_13_and_never_blocks_retiring_one(cluster, admin):
    """An image Coordinator (agent_measurement.IMAGE_AGENT: its PCR 13 holds zero, its image set covers its agent) and
    an image Node: retiring a host agent concerns neither; the answer names them "(image)"."""
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.agent_measurement import IMAGE_AGENT

    admin.admin_auth(cluster.admin_key)
    service = cluster.core.accepted_measurements
    coordinator = cluster.core.context.vpn_ip
    service.own_agent = lambda: (IMAGE_AGENT, AGENT_NEW)  # its own value: what it accepts on host peers
    image_node, host_node = cluster.add_node("10.42.0.21"), cluster.add_node("10.42.0.22")
    set_measurements(admin, agents_document(2, {"0.2.0": AGENT_OLD, "0.3.0": AGENT_NEW}))
    service.record_peer_agent(image_node, (IMAGE_AGENT, bytes(32)))
    service.record_peer_agent(host_node, ("0.3.0", AGENT_NEW))
    answer = set_measurements(admin, agents_document(3, {"0.3.0": AGENT_NEW}))
    assert answer["changed"] and answer["agents"] == {coordinator: IMAGE_AGENT, image_node: IMAGE_AGENT,
                                                      host_node: "0.3.0"}


def test_a_document_without_agents_accepts_the_coordinator_s_own_agent_only(cluster, admin):
    admin.admin_auth(cluster.admin_key)
    service = cluster.core.accepted_measurements
    service.own_agent = lambda: ("0.3.0", AGENT_NEW)
    node = cluster.add_node("10.42.0.21")
    set_measurements(admin, agents_document(2, {"0.2.0": AGENT_OLD, "0.3.0": AGENT_NEW}))
    service.record_peer_agent(node, ("0.2.0", AGENT_OLD))
    with pytest.raises(RemoteError) as err:  # without agents only the Coordinator's own value (0.3.0) is accepted
        set_measurements(admin, document(3, "v1"))
    assert "cannot retire the agent 0.2.0" in str(err.value) and "%s (0.2.0=" % node in str(err.value)
    service.record_peer_agent(node, ("0.3.0", AGENT_NEW))
    assert set_measurements(admin, document(3, "v1"))["changed"]
