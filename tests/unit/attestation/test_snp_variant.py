# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``sev-snp`` variant (attestation/snp.py): documents issued from the lab's platform (lab/snp_platform.py, over
its unix socket) validate through the chooser with the lab's AMD roots; a wrong nonce, swapped user data, another
host's report, a foreign AMD chain, a debug guest, a downgraded TCB and a modified guest are refused, each naming
why; the document is decoded strictly; configfs-tsm's errors name the file and the cause; and a variant that quotes
no PCRs gets no PCR requirement from anyone (attestation/policy.py ``peer_policies``)."""

from __future__ import annotations

import base64
import json
import os
import tempfile
from pathlib import Path

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose, sev_snp, snp
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import parse_policy
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import (
    FRESH, OTHER, OURS, membership_without_pcrs, peer_policies, require_enforced_pcr)
from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import AgentConfig
from ansible_collections.constellation.cluster.plugins.module_utils.constants import (
    PCR_INDEX_AGENT, PCR_INDEX_CLUSTER_ID, STATE_ACCEPTING_INIT, STATE_IS_NODE)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError, InputError
from lab.amd import foreign_chain, lab_chain
from lab.snp import lab_snp_policy
from lab.snp_platform import SNPPlatform, serve

NONCE = bytes(range(32))
USER_DATA = b"the aTLS key's hash" + bytes(13)


@pytest.fixture(scope="module")
def lab_state():
    # A short folder: a unix socket's path has at most 107 bytes.
    with tempfile.TemporaryDirectory(prefix="snpv-", dir="/tmp") as folder:
        lab_chain(Path(folder)).ensure()
        yield Path(folder)


class Host:
    """One lab host's platform, served on its socket; ``issuer`` asks it through ``snp_report_source``."""

    def __init__(self, lab_state: Path, name: str):
        self.platform = SNPPlatform(lab_state / name, lab_state)
        self.platform.state()
        self.server = serve(self.platform.socket_path, self.platform)
        self.issuer = choose.issuer("sev-snp", None, snp_report_source="unix:%s" % self.platform.socket_path)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def hosts(lab_state):
    made = {name: Host(lab_state, name) for name in ("a", "b")}
    yield made
    for host in made.values():
        host.close()


@pytest.fixture
def host_a(hosts):
    yield hosts["a"]
    hosts["a"].platform.restore()


@pytest.fixture(scope="module")
def validator(lab_state):
    trust = choose.load_trust("sev-snp", None, amd_roots_path=str(lab_chain(lab_state).roots_path))
    return choose.validator("sev-snp", parse_policy({"snp": lab_snp_policy()}), trust)


def test_the_chooser_registers_sev_snp_as_ours_without_pcrs():
    spec = choose.spec("sev-snp")
    assert spec.oid == "1.3.9900.5.101" == choose.SEV_SNP_OID
    assert spec.needs_amd_roots and not spec.quotes_pcrs and not spec.needs_ek_ca and spec.needs_policy


def test_a_document_from_the_platform_validates_with_its_report_fields(host_a, validator):
    document = host_a.issuer.issue(USER_DATA, NONCE)
    outer = json.loads(document)
    assert sorted(outer) == ["InstanceInfo", "UserData"]
    info = json.loads(base64.b64decode(outer["InstanceInfo"]))
    assert sorted(info) == sorted(["ReportSigner", "CertChain", "AttestationReport", "Azure", "GCP"])
    assert info["Azure"] is None and b"BEGIN CERTIFICATE" in base64.b64decode(info["ReportSigner"])
    validation = validator.validate(document, NONCE)
    assert validation.user_data == USER_DATA
    assert validation.pcrs == {} and validation.ak_pub is None and validation.ek_pub_sha256 is None
    assert validation.measurement_set == "default"
    state = host_a.platform.state()
    assert validation.snp["measurement"] == state.measurement
    assert validation.snp["chip_id"] == state.chip_id
    assert validation.snp["reported_tcb"]["microcode"] == state.reported_tcb["microcode"]
    assert validation.snp["signing_key"] == "vcek"
    assert validation.snp["report_data"] == (snp.make_report_data(USER_DATA, NONCE) + bytes(32)).hex()


def _refusal(validator, document, nonce=NONCE):
    with pytest.raises(AttestationError) as err:
        validator.validate(document, nonce)
    return err.value


def test_a_wrong_nonce_is_refused_naming_report_data(host_a, validator):
    err = _refusal(validator, host_a.issuer.issue(USER_DATA, NONCE), bytes(32))
    assert isinstance(err, sev_snp.SNPError) and err.field == "report_data"
    assert "wrong nonce" in str(err)


def test_swapped_user_data_is_refused_naming_report_data(host_a, validator):
    outer = json.loads(host_a.issuer.issue(USER_DATA, NONCE))
    outer["UserData"] = base64.b64encode(b"another TLS key").decode()
    err = _refusal(validator, json.dumps(outer).encode())
    assert isinstance(err, sev_snp.SNPError) and err.field == "report_data"


def test_another_hosts_report_replayed_is_refused(hosts, validator):
    old = hosts["b"].issuer.issue(USER_DATA, b"an earlier nonce")
    assert validator.validate(old, b"an earlier nonce").snp["chip_id"] == hosts["b"].platform.state().chip_id
    err = _refusal(validator, old)  # what host b said to another verifier, shown to this one
    assert isinstance(err, sev_snp.SNPError) and err.field == "report_data"
    # Host b's report inside a document claiming host a's signer: the VCEK's chip ID is not the report's.
    info_a = json.loads(base64.b64decode(json.loads(hosts["a"].issuer.issue(USER_DATA, NONCE))["InstanceInfo"]))
    outer_b = json.loads(hosts["b"].issuer.issue(USER_DATA, NONCE))
    info_b = json.loads(base64.b64decode(outer_b["InstanceInfo"]))
    info_b["ReportSigner"] = info_a["ReportSigner"]
    outer_b["InstanceInfo"] = base64.b64encode(json.dumps(info_b).encode()).decode()
    assert "chip" in str(_refusal(validator, json.dumps(outer_b).encode())).lower()


def test_a_report_signed_by_another_amd_is_refused(host_a, validator):
    host_a.platform.tamper("foreign")
    err = _refusal(validator, host_a.issuer.issue(USER_DATA, NONCE))
    assert isinstance(err, sev_snp.SNPError) and "ark" in err.field.lower() + str(err).lower()


@pytest.mark.parametrize("tamper,field", [("debug", "snp.allowDebug"), ("tcb", "snp.microcodeVersion"),
                                          ("measurement", "snp.launchMeasurement")])
def test_a_tampered_guest_or_platform_is_refused_naming_the_field(host_a, validator, tamper, field):
    host_a.platform.tamper(tamper)
    err = _refusal(validator, host_a.issuer.issue(USER_DATA, NONCE))
    assert field in str(err)


def test_a_set_without_snp_refuses_the_report(host_a, lab_state):
    trust = choose.load_trust("sev-snp", None, amd_roots_path=str(lab_chain(lab_state).roots_path))
    validator = choose.validator("sev-snp", parse_policy({"4": "00" * 32}), trust)
    assert "snp" in str(_refusal(validator, host_a.issuer.issue(USER_DATA, NONCE)))


def test_the_pinned_amd_roots_refuse_the_labs_chain(host_a):
    validator = choose.validator("sev-snp", parse_policy({"snp": lab_snp_policy()}), choose.load_trust("sev-snp", None))
    assert "ark" in str(_refusal(validator, host_a.issuer.issue(USER_DATA, NONCE))).lower()


# ------------------------------------------------------------------------------------- strict decoding


def _document(info=None, **outer):
    base = {"ReportSigner": "", "CertChain": "", "AttestationReport": base64.b64encode(bytes(1184)).decode(),
            "Azure": None, "GCP": None}
    base.update(info or {})
    doc = {"InstanceInfo": base64.b64encode(json.dumps(base).encode()).decode(), "UserData": ""}
    doc.update(outer)
    return json.dumps(doc).encode()


@pytest.mark.parametrize("document,words", [
    (b"not json", "not JSON"),
    (b"[]", "not an object"),
    (_document(Quote="x"), "unknown key"),
    (_document({"Extra": 1}), "InstanceInfo: expected only the keys"),
    (_document({"Azure": {"RuntimeData": ""}}), "InstanceInfo.Azure"),
    (_document({"AttestationReport": None}), "InstanceInfo.AttestationReport: expected the SEV-SNP report"),
    (_document({"AttestationReport": "***"}), "InstanceInfo.AttestationReport: expected standard base64"),
    (_document(UserData=5), "UserData must be base64"),
    (b" " * (snp.MAX_DOCUMENT + 1), "larger than"),
])
def test_malformed_documents_are_refused_naming_what(validator, document, words):
    assert words in str(_refusal(validator, document))


def test_a_report_that_does_not_parse_is_refused_before_anything_else(validator):
    err = _refusal(validator, _document())
    assert isinstance(err, AttestationError) and not isinstance(err, TypeError)


# ------------------------------------------------------------------------------------ report sources


def test_configfs_tsm_errors_name_the_file_and_the_cause(tmp_path):
    missing = snp.report_source("configfs-tsm:%s" % (tmp_path / "no-tsm"))
    with pytest.raises(AttestationError) as err:
        missing.get(bytes(64))
    assert str(tmp_path / "no-tsm") in str(err.value) and "configfs-tsm" in str(err.value)
    # An ordinary folder: the entry is made, but no kernel answers in it.
    plain = snp.report_source("configfs-tsm:%s" % tmp_path)
    with pytest.raises(AttestationError) as err:
        plain.get(bytes(64))
    assert "generation" in str(err.value) and "No such file" in str(err.value)


def test_a_missing_platform_socket_is_named(tmp_path):
    issuer = choose.issuer("sev-snp", None, snp_report_source="unix:%s" % (tmp_path / "none.sock"))
    with pytest.raises(AttestationError) as err:
        issuer.issue(b"", NONCE)
    assert "snp_report_source" in str(err.value) and "none.sock" in str(err.value)


@pytest.mark.parametrize("value", ["configfs-tsm", "tsm:/x", "unix:relative", 5, "unix:"])
def test_report_source_values_are_checked(value):
    with pytest.raises(InputError) as err:
        snp.parse_report_source(value)
    assert err.value.field == "snp_report_source"


def test_the_default_report_source_is_linuxs():
    assert snp.parse_report_source(None) == ("configfs-tsm", "/sys/kernel/config/tsm/report")


def _config(**extra):
    return dict(state_dir="/tmp/x", public_endpoint="10.0.0.1:9000", measurements="/m.json",
                insecure_unsigned_measurements=True, insecure_unauthenticated_activation=True, **extra)


def test_agent_config_checks_the_snp_keys():
    config = AgentConfig.from_mapping(_config(variant="sev-snp", snp_report_source="unix:/run/p.sock",
                                              amd_roots=["/a.pem", "/b.pem"]))
    assert config.snp_report_source == "unix:/run/p.sock"
    for bad, field in ((dict(variant="sev-snp", snp_report_source="socket"), "snp_report_source"),
                       (dict(variant="sev-snp", amd_roots=["/a.pem", 3]), "amd_roots"),
                       (dict(variant="qemu-vtpm-ek", ek_ca="/ca.pem", amd_roots="/r.pem"), "amd_roots"),
                       (dict(variant="qemu-vtpm-ek", ek_ca="/ca.pem", snp_report_source="unix:/p"),
                        "snp_report_source")):
        with pytest.raises(InputError) as err:
            AgentConfig.from_mapping(_config(**bad))
        assert err.value.field == field


# ------------------------------------------------------------------ the quotes_pcrs=False rule, one place


def test_no_pcr_requirement_is_added_for_a_variant_that_quotes_none():
    policy = parse_policy({"accepted": {"one": {"4": "11" * 32, "snp": lab_snp_policy()}}, "version": 2})
    policies = peer_policies("sev-snp", policy, b"\x13" * 32)
    for each in policies:
        assert all(not m.pcrs and m.snp is not None for m in each.sets.values())
    ek = peer_policies("qemu-vtpm-ek", policy, b"\x13" * 32)
    assert PCR_INDEX_AGENT in ek.full.sets["one"].pcrs
    assert PCR_INDEX_CLUSTER_ID in ek.fresh_node.sets["one"].pcrs
    assert PCR_INDEX_CLUSTER_ID not in ek.coordinator.sets["one"].pcrs
    assert ek.sealed is policy


def test_a_set_with_only_an_snp_object_enforces_something():
    require_enforced_pcr(parse_policy({"snp": lab_snp_policy()}), "inline")
    with pytest.raises(InputError):
        require_enforced_pcr(parse_policy({"15": "00" * 32}), "inline")


def test_without_pcr_15_the_attested_agent_answers_for_its_membership():
    assert membership_without_pcrs(STATE_ACCEPTING_INIT, None) == FRESH
    assert membership_without_pcrs(STATE_IS_NODE, True) == OURS
    assert membership_without_pcrs(STATE_IS_NODE, False) == OTHER
    assert membership_without_pcrs(STATE_IS_NODE, None) == OTHER


def test_the_agents_snp_sealing_needs_a_tpm(tmp_path):
    from ansible_collections.constellation.cluster.plugins.module_utils.agent import unsealing
    from ansible_collections.constellation.cluster.plugins.module_utils.errors import StateError

    class Attestation:
        seals = True
        measurement = None
        sealed_pcrs = []
        policy = None

    config = AgentConfig.from_mapping(dict(_config(variant="sev-snp"), state_dir=str(tmp_path),
                                           tcti="swtpm:host=127.0.0.1,port=1"))
    with pytest.raises(StateError) as err:
        unsealing.measure_and_unseal(config, Attestation(), lambda *a, **k: None)
    assert str(err.value).startswith("tcti: variant sev-snp quotes no TPM")
    assert os.listdir(str(tmp_path)) == []


def test_a_set_that_pins_its_own_amd_root_is_verified_to_it(host_a, lab_state):
    """``amdRootKey`` pins an ARK instead of the verifier's roots: the lab's ARK in the set passes with AMD's pinned
    roots configured; a set pinning another AMD's ARK refuses the lab's report, and the next set is tried."""
    ark = lab_chain(lab_state).ark_path.read_text()
    own = choose.validator("sev-snp", parse_policy({"snp": dict(lab_snp_policy(), amdRootKey=ark)}),
                           choose.load_trust("sev-snp", None))
    assert own.validate(host_a.issuer.issue(USER_DATA, NONCE), NONCE).measurement_set == "default"
    other = foreign_chain(lab_state).ensure().ark_path.read_text()
    lab_roots = choose.load_trust("sev-snp", None, amd_roots_path=str(lab_chain(lab_state).roots_path))
    alone = choose.validator("sev-snp", parse_policy({"snp": dict(lab_snp_policy(), amdRootKey=other)}), lab_roots)
    assert "ark" in str(_refusal(alone, host_a.issuer.issue(USER_DATA, NONCE))).lower()
    both = parse_policy({"accepted": {"other": {"snp": dict(lab_snp_policy(), amdRootKey=other)},
                                      "lab": {"snp": lab_snp_policy()}}, "version": 1})
    validator = choose.validator("sev-snp", both, lab_roots)
    assert validator.validate(host_a.issuer.issue(USER_DATA, NONCE), NONCE).measurement_set == "lab"


def test_sev_snps_storage_key_is_bound_to_the_tpm_only(fresh_swtpm, tmp_path):
    """What docs/attestation.md says of sev-snp's secrets at rest: sealed to no PCR, the key opens after any boot
    of this TPM (a changed PCR 4 included) and on no other TPM; resealing to a document's sets keeps it so."""
    import hashlib

    from ansible_collections.constellation.cluster.plugins.module_utils.attestation import tpm
    from ansible_collections.constellation.cluster.plugins.module_utils.core.at_rest import SealedStorage, seal_predictions
    from ansible_collections.constellation.cluster.plugins.module_utils.errors import StateError
    from ansible_collections.constellation.cluster.tests.unit.attestation.conftest import _start

    policy = parse_policy({"accepted": {"one": {"4": "11" * 32, "snp": lab_snp_policy()}}, "version": 1})
    sealed = peer_policies("sev-snp", policy, None).sealed
    folder = tmp_path / "state"
    folder.mkdir()

    def opened(tcti):
        return SealedStorage.open(str(folder), lambda: tpm.open_tpm(tcti), [], tpm_only=True)

    storage = opened(fresh_swtpm.tcti)
    assert storage.pcrs == []
    storage.write_file(str(folder / "secret"), b"kms")
    assert storage.reseal(seal_predictions(sealed)) is True and storage.sealed_sets == ["one"]
    with tpm.open_tpm(fresh_swtpm.tcti) as dev:
        dev.pcr_extend(4, hashlib.sha256(b"another boot").digest())
    assert opened(fresh_swtpm.tcti).read_file(str(folder / "secret")) == b"kms"
    other = _start(tmp_path / "other-tpm")
    try:
        with pytest.raises(StateError, match="cannot be read here"):
            opened(other.tcti)
    finally:
        other.stop()
    with pytest.raises(StateError, match="at least one PCR"):
        SealedStorage.open(str(tmp_path / "plain"), lambda: tpm.open_tpm(fresh_swtpm.tcti), [])


def test_configfs_tsm_gives_the_report_the_kernel_made_for_the_inblob(hosts, validator, tmp_path, monkeypatch):
    """configfs-tsm's sequence against a stand-in kernel: the entry's attribute files appear on mkdir, outblob and
    auxblob answer for what was written to inblob (the lab's platform signs it)."""
    platform = hosts["a"].platform
    made = []
    real_mkdir = os.mkdir

    def mkdir(path, mode=0o777):
        real_mkdir(path, mode)
        made.append(path)
        for name, data in (("provider", b"sev_guest\n"), ("generation", b"1\n"), ("auxblob", b""), ("outblob", b"")):
            with open(os.path.join(path, name), "wb") as handle:
                handle.write(data)

    class Kernel(snp.ConfigfsTSM):
        def _read(self, entry, name):
            if name in ("outblob", "auxblob"):
                with open(os.path.join(entry, "inblob"), "rb") as handle:
                    report, table = platform.sign_report(handle.read())
                return report if name == "outblob" else table
            return super()._read(entry, name)

    monkeypatch.setattr(snp.os, "mkdir", mkdir)
    issuer = snp.SNPIssuer(Kernel(str(tmp_path)))
    assert validator.validate(issuer.issue(USER_DATA, NONCE), NONCE).snp["chip_id"] == platform.state().chip_id
    assert len(made) == 1 and os.path.dirname(made[0]) == str(tmp_path)

    class OtherProvider(Kernel):
        def _read(self, entry, name):
            return b"tdx_guest\n" if name == "provider" else super()._read(entry, name)

    with pytest.raises(AttestationError, match="tdx_guest"):
        snp.SNPIssuer(OtherProvider(str(tmp_path))).issue(USER_DATA, NONCE)


def test_the_coordinator_re_attests_a_peer_without_pcrs_by_its_own_word(make_core):
    """Core: a peer whose attestation quotes no PCRs (sev-snp) is ours when it accepts the Coordinators' key,
    fresh (rebooted, not rejoined) when it says AcceptingInit, and evicted when it refuses the key (another
    cluster's, or a reset agent's)."""
    import os as _os

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from ansible_collections.constellation.cluster.plugins.module_utils import kms
    from ansible_collections.constellation.cluster.plugins.module_utils.errors import AccessDenied
    from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import (
        generate_priv_key, pub_key_from_priv_key)
    from ansible_collections.constellation.cluster.tests.support.core_fakes import FakePeerClient, MemoryTPM

    c, _vpn = make_core(MemoryTPM(), public_ip="10.42.0.1")
    c.recovery.load()
    admin = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    c.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), _os.urandom(32), admin)
    peers = {}
    for octet in (2, 3, 4):
        key = pub_key_from_priv_key(generate_priv_key())
        vpn_ip = c.context.peer_registry.update(lambda r: r.allocator.allocate("node"))
        c.coordinator.add_node_peer(vpn_ip, key, "10.42.0.%d" % octet)
        peers["10.42.0.%d" % octet] = {"vpn_ip": vpn_ip, "vpn_pub_key": key, "state": "IsNode"}

    class NoPCRs(FakePeerClient):
        attested = object()  # an attested connection whose validation has no PCRs

        def __init__(self, state, accepts=True):
            super().__init__(None, state)
            self.accepts = accepts

        def attested_pcrs(self):
            return {}

        def coordinator_auth(self, sign_auth):
            if not self.accepts:
                raise AccessDenied("AdminAuth (role coordinator): the signature does not verify")
            super().coordinator_auth(sign_auth)

        def get_state(self):  # the public part of GetState needs no AdminAuth
            return dict(self.state) if self.authenticated else {"state": self.state["state"], "role": "node"}

    def connect(public_ip):
        if public_ip == "10.42.0.3":
            return NoPCRs(dict(peers[public_ip], state="AcceptingInit"))
        return NoPCRs(peers[public_ip], accepts=public_ip == "10.42.0.2")

    rows = {r["public_ip"]: r for r in c.peer_trust.reattest_peers(connect, unreachable_limit=3)}
    assert rows["10.42.0.2"]["outcome"] == "passed"
    assert rows["10.42.0.3"]["outcome"] == "unreachable" and "rebooted" in rows["10.42.0.3"]["error"]
    assert rows["10.42.0.4"]["outcome"] == "evicted"
    assert [e["vpn_ip"] for e in c.get_state()["evicted"]] == [peers["10.42.0.4"]["vpn_ip"]]
