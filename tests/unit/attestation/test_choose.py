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
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cryptography import x509

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
from ansible_collections.constellation.cluster.tests.unit.attestation.atls_servers import (
    RecordingServer, TamperingServer, assert_refused_before_any_byte, exchange_ping)

ROOT = Path(__file__).resolve().parents[3]


# ------------------------------------------------------------------ one list, everywhere

# Option names of the variant choice; any option whose choices name a variant is checked too.
_VARIANT_OPTION = re.compile(r"^(.*_)?variant$")


def _options(where, options):
    for name, option in (options or {}).items():
        if isinstance(option, dict):
            yield where, name, option
            yield from _options(where, option.get("suboptions"))


def _documented_options():
    """(file, option name, option) of every option Ansible reads without importing Python: the
    DOCUMENTATION of modules and plugins (and their .yml docs), doc fragments, role argument specs."""
    for path in sorted((ROOT / "plugins").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "DOCUMENTATION" for t in node.targets)
                    and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
                yield from _options(path, (yaml.safe_load(node.value.value) or {}).get("options"))
    for path in sorted((ROOT / "plugins").rglob("*.yml")):
        yield from _options(path, ((yaml.safe_load(path.read_text()) or {}).get("DOCUMENTATION") or {}).get("options"))
    for path in sorted((ROOT / "roles").glob("*/meta/argument_specs.yml")):
        for entry in yaml.safe_load(path.read_text())["argument_specs"].values():
            yield from _options(path, entry.get("options"))


def test_every_literal_variant_choice_list_is_the_chooser_list():
    assert choose.VARIANT_NAMES == ("qemu-vtpm", "qemu-vtpm-ek", "sev-snp", "azure-sev-snp", "aws-sev-snp", "dummy")
    found, wrong = [], []
    for path, name, option in _documented_options():
        choices = option.get("choices")
        if not (_VARIANT_OPTION.match(name) or set(choices or ()) & set(choose.VARIANT_NAMES)):
            continue
        found.append("%s: %s" % (path.relative_to(ROOT), name))
        if choices != list(choose.VARIANT_NAMES):
            wrong.append("%s: %s has choices %r" % (path.relative_to(ROOT), name, choices))
        if "default" in option and "{{" not in str(option["default"]) and option["default"] != choose.DEFAULT_VARIANT:
            wrong.append("%s: %s has default %r" % (path.relative_to(ROOT), name, option["default"]))
    assert not wrong, "literal variant choices must equal choose.VARIANT_NAMES:\n" + "\n".join(wrong)
    # The scan must see the places that exist today (modules, the atls connection, the doc fragment, a role).
    assert len(found) >= 5, found


def test_python_argument_specs_take_their_choices_from_the_chooser():
    assert ATTESTATION_ARGUMENT_SPEC["variant"]["choices"] == list(choose.VARIANT_NAMES)
    offenders = []
    for root in ("plugins", "lab", "bench"):
        for path in sorted((ROOT / root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
                    texts = {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
                    if len(texts & set(choose.VARIANT_NAMES)) > 1:
                        offenders.append("%s:%d" % (path.relative_to(ROOT), node.lineno))
    assert not offenders, "a literal list of variants; use choose.VARIANT_NAMES: %s" % offenders


def test_all_variants_lists_exactly_the_modules_of_the_registrations():
    tree = ast.parse((ROOT / "plugins/module_utils/attestation/all_variants.py").read_text())
    imported = {"%s.%s" % (node.module, alias.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module != "__future__" for alias in node.names}
    assert imported == {choose.spec(name).module for name in choose.VARIANT_NAMES}


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from ("%s.%s" % (node.module, alias.name) for alias in node.names)


def test_modules_that_choose_a_variant_on_a_host_ship_all_variants():
    variant_modules = {choose.spec(name).module for name in choose.VARIANT_NAMES}
    all_variants = choose.PACKAGE + ".all_variants"
    choosing = []
    for path in sorted((ROOT / "plugins/modules").glob("*.py")) + sorted((ROOT / "plugins/action").glob("*.py")):
        names = set(_imports(path))
        assert not names & variant_modules, "%s imports a variant module itself; import all_variants" % path.name
        if path.parent.name == "modules" and re.search(r"choose\.(issuer|validator)\(|settings_from_args\(",
                                                       path.read_text()):
            choosing.append(path.name)
            assert all_variants in names, "%s chooses a variant on the host without importing all_variants" % path.name
    assert choosing  # attestation_info, constellation_verify


def test_unknown_variant_names_the_field_and_the_choices():
    with pytest.raises(InputError) as err:
        choose.spec("qemu-tdx", "attestation_variant")
    assert str(err.value).startswith("attestation_variant: expected one of qemu-vtpm, qemu-vtpm-ek, sev-snp, azure-sev-snp, aws-sev-snp, dummy")


def test_ek_variant_needs_its_ca(tmp_path):
    with pytest.raises(InputError) as err:
        settings_from_args({"variant": "qemu-vtpm-ek", "measurements": {"4": "00" * 32}, "timeout": 1.0,
                            "attestation_timeout": 1.0})
    assert "ek_ca_path" in str(err.value)
    with pytest.raises(InputError) as err:
        settings_from_args({"variant": "qemu-vtpm-ek", "measurements": {"4": "00" * 32}, "timeout": 1.0,
                            "attestation_timeout": 1.0, "ek_ca_path": str(tmp_path / "missing.pem")})
    assert "ek_ca_path: expected a readable PEM file" in str(err.value)


def test_listing_variants_imports_no_variant_module():
    code = ("import sys; from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose; "
            "[(choose.spec(n).oid, choose.spec(n).needs_policy) for n in choose.names()]; "
            "print(sorted(m for m in sys.modules if m.startswith(choose.PACKAGE + '.')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "collections"), str(ROOT)])))
    assert proc.stdout.strip() == repr(sorted([choose.PACKAGE + ".choose", choose.PACKAGE + ".variant"]))


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


# The toy variant's module is this test module: the chooser calls its make_issuer and make_validator.
def make_issuer(tcti=None, **kwargs):
    return _ToyIssuer()


def make_validator(policy, trust):
    return _ToyValidator()


@pytest.fixture
def toy_variant():
    spec = choose.register(choose.VariantSpec(variant.Variant("toy", "1.3.9900.77.1"), "a test variant", __name__,
                                              needs_policy=False))
    yield spec
    choose.unregister("toy")


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
        pubapi = PubAPI(issuer=self.issuer)

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


def _enrolled_validators(ek_server, swtpm_ek, tmp_path):
    """qemu-vtpm-ek validators whose trust holds ek_server's AK, enrolled over the RPC."""
    (tmp_path / "ca.pem").write_bytes(b"".join(Path(p).read_bytes() for p in swtpm_ek.ca_cert_paths()))
    validators = [choose.validator("qemu-vtpm-ek", _policy(swtpm_ek),
                                   choose.load_trust("qemu-vtpm-ek", str(tmp_path / "ca.pem")))]
    with connect_enrolling(_connect(ek_server.endpoint), validators) as client:
        certificate = x509.load_der_x509_certificate(client.attested.peer_certificate)
        assert [ext.oid.dotted_string for ext in certificate.extensions] == ["1.3.9900.5.100"]
    return validators


@pytest.fixture
def tampering(ek_server):
    """An aTLS server with ek_server's genuine issuer whose certificates carry the document under ``oid``."""
    servers = []

    def serve(oid):
        server = RecordingServer(TamperingServer(ek_server.issuer, lambda document: (oid, document)))
        servers.append(server)
        return server
    yield serve
    for server in servers:
        server.close()


def test_ek_variant_certificates_carry_the_short_oid_and_the_old_one_is_still_read(
        ek_server, swtpm_ek, tmp_path, tampering):
    validators = _enrolled_validators(ek_server, swtpm_ek, tmp_path)
    # A 0.2.0 agent wrote the UUID OID: the same validator reads it (this cryptography parses its 128-bit arc).
    old = tampering(choose.QEMU_VTPM_EK_OLD_OID)
    conn = atls.connect(old.endpoint, validators, timeout=10)
    assert conn.variant_oid == choose.QEMU_VTPM_EK_OLD_OID
    assert conn.validation.ek_pub_sha256 and conn.validation.measurement_set
    exchange_ping(old, conn)
    # An OID of no accepted variant stays refused, before a byte is sent, naming what was found and accepted.
    unknown = tampering("1.3.9900.5.101")
    message = assert_refused_before_any_byte(unknown, validators, "no attestation of an accepted variant")
    assert ("found OIDs [1.3.9900.5.101], accepted [1.3.9900.5.100, %s]" % choose.QEMU_VTPM_EK_OLD_OID) in message


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


def test_a_wrong_ek_ca_bundle_is_named_as_the_ek_chain_not_as_pcr_13(ek_server, swtpm_ek, swtpm_other_ca, tmp_path):
    """A controller given the wrong EK CA bundle expects another PCR 13 (the agent's measurement covers the trust
    configuration, the EK CAs included): it is told that the EK certificate does not chain, the real cause, not
    "measurements mismatch: PCR 13". With the right bundle, an agent that differs is still refused by PCR 13
    (on the connection after the enrollment, which sent nothing secret)."""
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.agent_measurement import (
        AgentMeasurement, enforce_agent_pcr)

    def controller(bundle):  # as settings_from_args builds it: PCR 13 at the value of its own agent and trust
        (tmp_path / "ca.pem").write_bytes(b"".join(Path(p).read_bytes() for p in bundle.ca_cert_paths()))
        trust = choose.load_trust("qemu-vtpm-ek", str(tmp_path / "ca.pem"))
        own = AgentMeasurement.of("qemu-vtpm-ek", trust.ek_ca_certs).value
        return trust, [choose.validator("qemu-vtpm-ek", enforce_agent_pcr(_policy(swtpm_ek), own), trust)]

    trust, validators = controller(swtpm_other_ca)
    with pytest.raises(AttestationError) as err:
        connect_enrolling(_connect(ek_server.endpoint), validators)
    assert "EK certificate does not chain to the trusted CAs" in str(err.value), err.value
    assert "PCR 13" not in str(err.value) and len(trust.certified_aks) == 0

    trust, validators = controller(swtpm_ek)
    with pytest.raises(AttestationError, match="measurements mismatch: PCR 13"):
        connect_enrolling(_connect(ek_server.endpoint), validators)
    assert len(trust.certified_aks) == 1  # the AK is genuine; the agent is not the one expected


def test_enroll_ak_on_a_variant_without_ek_is_refused(swtpm):
    issuer = choose.issuer("qemu-vtpm", swtpm.tcti, event_log_path=None)
    tls = AgentServerContext(issuer)
    pubapi = PubAPI(issuer=issuer)
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
