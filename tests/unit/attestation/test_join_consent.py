# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The admin's consent to a join (docs/security.md, "Consent to a join"), by attack against the real Core, the
real pubapi FrameServer on loopback and real swtpms manufactured with EK certificates of the fleet's CA (the
default variant qemu-vtpm-ek): a genuine TPM the admin did not admit gets nothing; another TPM cannot use an
admission; qemu-vtpm (no EK) joins only with the explicit insecure option, which the agent warns about on every
start; and a join ticket never carries an init proof, so joining from a fresh node's address hands nobody that
node's activation."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from ansible_collections.constellation.cluster.plugins.module_utils import core, kms
from ansible_collections.constellation.cluster.plugins.module_utils.kms import init_secret
from ansible_collections.constellation.cluster.plugins.module_utils.agent.wiring import build_agent
from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import AgentConfig
from ansible_collections.constellation.cluster.plugins.module_utils.agent.json_log import JSONLog
from ansible_collections.constellation.cluster.plugins.module_utils.agent.peer_view import CorePeerView
from ansible_collections.constellation.cluster.plugins.module_utils.agent.pubapi import fresh_node_policy
from ansible_collections.constellation.cluster.plugins.module_utils.agent.wiring import pubapi_handlers
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import DummyIssuer, DummyValidator
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.ek import VTPMEKIssuer
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    Measurement,
    Measurements,
)
from ansible_collections.constellation.cluster.plugins.module_utils.core.records import node_records
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AccessDenied, ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import schema
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import AgentServerContext, FrameServer
from ansible_collections.constellation.cluster.plugins.module_utils.store import MemoryStore
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import generate_priv_key, pub_key_from_priv_key

from ansible_collections.constellation.cluster.tests.support.core_fakes import MemoryTPM, RecordingVPN
from lab.swtpm import SwTPM, free_port

# A fresh swtpm's PCRs (nothing measured): the image the test's nodes run.
POLICY = Measurements({i: Measurement(bytes(32)) for i in (4, 8, 9)})
INIT_SECRET = os.urandom(32)
FIRST_NODE_IP = "10.118.0.11"


def _admin_pem() -> str:
    return ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def ek_pub_sha256(ek_cert: bytes) -> str:
    """How the admin names a TPM: SHA-256 of its EK certificate's SubjectPublicKeyInfo (DER), hex."""
    return hashlib.sha256(x509.load_der_x509_certificate(ek_cert).public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)).hexdigest()


def _wg_pub_key() -> bytes:
    return base64.b64decode(pub_key_from_priv_key(generate_priv_key()))


@pytest.fixture
def fleet_tpm(tmp_path, ca_dir):
    """fleet_tpm() -> a fresh swtpm manufactured with an EK certificate of the fleet's CA (a genuine TPM)."""
    started = []

    def make():
        tpm = SwTPM(str(tmp_path / ("tpm%d" % len(started))), free_port(), ek_cert=True, ca_dir=ca_dir).start()
        started.append(tpm)
        return tpm

    yield make
    for tpm in started:
        tpm.stop()


class Coordinator:
    """An activated Coordinator's Core behind its real pubapi FrameServer on loopback, checking joining nodes
    with ``variant``'s validator as the agent builds it (fresh_node_policy, the EK CA bundle)."""

    def __init__(self, tmp_path, ek_ca_path, variant=choose.DEFAULT_VARIANT):
        self.log = []
        self.core = core.Core(MemoryStore(), MemoryTPM(), RecordingVPN(), str(tmp_path / "coordinator"), "127.0.0.1",
                              core.new_disk_uuid(), log=lambda event, **fields: self.log.append(dict(fields, event=event)))
        os.makedirs(str(tmp_path / "coordinator"), exist_ok=True)
        self.core.recovery.load()
        self.core.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), _admin_pem(),
                                                      init_secret=INIT_SECRET)
        insecure = variant == "qemu-vtpm"
        trust = choose.load_trust(variant, ek_ca_path if not insecure else None, insecure_trust_any_ak=insecure)
        validator = choose.validator(variant, fresh_node_policy(POLICY), trust, insecure_trust_any_ak=insecure)
        self.tls = AgentServerContext(DummyIssuer())
        self.server = FrameServer("pubapi", ("127.0.0.1", 0), pubapi_handlers(self.core, validator).handlers(),
                                  tls=self.tls, apis=(schema.PUBAPI,), peer_view=CorePeerView(self.core)).start()
        self.endpoint = "127.0.0.1:%d" % self.server.address[1]

    def close(self):
        self.server.stop()
        self.tls.close()

    def join(self, issuer, node_vpn_pub_key=None, disk_uuid=None):
        """A join as the node's agent makes it; (the answer, the tickets received). Raises what the node gets."""
        received = []
        with AgentClient.connect(self.endpoint, [DummyValidator()]) as client:
            answer = client.issue_join_ticket(disk_uuid or core.new_disk_uuid(), node_vpn_pub_key or _wg_pub_key(),
                                              issuer, lambda ticket, _binding: received.append(ticket))
        return answer, received

    def admit(self, tpm, name):
        with VTPMEKIssuer(tpm.tcti, event_log_path=None) as issuer:
            ek = ek_pub_sha256(issuer.ek_cert())
        if hasattr(self.core, "admissions"):  # (a Core without admissions lets everyone join: the attacks show it)
            self.core.admissions.admit_nodes([{"ek_pub_sha256": ek, "name": name}])
        return ek

    def refused(self, attempt):
        """``attempt()`` is refused; the Coordinator reserved no IP, recorded no peer and no disk."""
        peers = self.core.get_state().get("peers")
        received = []
        with pytest.raises(ConstellationError) as err:
            attempt(received)
        assert received == []  # no ticket: no measurement secret, disk key, VPN IP or peers left
        assert self.core.get_state().get("peers") == peers
        assert self.core.coordinator.reserve_node_ip() == FIRST_NODE_IP  # nothing reserved (the first IP is free)
        self.core.coordinator.release_node_ip(FIRST_NODE_IP)
        return err.value


@pytest.fixture
def coordinator(tmp_path, ek_ca_path):
    made = []

    def make(variant=choose.DEFAULT_VARIANT):
        made.append(Coordinator(tmp_path, ek_ca_path, variant))
        return made[-1]

    yield make
    for item in made:
        item.close()


def _join(coord, issuer, disk_uuid=None, node_vpn_pub_key=None):
    def attempt(received):
        with AgentClient.connect(coord.endpoint, [DummyValidator()]) as client:
            client.issue_join_ticket(disk_uuid or core.new_disk_uuid(), node_vpn_pub_key or _wg_pub_key(), issuer,
                                     lambda ticket, _binding: received.append(ticket))
    return attempt


def test_a_genuine_tpm_the_admin_did_not_admit_gets_no_ticket(coordinator, fleet_tpm):
    """A host with a genuine, vendor-certified TPM that runs the image (its root can replay PCR 13)
    asks for a join ticket. Its attestation is sound and its AK is enrolled through its EK, but the admin never
    admitted that EK: no ticket, no secret, no VPN IP, no disk UUID recorded; the refusal names the EK and the
    way to admit it. Once the admin admits it, the same TPM joins."""
    coord = coordinator()
    tpm = fleet_tpm()
    disk_uuid = core.new_disk_uuid()
    with VTPMEKIssuer(tpm.tcti, event_log_path=None) as issuer:
        ek = ek_pub_sha256(issuer.ek_cert())
        err = coord.refused(_join(coord, issuer, disk_uuid))
        assert "this node's EK (sha256 %s) was not admitted by the admin" % ek in str(err)
        assert "add_nodes.yml / AdmitNodes" in str(err)
        assert node_records.disk_uuid_owner(coord.core.context.store, disk_uuid) is None
        assert [e for e in coord.log if e["event"] == "join_refused" and e.get("ek_pub_sha256") == ek]
        # The admin admits it: the same TPM joins, under the admin's name.
        coord.admit(tpm, "worker-1")
        answer, received = coord.join(issuer, disk_uuid=disk_uuid)
    assert answer["node_vpn_ip"] == FIRST_NODE_IP and len(received) == 1
    assert coord.core.admissions.listed() == [{"ek_pub_sha256": ek, "name": "worker-1", "joined": True}]
    assert coord.core.kubernetes.kubernetes_node_names(FIRST_NODE_IP) == ["worker-1"]


class _BorrowedEKIssuer(VTPMEKIssuer):
    """A genuine TPM of the fleet that presents another TPM's EK certificate (EK certificates are public)."""

    def __init__(self, tcti, borrowed_ek_cert):
        super().__init__(tcti, event_log_path=None)
        self.borrowed_ek_cert = borrowed_ek_cert

    def ek_cert(self):
        return self.borrowed_ek_cert


def test_another_tpm_cannot_use_an_admission(coordinator, fleet_tpm):
    """The admin admitted TPM A. TPM B (genuine, same fleet) presents A's EK certificate for its AK's
    enrollment: its TPM cannot activate the credential, refused. B joins as itself: refused. A joins with one
    WireGuard key; a second join with A's EK and another key (host root on A reinstalling the agent, or a copy
    of its disk elsewhere) is refused too: the admission is bound on first use."""
    coord = coordinator()
    tpm_a, tpm_b, tpm_c = fleet_tpm(), fleet_tpm(), fleet_tpm()
    with VTPMEKIssuer(tpm_a.tcti, event_log_path=None) as issuer_a:
        a_cert = issuer_a.ek_cert()
        with VTPMEKIssuer(tpm_b.tcti, event_log_path=None) as issuer_b:
            assert "was not admitted by the admin" in str(coord.refused(_join(coord, issuer_b)))
        coord.admit(tpm_a, "worker-a")
        with VTPMEKIssuer(tpm_b.tcti, event_log_path=None) as issuer_b:
            assert "was not admitted by the admin" in str(coord.refused(_join(coord, issuer_b)))
        with _BorrowedEKIssuer(tpm_c.tcti, a_cert) as borrowed:  # C's AK, to be enrolled through A's EK certificate
            assert "ActivateCredential refused" in str(coord.refused(_join(coord, borrowed)))
        answer, received = coord.join(issuer_a)
        assert answer["node_vpn_ip"] == FIRST_NODE_IP and len(received) == 1
        peers = coord.core.get_state().get("peers")
        received = []
        with pytest.raises(ConstellationError, match="is used by another node already"):
            _join(coord, issuer_a)(received)
    assert received == [] and coord.core.get_state().get("peers") == peers
    assert coord.core.coordinator.reserve_node_ip() == "10.118.0.12"  # only A's IP is taken


def test_without_an_ek_a_join_needs_the_insecure_option_which_is_warned_about(coordinator, swtpm, tmp_path):
    """qemu-vtpm proves no TPM identity (it trusts any AK): no admission can name such a node, so its join is
    refused unless the Coordinator's agent sets insecure_join_without_admission (any attested node joins), which
    GetState reports and the agent warns about on every start."""
    coord = coordinator("qemu-vtpm")
    issuer = choose.issuer("qemu-vtpm", swtpm.tcti, event_log_path=None)
    try:
        err = coord.refused(_join(coord, issuer))
        assert "names no EK" in str(err) and "insecure_join_without_admission" in str(err)
        coord.core.admissions.insecure_join_without_admission = True
        answer, received = coord.join(issuer)
    finally:
        issuer.close()
    assert answer["node_vpn_ip"] == FIRST_NODE_IP and len(received) == 1
    assert coord.core.get_state()["join_admission"].startswith("insecure")
    # The agent: the option from its config, a warning on every start.
    data = {"state_dir": str(tmp_path / "state"), "public_endpoint": "127.0.0.1:%d" % free_port(), "tcti": swtpm.tcti,
            "variant": "dummy", "verify_grpc_endpoint": "", "verify_http_endpoint": "", "reattest_interval": 0,
            "insecure_unauthenticated_activation": True}
    assert AgentConfig.from_mapping(data).insecure_join_without_admission is False
    config = AgentConfig.from_mapping(dict(data, insecure_join_without_admission=True))
    for _start_again in range(2):
        log = io.StringIO()
        agent = build_agent(config, JSONLog(stream=log)).start()
        try:
            assert agent.core.admissions.insecure_join_without_admission is True
        finally:
            agent.stop()
        warnings = [json.loads(line) for line in log.getvalue().splitlines()
                    if '"insecure_join_without_admission"' in line]
        assert len(warnings) == 1 and warnings[0]["level"] == "warning"


def test_a_join_from_a_fresh_nodes_address_gets_no_proof_of_its_init_secret(coordinator, fleet_tpm, make_node):
    """The attacker joins (with an admitted TPM of his own) from the address of a fresh node, the
    victim, provisioned with the init secret hash for that address. The ticket carries no init proof at all, so
    the attacker cannot activate the victim under his own admin key: the victim refuses, stays fresh."""
    coord = coordinator()
    tpm = fleet_tpm()
    coord.admit(tpm, "attacker")
    victim = make_node("127.0.0.1")  # the address the Coordinator sees the join come from
    with VTPMEKIssuer(tpm.tcti, event_log_path=None) as issuer:
        _answer, received = coord.join(issuer)
    (ticket,) = received
    request = {"node_vpn_ip": "10.118.0.99", "peers": ticket["peers"], "cluster_id": ticket["cluster_id"],
               "measurement_salt": ticket["measurement_salt"], "admin_pub_key": _admin_pem(),
               "coordinator_vpn_ip": ticket["coordinator_vpn_ip"], "coordinator_pub_key": ticket["coordinator_pub_key"]}
    if ticket.get("init_proof") is not None:  # what the ticket would hand over
        request["init_proof"] = ticket["init_proof"]
    with pytest.raises(AccessDenied) as err:
        victim.node.activate_as_node_begin(request)
    assert err.value.reason == "init_proof"
    assert victim.state == core.State.ACCEPTING_INIT and victim.context.tpm.pcr15() == bytes(32)
    assert "init_proof" not in ticket


@pytest.fixture
def make_node(tmp_path):
    def make(public_ip):
        node = core.Core(MemoryStore(), MemoryTPM(), RecordingVPN(), str(tmp_path / "node"), public_ip,
                         core.new_disk_uuid(), init_secret_hash=init_secret.init_secret_hash(INIT_SECRET, public_ip))
        os.makedirs(str(tmp_path / "node"), exist_ok=True)
        node.recovery.load()
        return node
    return make
