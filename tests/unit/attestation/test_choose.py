# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one attestation chooser: every place offers the same variants, a toy variant registered
through the chooser alone works over aTLS, and qemu-vtpm-ek enrolls over the real RPC (EnrollAK)
and refuses a TPM whose EK certificate does not chain to the configured CA."""

from __future__ import annotations

import ast
import hashlib
import hmac
import json
from pathlib import Path

import pytest
import yaml

from ansible_collections.constellation.cluster.plugins.module_utils import atls
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose, variant
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    Measurement,
    Measurements,
)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import (
    ATTESTATION_ARGUMENT_SPEC,
    settings_from_args,
)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.tpm import read_pcrs
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.variant import Validation
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError, InputError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient, connect_enrolling
from ansible_collections.constellation.cluster.plugins.module_utils.agent.pubapi import PubAPI
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import AgentServerContext, FrameServer

ROOT = Path(__file__).resolve().parents[3]


# ------------------------------------------------------------------ one list, everywhere


def _doc_choices(path: Path, option: str):
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "DOCUMENTATION":
            return yaml.safe_load(node.value.value)["options"][option]["choices"]
    raise AssertionError("no DOCUMENTATION in %s" % path)


def test_every_place_offers_the_chooser_list():
    assert choose.VARIANT_NAMES == ("qemu-vtpm", "qemu-vtpm-ek", "dummy")
    assert ATTESTATION_ARGUMENT_SPEC["variant"]["choices"] == list(choose.VARIANT_NAMES)
    from ansible_collections.constellation.cluster.plugins.doc_fragments.attestation import ModuleDocFragment

    fragment = yaml.safe_load(ModuleDocFragment.DOCUMENTATION)["options"]
    assert fragment["variant"]["choices"] == list(choose.VARIANT_NAMES)
    assert fragment["variant"]["default"] == choose.DEFAULT_VARIANT
    # Module documentation is read without importing the module, so it is a literal: it must match.
    assert _doc_choices(ROOT / "plugins/modules/attestation_info.py", "variant") == list(choose.VARIANT_NAMES)
    role = yaml.safe_load((ROOT / "roles/node_agent/meta/argument_specs.yml").read_text())
    assert role["argument_specs"]["main"]["options"]["node_agent_variant"]["choices"] == list(choose.VARIANT_NAMES)


def test_unknown_variant_names_the_field_and_the_choices():
    with pytest.raises(InputError) as err:
        choose.spec("sev-snp", "attestation_variant")
    assert str(err.value).startswith("attestation_variant: expected one of qemu-vtpm, qemu-vtpm-ek, dummy")


def test_ek_variant_needs_its_ca(tmp_path):
    with pytest.raises(InputError) as err:
        settings_from_args({"variant": "qemu-vtpm-ek", "measurements": {"4": "00" * 32}, "timeout": 1.0,
                            "attestation_timeout": 1.0})
    assert "ek_ca_path" in str(err.value)
    with pytest.raises(InputError) as err:
        settings_from_args({"variant": "qemu-vtpm-ek", "measurements": {"4": "00" * 32}, "timeout": 1.0,
                            "attestation_timeout": 1.0, "ek_ca_path": str(tmp_path / "missing.pem")})
    assert "ek_ca_path: expected a readable PEM file" in str(err.value)


def test_variant_oid_is_known_without_importing_tpm_code():
    assert choose.spec("qemu-vtpm-ek").oid == variant.from_string("qemu-vtpm-ek").oid


# ------------------------------------------------------------------ a toy variant, through the chooser only


class _ToyIssuer:
    oid = "1.3.9900.77.1"

    def issue(self, user_data: bytes, nonce: bytes) -> bytes:
        return json.dumps({"u": user_data.hex(), "n": nonce.hex(),
                           "mac": hmac.new(b"toy", user_data + nonce, hashlib.sha256).hexdigest()}).encode()


class _ToyValidator:
    oid = "1.3.9900.77.1"

    def validate(self, document: bytes, nonce: bytes) -> Validation:
        doc = json.loads(document)
        user_data, doc_nonce = bytes.fromhex(doc["u"]), bytes.fromhex(doc["n"])
        if doc_nonce != nonce or not hmac.compare_digest(
                doc["mac"], hmac.new(b"toy", user_data + nonce, hashlib.sha256).hexdigest()):
            raise AttestationError("toy document refused")
        return Validation(user_data=user_data)


@pytest.fixture
def toy_variant():
    spec = choose.register(choose.VariantSpec(variant.Variant("toy", "1.3.9900.77.1"), "a test variant",
                                              lambda tcti=None, **kw: _ToyIssuer(),
                                              lambda policy, trust: _ToyValidator(), needs_policy=False))
    yield spec
    choose._SPECS.pop("toy")  # pylint: disable=protected-access
    variant.VARIANTS.pop("toy")


def test_toy_variant_registered_in_the_chooser_attests_over_atls(toy_variant):
    assert "toy" in choose.names()
    settings = settings_from_args({"variant": "toy", "timeout": 5.0, "attestation_timeout": 5.0})
    tls = AgentServerContext(choose.issuer("toy"))
    state = {"state": "AcceptingInit", "state_code": 1, "role": "unknown"}
    server = FrameServer("pubapi", ("127.0.0.1", 0), {"GetState": lambda c, p: c.stream.send_result(state)},
                         tls=tls).start()
    try:
        endpoint = "127.0.0.1:%d" % server.address[1]
        with AgentClient.connect(endpoint, settings.validators()) as client:
            assert client.attested.variant_oid == "1.3.9900.77.1"
            assert client.get_state() == state
        # A peer of another variant is refused before anything is sent.
        with pytest.raises(AttestationError, match="no attestation of an accepted variant"):
            AgentClient.connect(endpoint, [choose.validator("dummy")])
    finally:
        server.stop()
        tls.close()


# ------------------------------------------------------------------ qemu-vtpm-ek end to end over the RPC


def _policy(tpm):
    pcrs = read_pcrs(tpm.tcti)
    return Measurements({i: Measurement(pcrs[i]) for i in (0, 4, 15)})


class _EKServer:
    """The agent's pubapi listener as the agent wires it (AgentServerContext + PubAPI's EnrollAK)."""

    def __init__(self, tpm):
        self.issuer = choose.issuer("qemu-vtpm-ek", tpm.tcti, event_log_path=None)
        self.tls = AgentServerContext(self.issuer)
        self.enrollments = 0
        pubapi = PubAPI.for_core(None, issuer=self.issuer)

        def enroll(conn, params):
            self.enrollments += 1
            pubapi.enroll_ak(conn, params)

        self.server = FrameServer("pubapi", ("127.0.0.1", 0), {
            "EnrollAK": enroll, "GetState": lambda c, p: c.stream.send_result(
                {"state": "AcceptingInit", "state_code": 1, "role": "unknown"})},
            tls=self.tls).start()
        self.endpoint = "127.0.0.1:%d" % self.server.address[1]

    def close(self):
        self.server.stop()
        self.tls.close()
        self.issuer.close()


@pytest.fixture
def ek_server(swtpm_ek):
    server = _EKServer(swtpm_ek)
    yield server
    server.close()


@pytest.fixture
def foreign_server(swtpm_other_ca):
    server = _EKServer(swtpm_other_ca)
    yield server
    server.close()


def _connect(endpoint):
    return lambda validators: AgentClient.connect(endpoint, validators, timeout=10)


def test_ek_variant_enrolls_once_then_attests(ek_server, swtpm_ek, tmp_path):
    (tmp_path / "ca.pem").write_bytes(b"".join(Path(p).read_bytes() for p in swtpm_ek.ca_cert_paths()))
    trust = choose.load_trust("qemu-vtpm-ek", str(tmp_path / "ca.pem"))
    validators = [choose.validator("qemu-vtpm-ek", _policy(swtpm_ek), trust)]
    with connect_enrolling(_connect(ek_server.endpoint), validators) as client:
        assert client.attested.variant_oid == choose.QEMU_VTPM_EK_OID
        assert client.get_state()["state"] == "AcceptingInit"
    assert ek_server.enrollments == 1 and len(trust.certified_aks) == 1
    # The AK is certified now: the next connection attests directly, without enrolling again.
    with connect_enrolling(_connect(ek_server.endpoint), validators) as client:
        assert client.get_state()["state"] == "AcceptingInit"
    assert ek_server.enrollments == 1
    # Without enrollment the same document is refused: the AK alone is not trusted.
    with pytest.raises(AttestationError, match="AK is not certified"):
        AgentClient.connect(ek_server.endpoint, [choose.validator(
            "qemu-vtpm-ek", _policy(swtpm_ek), choose.load_trust("qemu-vtpm-ek", str(tmp_path / "ca.pem")))])


def test_ek_variant_refuses_a_tpm_of_another_ca(foreign_server, swtpm_ek, swtpm_other_ca, tmp_path):
    (tmp_path / "ca.pem").write_bytes(b"".join(Path(p).read_bytes() for p in swtpm_ek.ca_cert_paths()))
    trust = choose.load_trust("qemu-vtpm-ek", str(tmp_path / "ca.pem"))
    validators = [choose.validator("qemu-vtpm-ek", _policy(swtpm_other_ca), trust)]
    with pytest.raises(AttestationError, match="EK certificate does not chain to the trusted CAs"):
        connect_enrolling(_connect(foreign_server.endpoint), validators)
    assert len(trust.certified_aks) == 0


def test_ek_variant_refuses_a_wrong_pcr_before_enrolling(ek_server, swtpm_ek, tmp_path):
    (tmp_path / "ca.pem").write_bytes(b"".join(Path(p).read_bytes() for p in swtpm_ek.ca_cert_paths()))
    trust = choose.load_trust("qemu-vtpm-ek", str(tmp_path / "ca.pem"))
    wrong = Measurements({4: Measurement(b"\x01" * 32)})
    with pytest.raises(AttestationError, match="PCR 4"):
        connect_enrolling(_connect(ek_server.endpoint), [choose.validator("qemu-vtpm-ek", wrong, trust)])
    assert ek_server.enrollments == 0  # nothing was sent to a host that fails its measurements


def test_enroll_ak_on_a_variant_without_ek_is_refused(swtpm):
    issuer = choose.issuer("qemu-vtpm", swtpm.tcti, event_log_path=None)
    tls = AgentServerContext(issuer)
    pubapi = PubAPI.for_core(None, issuer=issuer)
    server = FrameServer("pubapi", ("127.0.0.1", 0), {"EnrollAK": pubapi.enroll_ak}, tls=tls).start()
    try:
        with AgentClient.connect("127.0.0.1:%d" % server.address[1],
                                 [choose.validator("qemu-vtpm", Measurements({0: Measurement(
                                     read_pcrs(swtpm.tcti)[0])}), insecure_trust_any_ak=True)]) as client:
            with pytest.raises(Exception, match="qemu-vtpm-ek"):
                client.enroll_ak(lambda request: {})
    finally:
        server.stop()
        tls.close()
        issuer.close()


def test_atls_module_is_unchanged_by_the_chooser():
    # aTLS knows only the Issuer/Validator interface; the chooser is the one place that names variants.
    source = (ROOT / "plugins/module_utils/atls.py").read_text()
    assert "qemu-vtpm" not in source and "choose" not in source
    assert atls.NONCE_SIZE == 32
