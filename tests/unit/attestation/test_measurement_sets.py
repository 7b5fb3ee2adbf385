# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Several named accepted measurement sets (a rolling image upgrade): the format, the plain form as the
one set "default", which set matched, the transforms per set, the signature over the whole file, and a real
swtpm quote validated against two sets."""

from __future__ import annotations

import json

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import signature
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.agent_measurement import enforce_agent_pcr
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    DEFAULT_SET_NAME,
    Measurement,
    Measurements,
    MeasurementSets,
    MeasurementsMismatch,
    as_sets,
    parse_policy,
)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import (
    enforced_pcrs,
    load_policy,
    load_policy_file,
)
from ansible_collections.constellation.cluster.plugins.module_utils.agent.pubapi import coordinator_policy, fresh_node_policy
from ansible_collections.constellation.cluster.plugins.module_utils.core.at_rest import sealed_pcr_sets
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.tests.support.keys import measurements_key

V1 = {4: b"\x01" * 32, 9: b"\x02" * 32}
V2 = {4: b"\x11" * 32, 9: b"\x12" * 32}


def _set(values, warn=()):
    return {str(i): {"expected": v.hex(), "warnOnly": i in warn} for i, v in values.items()}


def _doc():
    return {"accepted": {"lab-v1": _set(V1), "lab-v2": _set(V2)}}


def test_named_sets_parse_and_round_trip():
    policy = parse_policy(_doc())
    assert isinstance(policy, MeasurementSets)
    assert list(policy.sets) == ["lab-v1", "lab-v2"]  # document order is kept
    assert policy.sets["lab-v2"].pcrs[4] == Measurement(V2[4], False)
    assert MeasurementSets.from_dict(json.loads(policy.dumps())) == policy


def test_plain_form_is_one_set_named_default():
    plain = parse_policy(_set(V1))
    assert isinstance(plain, Measurements)  # what a caller that knows only plain policies expects
    assert list(plain.sets) == [DEFAULT_SET_NAME]
    assert plain.match(V1)[0] == DEFAULT_SET_NAME
    assert list(as_sets(plain).sets) == [DEFAULT_SET_NAME]
    assert list(MeasurementSets.from_dict(_set(V1)).sets) == [DEFAULT_SET_NAME]


def test_match_names_the_set_and_compare_keeps_its_contract():
    policy = parse_policy(_doc())
    name, checks, warnings = policy.match(V2)
    assert name == "lab-v2" and all(c.ok for c in checks) and warnings == []
    assert policy.match(V1)[0] == "lab-v1"
    checks, warnings = policy.compare(V2)
    assert [c.index for c in checks] == [4, 9]


def test_no_set_matches_names_every_set():
    policy = parse_policy(_doc())
    other = {4: b"\x21" * 32, 9: V2[9]}
    with pytest.raises(MeasurementsMismatch) as err:
        policy.match(other)
    text = str(err.value)
    assert "no accepted set matches (lab-v1, lab-v2)" in text
    assert "set lab-v1: PCR 4" in text and "set lab-v2: PCR 4" in text
    # The table of the closest set (lab-v2: only PCR 4 differs).
    assert [c.index for c in err.value.checks if not c.ok] == [4]


def test_a_mixed_set_cannot_pass():
    """PCR 4 of one image and PCR 9 of the other: no single set matches, so the peer fails."""
    with pytest.raises(MeasurementsMismatch):
        parse_policy(_doc()).match({4: V1[4], 9: V2[9]})


@pytest.mark.parametrize("doc, expected", [
    ({"accepted": {}}, "at least one named set"),
    ({"accepted": []}, "a mapping of set name"),
    ({"accepted": {"bad name": _set(V1)}}, "set names of"),
    ({"accepted": {"-x": _set(V1)}}, "set names of"),
    ({"accepted": {"v1": {"4": "zz"}}}, "measurements.accepted[v1]"),
    ({"accepted": {"v%d" % i: _set(V1) for i in range(17)}}, "at most 16"),
])
def test_bad_documents_name_what_is_wrong(doc, expected):
    with pytest.raises(InputError) as err:
        parse_policy(doc)
    assert expected in str(err.value)


def test_accepted_next_to_pcrs_is_refused():
    with pytest.raises(InputError):
        parse_policy({"accepted": {"v1": _set(V1)}, "4": V1[4].hex()})


def test_transforms_apply_per_set():
    policy = parse_policy(_doc())
    agent = enforce_agent_pcr(policy, b"\x13" * 32)
    assert isinstance(agent, MeasurementSets)
    assert all(m.pcrs[13].expected == b"\x13" * 32 for m in agent.sets.values())
    fresh = fresh_node_policy(agent)
    assert all(m.pcrs[15].expected == bytes(32) for m in fresh.sets.values())
    coordinator = coordinator_policy(fresh)
    assert all(15 not in m.pcrs for m in coordinator.sets.values())
    assert enforced_pcrs(agent) == [4, 9, 13]
    assert sealed_pcr_sets(agent) == {"lab-v1": [4, 9], "lab-v2": [4, 9]}  # never PCR 13: root could replay it
    # A plain policy stays plain.
    assert isinstance(enforce_agent_pcr(parse_policy(_set(V1)), b"\x13" * 32), Measurements)


def test_a_set_that_enforces_nothing_is_refused_naming_it(tmp_path):
    doc = {"accepted": {"lab-v1": _set(V1), "lab-v2": _set(V2, warn=(4, 9))}}
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError) as err:
        load_policy_file(str(path))
    assert "in set lab-v2" in str(err.value)
    with pytest.raises(InputError):
        load_policy(measurements=doc)


def test_the_signature_covers_the_whole_file(tmp_path):
    pub = tmp_path / "m.pub"
    key = measurements_key(pub)
    path = tmp_path / "m.json"
    path.write_text(json.dumps(_doc()))
    (tmp_path / "m.json.sig").write_text(signature.sign_blob(key, path.read_bytes()))
    assert list(load_policy_file(str(path), public_key_path=str(pub)).sets) == ["lab-v1", "lab-v2"]
    # An attacker adds a set of its own image to a signed file: refused before anything is parsed.
    doc = _doc()
    doc["accepted"]["evil"] = _set({4: b"\x66" * 32, 9: b"\x66" * 32})
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError) as err:
        load_policy_file(str(path), public_key_path=str(pub))
    assert "does not verify" in str(err.value)


def test_a_real_quote_matches_the_second_set(swtpm):
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.tpm import read_pcrs
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import VTPMIssuer, VTPMValidator
    from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError

    pcrs = read_pcrs(swtpm.tcti)
    current = Measurements({i: Measurement(pcrs[i]) for i in (4, 9, 11)})
    old = Measurements({i: Measurement(b"\x42" * 32) for i in (4, 9, 11)})
    nonce = bytes(range(32))
    with VTPMIssuer(swtpm.tcti, event_log_path=None) as issuer:
        document = issuer.issue(b"u", nonce)
    result = VTPMValidator(MeasurementSets({"old": old, "new": current})).validate(document, nonce)
    assert result.measurement_set == "new" and result.user_data == b"u"
    assert VTPMValidator(current).validate(document, nonce).measurement_set == DEFAULT_SET_NAME
    with pytest.raises(AttestationError) as err:
        VTPMValidator(MeasurementSets({"old": old, "older": old})).validate(document, nonce)
    assert "no accepted set matches (old, older)" in str(err.value)


def test_the_version_is_part_of_the_signed_document():
    doc = dict(_doc(), version=3)
    policy = parse_policy(doc)
    assert policy.version == 3 and policy.to_dict()["version"] == 3
    assert fresh_node_policy(policy).version == 3  # the transforms keep it
    assert parse_policy(_doc()).version == 0
    with pytest.raises(InputError):
        parse_policy(dict(_doc(), version=-1))
    with pytest.raises(InputError):
        parse_policy(dict(_doc(), version=True))


def test_the_controller_and_the_connection_plugin_take_named_sets(tmp_path):
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import settings_from_args
    from ansible_collections.constellation.cluster.plugins.plugin_utils.atls.settings import SettingsError, validate_policy

    assert list(validate_policy(_doc(), "inventory").sets) == ["lab-v1", "lab-v2"]
    with pytest.raises(SettingsError, match="in set lab-v2"):
        validate_policy({"accepted": {"lab-v1": _set(V1), "lab-v2": _set(V2, warn=(4, 9))}}, "inventory")
    path = tmp_path / "m.json"
    path.write_text(json.dumps(_doc()))
    settings = settings_from_args({"measurements_file": str(path), "variant": "qemu-vtpm", "insecure_trust_any_ak": True,
                                   "timeout": 10.0, "attestation_timeout": 30.0})
    assert isinstance(settings.policy, MeasurementSets)
    assert all(13 in m.pcrs for m in settings.policy.sets.values())  # the agent's PCR, per set
