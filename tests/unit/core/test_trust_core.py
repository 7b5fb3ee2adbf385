# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Trust after activation at the Core, through its ports (no sockets): the init secret (refused before the node
lock), re-attestation and eviction (a failed attestation evicts at once, an unreachable peer is
unverified after the limit and evicted only after a period; the vpnapi refuses an evicted peer; re-admission keeps the key), rejoin tickets (only
a recorded peer, bound to the connection; a Node never takes the KMS URI), and signed policies."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess

import pytest
from cryptography.hazmat.primitives import serialization

from ansible_collections.constellation.cluster.plugins.module_utils import core, kms
from ansible_collections.constellation.cluster.plugins.module_utils.kms import init_secret
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import signature
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import expected_pcr15
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import (
    load_policy, read_policy_document)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    AccessDenied, AttestationError, ConstellationError, InputError, StateError)
from ansible_collections.constellation.cluster.plugins.module_utils.agent.wiring import vpnapi_handlers
from ansible_collections.constellation.cluster.plugins.module_utils.store import MemoryStore
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import generate_priv_key, pub_key_from_priv_key

from ansible_collections.constellation.cluster.tests.support.core_fakes import (
    FakePeerClient,
    FakeRejoinChannel,
    MemoryTPM,
    activate_node,
    admin_pem,
)
from ansible_collections.constellation.cluster.tests.support.keys import measurements_key

State = core.State
INIT_SECRET = os.urandom(32)


def provisioned(make_core, public_ip, store=None):
    c, vpn = make_core(MemoryTPM(), store=store, public_ip=public_ip)
    c.context.init_secret_hash = init_secret.init_secret_hash(INIT_SECRET, public_ip)
    c.recovery.load()
    return c, vpn


# ------------------------------------------------------------------ init secret (item 4)


def test_init_secret_hash_is_per_node_and_parses_strictly():
    a = init_secret.init_secret_hash(base64.b64encode(INIT_SECRET).decode(), "10.42.0.11")
    assert a == hashlib.sha256(init_secret.node_init_secret(INIT_SECRET, "10.42.0.11")).hexdigest()
    assert a != init_secret.init_secret_hash(INIT_SECRET, "10.42.0.12")
    assert init_secret.parse_init_secret_hash(a.upper()) == a
    with pytest.raises(InputError) as err:
        init_secret.parse_init_secret(base64.b64encode(b"x" * 31).decode())
    assert "x" * 8 not in str(err.value)
    with pytest.raises(InputError):
        init_secret.parse_init_secret_hash("00" * 31)


def test_coordinator_activation_without_or_with_a_wrong_init_secret_is_refused_before_the_lock(make_core):
    c, _vpn = provisioned(make_core, "10.42.0.11")
    secret = kms.MasterSecret.generate()
    for attempt in (None, os.urandom(32), init_secret.node_init_secret(INIT_SECRET, "10.42.0.11")):
        with pytest.raises(AccessDenied) as err:
            c.coordinator.activate_as_coordinator(secret.to_uri(), os.urandom(32), admin_pem(), init_secret=attempt)
        assert err.value.reason == "init_proof"
        assert base64.b64encode(INIT_SECRET).decode() not in str(err.value)
    assert c.context.tpm.pcr15() == bytes(32) and c.state == State.ACCEPTING_INIT
    c.coordinator.activate_as_coordinator(secret.to_uri(), os.urandom(32), admin_pem(), init_secret=INIT_SECRET)
    assert c.state == State.ACTIVATING_NODES


def test_node_refuses_activation_without_its_own_proof_and_accepts_the_coordinators(make_core):
    coordinator, _vpn = provisioned(make_core, "10.42.0.11")
    coordinator.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), admin_pem(),
                                                    init_secret=INIT_SECRET)
    node, _vpn = provisioned(make_core, "10.42.0.12")
    request = coordinator.coordinator.node_activation_request(coordinator.coordinator.reserve_node_ip()).to_dict()
    other = base64.b64encode(init_secret.node_init_secret(INIT_SECRET, "10.42.0.13")).decode()
    for params in (request, dict(request, init_proof=other)):  # missing; relayed from another node
        with pytest.raises(AccessDenied):
            node.node.activate_as_node_begin(params)
    assert node.context.tpm.pcr15() == bytes(32) and node.state == State.ACCEPTING_INIT
    step = node.node.activate_as_node_begin(dict(request, **coordinator.coordinator.init_proof_for("10.42.0.12")))
    assert step.node_vpn_pub_key and node.context.tpm.pcr15() == expected_pcr15(coordinator.context.cluster_id)
    assert "init_proof" not in repr(core.NodeActivationRequest.from_dict(dict(request, init_proof=other)))


def test_join_ticket_of_a_coordinator_of_another_cluster_is_refused_before_the_lock(make_core):
    """A Coordinator of another cluster passes the node's policy (same image): its ticket carries no init proof
    (no ticket does), and the node refuses it by the Coordinators' key pinned in its agent config."""
    ours, _vpn = make_core(MemoryTPM(), public_ip="10.42.0.20")
    ours.recovery.load()
    ours.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), admin_pem(),
                                             init_secret=INIT_SECRET)
    stranger, _vpn = make_core(MemoryTPM(), public_ip="10.42.0.21")  # passes the policy, another cluster
    stranger.recovery.load()
    stranger.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), admin_pem(),
                                                 init_secret=os.urandom(32))
    node, _vpn = provisioned(make_core, "10.42.0.22")
    node.context.join_coordinator_pub_key = ours.signing.coordinator_pub_key()
    ticket = stranger.signing.signed_join_ticket(
        stranger.join_service.issue_join_ticket(node.context.disk_uuid, stranger.coordinator.reserve_node_ip()), b"b")
    assert "init_proof" not in ticket.to_dict()
    with pytest.raises(AccessDenied, match="does not verify with the pinned Coordinator key"):
        node.node.join(core.JoinTicket.from_dict(ticket.to_dict()), b"b")
    assert node.context.tpm.pcr15() == bytes(32) and node.context.read_disk_key() is None


# ------------------------------------------------------------------ re-attestation, eviction (item 1)


def test_a_failed_attestation_evicts_at_once_and_the_vpnapi_refuses_the_peer(cluster):
    c, vpn, nodes = cluster
    ours = expected_pcr15(c.context.cluster_id)
    bad = "10.42.0.13"
    version = c.coordinator.get_update(-1)["resource_version"]

    def connect(public_ip):
        if public_ip == bad:
            return FakePeerClient(error=AttestationError("measurements mismatch: PCR 9: expected aa, found bb"))
        return FakePeerClient(ours, nodes[public_ip])

    rows = {r["public_ip"]: r["outcome"] for r in c.peer_trust.reattest_peers(connect)}
    assert rows == {"10.42.0.12": "passed", bad: "evicted"}
    evicted_ip = nodes[bad]["vpn_ip"]
    assert not c.coordinator.is_known_peer_ip(evicted_ip) and c.evictions.is_evicted(evicted_ip)
    assert nodes[bad]["vpn_pub_key"] not in [p.vpn_pub_key for p in vpn.peers]
    update = c.coordinator.get_update(version)
    assert update["removed"] == [evicted_ip]
    assert [e["vpn_ip"] for e in c.get_state()["evicted"]] == [evicted_ip]
    assert "PCR 9" in c.get_state()["evicted"][0]["reason"]
    api = vpnapi_handlers(c)
    assert "evicted" in api.accept_check((evicted_ip, 4000))
    with pytest.raises(AccessDenied) as err:
        c.evictions.require_not_evicted(evicted_ip, "GetDataKey")
    assert err.value.reason == "evicted"
    # Its VPN IP stays allocated: a new node never gets it.
    assert c.coordinator.reserve_node_ip() != evicted_ip


def test_an_unreachable_peer_is_unverified_after_the_limit_evicted_after_the_period_and_a_success_resets(cluster):
    c, _vpn, nodes = cluster
    ours = expected_pcr15(c.context.cluster_id)
    down = {"10.42.0.12"}
    now = [1.8e9]
    c.peer_trust.clock = lambda: now[0]

    def connect(public_ip):
        if public_ip in down:
            return FakePeerClient(error=ConstellationError("cannot connect to %s:9000: timed out" % public_ip))
        return FakePeerClient(ours, nodes[public_ip])

    def outcome():
        rows = c.peer_trust.reattest_peers(connect, unreachable_limit=3, unverified_eviction_after=600)
        now[0] += 60
        return [r["outcome"] for r in rows if r["public_ip"] == "10.42.0.12"][0]

    assert [outcome() for _round in range(2)] == ["unreachable"] * 2
    down.clear()
    assert outcome() == "passed"  # reachable again: the count starts over
    down.add("10.42.0.12")
    assert [outcome() for _round in range(10)] == ["unreachable"] * 2 + ["unverified"] * 8
    assert c.get_state()["evicted"] == [] and len(c.get_state()["unverified"]) == 1
    assert outcome() == "evicted"  # 600 s after its first unreachable round of this streak
    assert "unreachable and unverified for 600 s" in c.get_state()["evicted"][0]["reason"]
    assert c.get_state()["unverified"] == []


def test_a_peer_with_another_identity_or_cluster_is_evicted_and_readmission_needs_the_same_key(cluster):
    c, _vpn, nodes = cluster
    ours = expected_pcr15(c.context.cluster_id)
    imposter = dict(nodes["10.42.0.12"], vpn_pub_key=pub_key_from_priv_key(generate_priv_key()))

    def connect(public_ip):
        if public_ip == "10.42.0.12":
            return FakePeerClient(ours, imposter)
        return FakePeerClient(os.urandom(32), nodes[public_ip])  # PCR 15 of another cluster

    assert {r["outcome"] for r in c.peer_trust.reattest_peers(connect)} == {"evicted"}
    vpn_ip = nodes["10.42.0.12"]["vpn_ip"]
    with pytest.raises(StateError):
        c.evictions.check_readmission(vpn_ip, imposter["vpn_pub_key"])
    assert c.evictions.check_readmission(vpn_ip, nodes["10.42.0.12"]["vpn_pub_key"]) is True
    c.activation.record_node(vpn_ip, nodes["10.42.0.12"]["vpn_pub_key"], "10.42.0.12", state_disk_uuid(c, vpn_ip))
    c.evictions.clear_eviction(vpn_ip)
    assert c.coordinator.is_known_peer_ip(vpn_ip) and not c.evictions.is_evicted(vpn_ip)


def state_disk_uuid(c, vpn_ip):
    from ansible_collections.constellation.cluster.plugins.module_utils.core.records import node_records

    return node_records.load_node_disk_uuid(c.context.store, vpn_ip)


def test_evictions_survive_a_coordinator_restart(make_core):
    store = MemoryStore()
    tpm = MemoryTPM()
    c, _vpn = make_core(tpm, store=store, public_ip="10.42.0.11")
    c.recovery.load()
    c.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), admin_pem())
    vpn_ip = c.coordinator.reserve_node_ip()
    c.activation.record_node(vpn_ip, pub_key_from_priv_key(generate_priv_key()), "10.42.0.12", core.new_disk_uuid())
    c.peer_trust.evict_peer(vpn_ip, "test")
    again, _vpn = make_core(tpm, store=store, public_ip="10.42.0.11")
    again.recovery.load()
    assert again.evictions.is_evicted(vpn_ip) and [e["vpn_ip"] for e in again.get_state()["evicted"]] == [vpn_ip]


# ------------------------------------------------------------------ rejoin (item 3)


class FakeValidator:
    oid = "1.2.3"

    def validate(self, document, nonce):  # pylint: disable=unused-argument
        if document == b"garbage":
            raise AttestationError("not a quote")
        return type("V", (), {"user_data": document, "pcrs": {}})()


def test_rejoin_ticket_goes_only_to_a_recorded_peer_and_holds_only_what_it_needs(make_core):
    secret = kms.MasterSecret.generate()
    c, _vpn = make_core(MemoryTPM(), public_ip="10.42.0.11")
    c.recovery.load()
    c.coordinator.activate_as_coordinator(secret.to_uri(), os.urandom(32), admin_pem())
    key, uuid = pub_key_from_priv_key(generate_priv_key()), core.new_disk_uuid()
    vpn_ip = c.coordinator.reserve_node_ip()
    c.activation.record_node(vpn_ip, key, "10.42.0.12", uuid)
    good = FakeRejoinChannel(b"")
    good.document = good.user_data(vpn_ip, key, uuid)
    with pytest.raises(AccessDenied):  # not the recorded key
        c.peer_trust.serve_rejoin(vpn_ip, pub_key_from_priv_key(generate_priv_key()), uuid, good, FakeValidator())
    with pytest.raises(AttestationError):  # cannot attest
        c.peer_trust.serve_rejoin(vpn_ip, key, uuid, FakeRejoinChannel(b"garbage"), FakeValidator())
    with pytest.raises(AttestationError, match="bound"):  # an attestation for another request
        c.peer_trust.serve_rejoin(vpn_ip, key, uuid, FakeRejoinChannel(b"x" * 32), FakeValidator())
    c.peer_trust.serve_rejoin(vpn_ip, key, uuid, good, FakeValidator())
    ticket = good.delivered.to_dict()
    assert set(ticket) == {"state_disk_key", "measurement_secret", "peers", "resource_version", "signature"}
    assert base64.b64decode(ticket["state_disk_key"]) == kms.ClusterKMS(secret).state_disk_key(uuid)
    assert secret.to_uri() not in repr(good.delivered) and secret.to_uri() not in str(ticket)
    c.peer_trust.evict_peer(vpn_ip, "test")
    with pytest.raises(AccessDenied):
        c.peer_trust.serve_rejoin(vpn_ip, key, uuid, good, FakeValidator())


class AliasedValidator(FakeValidator):
    alias_oids = ("1.2.4",)  # the variant's earlier OID (attestation/variant.py, Variant.alias_oids)


class ChannelUnder(FakeRejoinChannel):
    """A node that answers the in-band challenge under ``oid``."""

    def __init__(self, document, oid):
        super().__init__(document)
        self.oid = oid

    def challenge(self, nonce):  # pylint: disable=unused-argument
        return self.oid, self.document


def test_an_in_band_proof_under_the_variants_earlier_oid_is_taken_and_another_oid_refused(make_core):
    c, _vpn = make_core(MemoryTPM(), public_ip="10.42.0.11")
    c.recovery.load()
    c.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), admin_pem())
    key, uuid = pub_key_from_priv_key(generate_priv_key()), core.new_disk_uuid()
    vpn_ip = c.coordinator.reserve_node_ip()
    c.activation.record_node(vpn_ip, key, "10.42.0.12", uuid)
    binding = FakeRejoinChannel.user_data(vpn_ip, key, uuid)
    with pytest.raises(AttestationError, match=r"attestation variant '1\.2\.5' is not accepted \(expected 1\.2\.3\)"):
        c.peer_trust.serve_rejoin(vpn_ip, key, uuid, ChannelUnder(binding, "1.2.5"), AliasedValidator())
    old = ChannelUnder(binding, "1.2.4")
    c.peer_trust.serve_rejoin(vpn_ip, key, uuid, old, AliasedValidator())
    assert old.delivered is not None


def test_a_node_never_takes_the_kms_uri_and_rejoins_with_a_ticket(make_core):
    secret = kms.MasterSecret.generate()
    coordinator, _vpn = make_core(MemoryTPM(), public_ip="10.42.0.11")
    coordinator.recovery.load()
    coordinator.coordinator.activate_as_coordinator(secret.to_uri(), os.urandom(32), admin_pem())
    store, tpm = MemoryStore(), MemoryTPM()
    node, _vpn = make_core(tpm, store=store, public_ip="10.42.0.12")
    step = activate_node(coordinator, node, "10.42.0.12")
    tpm.pcr = bytes(32)  # a reboot
    rebooted, _vpn = make_core(tpm, store=store, public_ip="10.42.0.12", disk_uuid=node.context.disk_uuid)
    rebooted.context.state_dir = node.context.state_dir
    assert rebooted.recovery.load() == State.ACCEPTING_INIT and rebooted.context.recovery_pending
    with pytest.raises(StateError, match="does not take the KMS URI"):
        rebooted.recovery.recover(secret.to_uri())

    def request_ticket(vpn_ip, pub_key, disk_uuid, on_ticket):
        channel = FakeRejoinChannel(b"")
        channel.document = channel.user_data(vpn_ip, pub_key, disk_uuid)
        channel.deliver = lambda ticket: on_ticket(ticket.to_dict(), channel.document)
        return coordinator.peer_trust.serve_rejoin(vpn_ip, pub_key, disk_uuid, channel, FakeValidator())

    assert rebooted.recovery.rejoin(request_ticket)["state"] == "IsNode"
    assert tpm.pcr15() == expected_pcr15(coordinator.context.cluster_id)
    assert rebooted.context.vpn_pub_key == step.node_vpn_pub_key


# ------------------------------------------------------------------ signed measurements (item 5)


@pytest.fixture
def signed(tmp_path):
    pub = tmp_path / "cosign.pub"
    key = measurements_key(pub)
    policy = tmp_path / "measurements.json"
    policy.write_text('{"4": {"expected": "%s", "warnOnly": false}}\n' % ("ab" * 32))
    (tmp_path / "measurements.json.sig").write_text(signature.sign_blob(key, policy.read_bytes()) + "\n")
    return key, policy, pub


def test_signed_policy_loads_and_openssl_agrees_with_the_signature(signed, tmp_path):
    _key, policy, pub = signed
    assert read_policy_document(str(policy), public_key_path=str(pub))["4"]["expected"] == "ab" * 32
    raw = tmp_path / "sig.der"
    raw.write_bytes(base64.b64decode((tmp_path / "measurements.json.sig").read_text()))
    proc = subprocess.run(["openssl", "dgst", "-sha256", "-verify", str(pub), "-signature", str(raw), str(policy)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and "Verified OK" in proc.stdout, proc.stderr


def test_openssl_signature_in_cosign_form_is_accepted(signed, tmp_path):
    key, policy, pub = signed
    pem = tmp_path / "key.pem"
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    der = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(pem), str(policy)], capture_output=True,
                         check=True).stdout
    (tmp_path / "measurements.json.sig").write_text(base64.b64encode(der).decode())
    assert load_policy(measurements_file=str(policy), public_key_path=str(pub)).pcrs


def test_altered_unsigned_or_other_key_policies_are_refused_naming_the_file(signed, tmp_path):
    _key, policy, pub = signed
    policy.write_text(policy.read_text().replace("ab", "cd", 1))
    with pytest.raises(InputError) as err:
        read_policy_document(str(policy), public_key_path=str(pub))
    assert str(policy) in str(err.value) and "does not verify" in str(err.value)
    other = tmp_path / "other.pub"
    measurements_key(other)  # another key's
    with pytest.raises(InputError, match="does not verify"):
        read_policy_document(str(policy), public_key_path=str(other))
    os.unlink(str(policy) + ".sig")
    with pytest.raises(InputError, match="no signature file %s.sig" % policy):
        read_policy_document(str(policy), public_key_path=str(pub))
    with pytest.raises(InputError, match="inline measurements carry no signature"):
        load_policy(measurements={"4": "ab" * 32}, public_key_path=str(pub))
    assert read_policy_document(str(policy))["4"]  # no pinned key: unsigned files as before
