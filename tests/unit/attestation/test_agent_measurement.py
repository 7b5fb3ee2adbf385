# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The measured agent (attestation/agent_measurement.py): PCR 13 from the agent's code and trust configuration,
extended into a real swtpm, and what every validator expects there."""

from __future__ import annotations

import hashlib
import shutil

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import agent_measurement as am
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import tpm
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import Measurements
from ansible_collections.constellation.cluster.plugins.module_utils.constants import PCR_INDEX_AGENT


def _tree(tmp_path, files):
    root = tmp_path / "module_utils"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return str(root)


def test_code_digest_is_the_documented_listing_of_py_files(tmp_path):
    root = _tree(tmp_path, {"b.py": "B", "a/x.py": "X", "a/__pycache__/x.cpython-311.pyc": "junk", "notes.txt": "n"})
    listing = "a/x.py %s\nb.py %s\n" % (hashlib.sha256(b"X").hexdigest(), hashlib.sha256(b"B").hexdigest())
    assert am.code_digest(root) == hashlib.sha256(listing.encode()).digest()


def test_a_changed_agent_file_changes_the_code_digest(tmp_path):
    before = am.code_digest(_tree(tmp_path / "one", {"agent.py": "print(1)\n"}))
    after = am.code_digest(_tree(tmp_path / "two", {"agent.py": "print(2)\n"}))
    added = am.code_digest(_tree(tmp_path / "three", {"agent.py": "print(1)\n", "extra.py": ""}))
    assert len({before, after, added}) == 3


def test_the_running_code_is_measured_from_this_collection():
    assert am.code_root().endswith("plugins/module_utils")
    assert am.code_digest() == am.code_digest(am.code_root())


def test_the_trust_configuration_is_measured_and_host_settings_are_not(tmp_path):
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def ca(name):
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
                .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
                .sign(key, hashes.SHA256()))

    vendor, other = ca("vendor"), ca("other")
    base = am.AgentMeasurement.of("qemu-vtpm-ek", (vendor,))
    assert base == am.AgentMeasurement.of("qemu-vtpm-ek", (vendor,))
    assert base.config == am.AgentMeasurement.of("qemu-vtpm-ek", (vendor,), root=am.code_root()).config
    assert base.config != am.AgentMeasurement.of("qemu-vtpm-ek", (vendor, other)).config  # one more EK root
    assert base.config != am.AgentMeasurement.of("qemu-vtpm-ek", (other,)).config
    assert base.config != am.AgentMeasurement.of("qemu-vtpm", ()).config
    assert base.code == am.AgentMeasurement.of("qemu-vtpm", ()).code
    assert am.measured_config("qemu-vtpm-ek", (other, vendor)) == am.measured_config("qemu-vtpm-ek", (vendor, other))
    assert set(am.measured_config("qemu-vtpm-ek", (vendor,))) == {"version", "variant", "ek_ca_sha256"}


def test_the_value_replays_from_the_two_events():
    measured = am.AgentMeasurement(hashlib.sha256(b"code").digest(), hashlib.sha256(b"config").digest())
    expected = hashlib.sha256(hashlib.sha256(bytes(32) + measured.code).digest() + measured.config).digest()
    assert measured.value == expected
    doc = measured.to_dict()
    assert doc["pcr"] == PCR_INDEX_AGENT == 13 and [e["event"] for e in doc["events"]] == ["agent_code", "agent_config"]
    assert am.replay(doc["events"]) == expected and doc["value"] == expected.hex()


def test_every_validator_enforces_pcr_13_replacing_a_file_entry():
    policy = Measurements.from_dict({"4": {"expected": "11" * 32, "warnOnly": False},
                                     "13": {"expected": "00" * 32, "warnOnly": True}})
    value = hashlib.sha256(b"agent").digest()
    enforced = am.enforce_agent_pcr(policy, value)
    assert enforced.pcrs[13].expected == value and not enforced.pcrs[13].warn_only
    assert enforced.pcrs[4] == policy.pcrs[4] and policy.pcrs[13].expected == bytes(32)  # the input is unchanged
    with pytest.raises(Exception, match="PCR 13: expected"):
        enforced.compare({4: b"\x11" * 32, 13: bytes(32)})


def test_measure_extends_once_per_boot_and_says_when_another_agent_measured(fresh_swtpm):
    measured = am.AgentMeasurement(hashlib.sha256(b"code").digest(), hashlib.sha256(b"config").digest())
    with tpm.open_tpm(fresh_swtpm.tcti) as dev:
        assert am.measure(dev, measured) == "measured"
        assert dev.pcr_read("sha256", [13])[13] == measured.value
        assert am.measure(dev, measured) == "already"  # the agent restarted: the PCR still holds it
        assert dev.pcr_read("sha256", [13])[13] == measured.value
        changed = am.AgentMeasurement(measured.code, hashlib.sha256(b"another config").digest())
        assert am.measure(dev, changed) == "conflict"
        value = dev.pcr_read("sha256", [13])[13]
    assert value not in (measured.value, changed.value)  # no policy accepts this boot any more


def test_a_missing_code_folder_is_an_attestation_error(tmp_path):
    with pytest.raises(Exception, match="cannot measure the agent"):
        am.code_digest(str(tmp_path / "nowhere"))
    shutil.rmtree(str(tmp_path), ignore_errors=True)
