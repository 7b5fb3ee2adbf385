# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Secure defaults against the real Core, validators and pubapi server: with the
defaults (no variant named anywhere), a software key that declares itself a TPM key gets nothing;
qemu-vtpm needs the explicit acknowledgement and dummy the test suite; a policy that enforces no PCR
is refused naming its file."""

from __future__ import annotations

import json
import os

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from ansible_collections.constellation.cluster.plugins.module_utils import core, kms
from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import AgentConfig
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.ek import EnrollmentValidator
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    Measurement,
    Measurements,
)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import load_policy_file
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import VTPMIssuer, VTPMValidator
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    AttestationError,
    ConstellationError,
    InputError,
)
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import schema
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient
from ansible_collections.constellation.cluster.plugins.module_utils.agent.pubapi import fresh_node_policy
from ansible_collections.constellation.cluster.plugins.module_utils.agent.wiring import pubapi_handlers
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import AgentServerContext, FrameServer
from ansible_collections.constellation.cluster.plugins.module_utils.store import MemoryStore
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import generate_priv_key, pub_key_from_priv_key

from ansible_collections.constellation.cluster.tests.support.core_fakes import MemoryTPM, RecordingVPN
from ansible_collections.constellation.cluster.tests.unit.attestation.forged_ak import SoftwareAKIssuer
from ansible_collections.constellation.cluster.plugins.module_utils.agent.peer_view import CorePeerView
from ansible_collections.constellation.cluster.tests.support.keys import sign_policy

NONCE = bytes(range(32))
# The image's policy: what the forger claims (it knows the published measurements).
IMAGE_PCRS = {4: b"\x04" * 32, 8: b"\x08" * 32, 9: b"\x09" * 32}
POLICY = Measurements({i: Measurement(v) for i, v in IMAGE_PCRS.items()})


@pytest.fixture
def genuine_ek_cert(swtpm_ek):
    """A genuine EK certificate of the fleet (EK certificates are public: the attacker has one)."""
    with choose.issuer(choose.QEMU_VTPM_EK_NAME, swtpm_ek.tcti, event_log_path=None) as issuer:
        return issuer.ek_cert()


def default_agent_config(tmp_path, ek_ca_path, **extra) -> AgentConfig:
    """An agent configuration that names no variant: the defaults decide."""
    policy = tmp_path / "image-measurements.json"
    policy.write_text(json.dumps(POLICY.to_dict()))
    data = {"state_dir": str(tmp_path / "state"), "public_endpoint": "127.0.0.1:9000", "measurements": str(policy),
            "ek_ca": ek_ca_path, "init_secret_hash": "ab" * 32}
    data.update(extra)
    data.setdefault("measurements_pub_key", sign_policy(tmp_path, data["measurements"]))
    return AgentConfig.from_mapping(data)


def agent_node_validator(config: AgentConfig):
    """The validator the agent checks joining nodes with (Agent._attestation, fresh_node_policy)."""
    trust = choose.load_trust(config.variant, config.ek_ca, field="ek_ca")
    return choose.validator(config.variant, fresh_node_policy(load_policy_file(config.measurements)), trust)


# ------------------------------------------------------------------ the forged software AK


def test_the_forgery_is_sound_and_trusting_any_ak_accepts_it(genuine_ek_cert):
    """The attack works against a validator that trusts any AK (qemu-vtpm, Constellation's): the
    signature, the nonce binding and every PCR check out. No TPM was involved."""
    forger = SoftwareAKIssuer(IMAGE_PCRS, choose.spec("qemu-vtpm").oid, genuine_ek_cert)
    validation = VTPMValidator(POLICY).validate(forger.issue(b"user data", NONCE), NONCE)
    assert validation.user_data == b"user data" and all(check.ok for check in validation.checks)


def test_the_default_validator_refuses_a_software_ak_that_declares_itself_a_tpm_key(ek_ca_path, genuine_ek_cert):
    """The forged AK at the chooser: the default variant's validator (the trust the defaults load) does
    not accept the forged document."""
    trust = choose.load_trust(choose.DEFAULT_VARIANT, ek_ca_path)
    validator = choose.validator(choose.DEFAULT_VARIANT, POLICY, trust)
    forger = SoftwareAKIssuer(IMAGE_PCRS, validator.oid, genuine_ek_cert)
    with pytest.raises(AttestationError, match="AK is not certified"):
        validator.validate(forger.issue(b"user data", NONCE), NONCE)


def test_the_default_agent_config_refuses_a_software_ak(tmp_path, ek_ca_path, genuine_ek_cert):
    config = default_agent_config(tmp_path, ek_ca_path)
    validator = agent_node_validator(config)
    forger = SoftwareAKIssuer({**IMAGE_PCRS, 15: bytes(32)}, validator.oid, genuine_ek_cert)
    with pytest.raises(AttestationError):
        validator.validate(forger.issue(b"user data", NONCE), NONCE)
    assert config.variant == choose.DEFAULT_VARIANT == "qemu-vtpm-ek"


def _admin_pem() -> str:
    return ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


class _PermissiveServerCheck:
    """The forger's check of the Coordinator's document: whatever variant it is, anything goes."""

    def __init__(self, oid):
        self.inner = (EnrollmentValidator if oid == choose.QEMU_VTPM_EK_OID else VTPMValidator)(Measurements())
        self.oid = oid

    def validate(self, document, nonce):
        return self.inner.validate(document, nonce)


def test_a_coordinator_with_the_defaults_gives_a_forged_software_ak_no_join_ticket(
        tmp_path, swtpm_ek, ek_ca_path, genuine_ek_cert):
    """The forged AK end to end: a Coordinator wired as the agent wires it, from a configuration that names
    no variant, serves IssueJoinTicket over its real aTLS pubapi. The forger attests with its software
    AK (claiming the image's PCRs and a fresh PCR 15) and, asked to enroll, offers a genuine EK
    certificate of the fleet. It gets no ticket (no measurement secret, disk key, VPN IP) and is
    recorded nowhere."""
    config = default_agent_config(tmp_path, ek_ca_path)
    node_validator = agent_node_validator(config)
    coordinator = core.Core(MemoryStore(), MemoryTPM(), RecordingVPN(), str(tmp_path / "coordinator"),
                            "127.0.0.1", core.new_disk_uuid())
    os.makedirs(str(tmp_path / "coordinator"), exist_ok=True)
    coordinator.recovery.load()
    coordinator.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), _admin_pem())
    peers_before = coordinator.get_state().get("peers")
    issuer = choose.issuer(config.variant, swtpm_ek.tcti, event_log_path=None)
    tls = AgentServerContext(issuer)
    pubapi = pubapi_handlers(coordinator, node_validator, issuer=issuer)
    server = FrameServer("pubapi", ("127.0.0.1", 0), pubapi.handlers(), tls=tls, apis=(schema.PUBAPI,),
                         peer_view=CorePeerView(coordinator)).start()
    received = []
    forger = SoftwareAKIssuer({**IMAGE_PCRS, 15: bytes(32)}, node_validator.oid, genuine_ek_cert)
    try:
        endpoint = "127.0.0.1:%d" % server.address[1]
        with AgentClient.connect(endpoint, [_PermissiveServerCheck(issuer.oid)]) as client:
            with pytest.raises(ConstellationError):
                client.issue_join_ticket(core.new_disk_uuid(), pub_key_from_priv_key_bytes(), forger, received.append)
    finally:
        server.stop()
        tls.close()
        issuer.close()
    assert received == []  # no ticket: nothing secret reached the forger
    assert coordinator.get_state().get("peers") == peers_before
    assert forger.enrollment_answers <= 1  # it was challenged at most once, and could not answer


def pub_key_from_priv_key_bytes() -> bytes:
    import base64

    return base64.b64decode(pub_key_from_priv_key(generate_priv_key()))


# ------------------------------------------------------------------ qemu-vtpm only acknowledged, dummy only in tests


def test_qemu_vtpm_needs_the_acknowledgement_everywhere(tmp_path, ek_ca_path, swtpm):
    with pytest.raises(InputError) as refused:
        choose.validator("qemu-vtpm", POLICY)
    assert refused.value.field == "insecure_trust_any_ak" and "trusts ANY attestation key" in str(refused.value)
    with pytest.raises(InputError, match="^insecure_trust_any_ak: expected true"):
        choose.load_trust("qemu-vtpm", None)
    with pytest.raises(InputError, match="^insecure_trust_any_ak: expected true"):
        default_agent_config(tmp_path, ek_ca_path, variant="qemu-vtpm")
    with pytest.raises(InputError, match="^insecure_trust_any_ak: expected true or false"):
        default_agent_config(tmp_path, ek_ca_path, variant="qemu-vtpm", insecure_trust_any_ak="yes")
    # Acknowledged: accepted, and the warning every run/start gives.
    assert choose.validator("qemu-vtpm", POLICY, insecure_trust_any_ak=True).oid == choose.spec("qemu-vtpm").oid
    config = default_agent_config(tmp_path, ek_ca_path, variant="qemu-vtpm", insecure_trust_any_ak=True)
    assert config.insecure_trust_any_ak is True
    assert "trusts ANY attestation key" in choose.insecure_warning("qemu-vtpm")
    assert choose.insecure_warning(choose.DEFAULT_VARIANT) is None
    with VTPMIssuer(swtpm.tcti, event_log_path=None):  # an issuer needs no acknowledgement (it trusts nothing)
        assert choose.issuer("qemu-vtpm", swtpm.tcti, event_log_path=None).oid == choose.spec("qemu-vtpm").oid


def test_dummy_is_refused_outside_the_test_suite(tmp_path, ek_ca_path, monkeypatch):
    """Dummy proves nothing; outside the test suite no adapter accepts it."""
    assert choose.validator("dummy").oid  # the suite (CONSTELLATION_TEST_SUITE=1, tests/conftest.py)
    monkeypatch.delenv(choose.TEST_SUITE_ENV)
    for attempt in (lambda: choose.validator("dummy"), lambda: choose.issuer("dummy"),
                    lambda: choose.load_trust("dummy", None),
                    lambda: default_agent_config(tmp_path, ek_ca_path, variant="dummy")):
        with pytest.raises(InputError, match="^variant: expected a variant with security .*CONSTELLATION_TEST_SUITE=1"):
            attempt()
    monkeypatch.setenv(choose.TEST_SUITE_ENV, "yes")  # only exactly 1
    with pytest.raises(InputError):
        choose.validator("dummy")


# ------------------------------------------------------------------ a policy that enforces nothing


@pytest.mark.parametrize("policy", [
    {},
    {"4": {"expected": "aa" * 32, "warnOnly": True}, "9": {"expected": "bb" * 32, "warnOnly": True}},
    {"15": {"expected": "00" * 32, "warnOnly": False}},
    {"15": {"expected": "00" * 32, "warnOnly": False}, "4": {"expected": "aa" * 32, "warnOnly": True}},
])
def test_a_policy_that_enforces_no_pcr_is_refused_naming_the_file(tmp_path, ek_ca_path, policy):
    """With such a policy every TPM that booted anything would pass (PCR 15 is the cluster
    ID, set by the agent itself, not a measurement of what booted). The agent refuses to start with it
    and every controller loader refuses it, naming the file."""
    from ansible_collections.constellation.cluster.plugins.module_utils.agent.wiring import build_agent
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import settings_from_args

    path = tmp_path / "measurements.json"
    path.write_text(json.dumps(policy))
    with pytest.raises(InputError) as refused:
        load_policy_file(str(path))
    assert str(path) in str(refused.value) and "enforces at least one PCR other than 15" in str(refused.value)
    config = default_agent_config(tmp_path, ek_ca_path, measurements=str(path), tcti="swtpm:host=127.0.0.1,port=1")
    with pytest.raises(InputError, match="enforces at least one PCR.*%s" % path):
        build_agent(config)
    with pytest.raises(InputError, match="enforces at least one PCR.*%s" % path):
        settings_from_args({"measurements_file": str(path), "ek_ca_path": ek_ca_path, "timeout": 1.0,
                            "attestation_timeout": 1.0})
    if policy:
        with pytest.raises(InputError, match="^measurements: .*enforces at least one PCR.*inline measurements"):
            settings_from_args({"measurements": policy, "ek_ca_path": ek_ca_path, "timeout": 1.0,
                                "attestation_timeout": 1.0})


def test_a_policy_with_one_enforced_boot_pcr_is_accepted(tmp_path):
    path = tmp_path / "measurements.json"
    path.write_text(json.dumps({"4": {"expected": "aa" * 32, "warnOnly": False},
                                "9": {"expected": "bb" * 32, "warnOnly": True}}))
    assert sorted(load_policy_file(str(path)).pcrs) == [4, 9]
