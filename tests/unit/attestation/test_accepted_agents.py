# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agents a measurements document accepts on PCR 13 (docs/attestation.md, "The agent's PCR"): the ``agents``
map parsed, checked and written back, and the one rule every validator applies to it (``enforce_agent_pcr``)."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import agent_measurement as am
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    RESERVED_AGENT_NAME, AcceptedAgent, Measurements, MeasurementSets, MeasurementsMismatch, accepted_agents, parse_policy)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import (
    load_policy_file, pcr_mismatch_text, pcr_rows)
from ansible_collections.constellation.cluster.plugins.module_utils.agent.pubapi import fresh_node_policy
from ansible_collections.constellation.cluster.plugins.module_utils.core.at_rest import sealed_pcr_sets, seal_predictions
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError

V1 = {4: b"\x01" * 32, 9: b"\x02" * 32}
V2 = {4: b"\x11" * 32, 9: b"\x12" * 32}


def _agent(tag: bytes) -> am.AgentMeasurement:
    return am.AgentMeasurement(hashlib.sha256(b"code " + tag).digest(), hashlib.sha256(b"config " + tag).digest())


OLD, NEW, THIRD = _agent(b"0.2.0"), _agent(b"0.3.0"), _agent(b"evil")


def _set(values):
    return {str(i): {"expected": v.hex(), "warnOnly": False} for i, v in values.items()}


def _doc(**agents):
    doc = {"version": 3, "accepted": {"v1": _set(V1), "v2": _set(V2)}}
    if agents:
        doc["agents"] = agents
    return doc


def _pcrs(values, agent):
    return {**values, 13: agent.value}


def test_agents_parse_validate_and_round_trip():
    doc = _doc(**{"0.2.0": OLD.to_dict(), "0.3.0": {"value": NEW.value.hex()}})
    policy = parse_policy(doc)
    assert list(policy.agents) == ["0.2.0", "0.3.0"]  # document order
    assert policy.agents["0.2.0"] == AcceptedAgent(OLD.value, tuple(OLD.events))
    assert policy.agents["0.3.0"] == AcceptedAgent(NEW.value)  # pcr and events are optional
    again = MeasurementSets.from_dict(json.loads(policy.dumps()))
    assert again == policy and again.to_dict() == policy.to_dict()
    assert policy.to_dict()["agents"]["0.2.0"] == OLD.to_dict()  # written as AgentMeasurement.to_dict writes it
    # Another agent list is another document.
    assert parse_policy(_doc(**{"0.2.0": OLD.to_dict()})) != policy


def test_without_agents_there_are_none():
    assert accepted_agents(parse_policy(_set(V1))) == {}
    assert isinstance(parse_policy(_set(V1)), Measurements)
    named = parse_policy(_doc())
    assert named.agents == {} and "agents" not in named.to_dict()
    assert accepted_agents(None) == {}


def _bad(mutate):
    doc = _doc(a1=OLD.to_dict())
    mutate(doc["agents"])
    return doc


@pytest.mark.parametrize("mutate, field, expected", [
    (lambda a: a.update({"bad name": a["a1"]}), "agents", "agent names of 1-64 characters"),
    (lambda a: a.update({"self": a["a1"]}), "agents", "other than 'self'"),
    (lambda a: a.__setitem__("a1", "00" * 32), "agents.a1", "a mapping with value"),
    (lambda a: a["a1"].pop("value"), "agents.a1.value", "64 hex characters"),
    (lambda a: a["a1"].__setitem__("value", "zz" * 32), "agents.a1.value", "64 hex characters"),
    (lambda a: a["a1"].__setitem__("value", "00" * 48), "agents.a1.value", "64 hex characters"),
    (lambda a: a["a1"].__setitem__("pcr", 12), "agents.a1.pcr", "13 (the agent's PCR)"),
    (lambda a: a["a1"].__setitem__("pcr", True), "agents.a1.pcr", "13 (the agent's PCR)"),
    (lambda a: a["a1"].__setitem__("extra", 1), "agents.a1", "only the keys pcr, value and events"),
    (lambda a: a["a1"].__setitem__("events", []), "agents.a1.events", "a list of 1 to 16 events"),
    (lambda a: a["a1"]["events"][0].pop("digest"), "agents.a1.events[0]", "exactly event and digest"),
    (lambda a: a["a1"]["events"][1].__setitem__("digest", "xy"), "agents.a1.events[1].digest", "64 hex"),
    (lambda a: a["a1"]["events"][0].__setitem__("event", "a b"), "agents.a1.events[0].event", "an event name"),
])
def test_each_bad_field_is_named(mutate, field, expected):
    with pytest.raises(InputError) as err:
        parse_policy(_bad(mutate))
    assert err.value.field == field and expected in err.value.expected, str(err.value)


def test_events_that_do_not_replay_to_the_value_refuse_the_document_naming_the_entry():
    entry = OLD.to_dict()
    entry["events"][1]["digest"] = NEW.config.hex()  # another configuration's event under the old value
    with pytest.raises(InputError) as err:
        parse_policy(_doc(**{"0.2.0": entry}))
    assert err.value.field == "agents.0.2.0.events"
    assert "replay to agents.0.2.0.value %s" % OLD.value.hex() in str(err.value)
    assert am.replay(entry["events"]).hex() in str(err.value)


def test_too_many_agents_and_agents_without_sets_are_refused():
    with pytest.raises(InputError, match="at most 16 agents"):
        parse_policy(_doc(**{"a%d" % i: {"value": _agent(b"%d" % i).value.hex()} for i in range(17)}))
    parse_policy(_doc(**{"a%d" % i: {"value": _agent(b"%d" % i).value.hex()} for i in range(16)}))
    with pytest.raises(InputError) as err:
        parse_policy({"agents": {"a1": OLD.to_dict()}, "4": V1[4].hex()})
    assert err.value.field == "agents" and "beside accepted sets" in str(err.value)
    with pytest.raises(InputError) as err:
        parse_policy(dict(_doc(), agents=[OLD.to_dict()]))
    assert err.value.field == "agents"


def test_a_signed_file_with_agents_loads(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(_doc(a1=OLD.to_dict())))
    assert list(load_policy_file(str(path)).agents) == ["a1"]


# -- the validators' rule


def test_either_accepted_agent_passes_and_the_match_names_it():
    doc = parse_policy(_doc(**{"0.2.0": OLD.to_dict(), "0.3.0": NEW.to_dict()}))
    own = THIRD.value  # a validator whose own code differs from both: it still accepts what the document lists
    policy = am.enforce_agent_pcr(doc, own)
    for agent, name in ((OLD, "0.2.0"), (NEW, "0.3.0")):
        for values, set_name in ((V1, "v1"), (V2, "v2")):
            matched_set, checks, _warnings = policy.match(_pcrs(values, agent))
            assert matched_set == set_name and am.matched_agent(checks) == name
            row = [r for r in pcr_rows(checks) if r["index"] == 13][0]
            assert row["ok"] and row["matched"] == name and row["expected"] == row["found"] == agent.value.hex()
            assert row["accepted"] == {"0.2.0": OLD.value.hex(), "0.3.0": NEW.value.hex()}


def test_a_third_agent_is_refused_naming_the_found_and_every_accepted_value():
    doc = parse_policy(_doc(**{"0.2.0": OLD.to_dict(), "0.3.0": NEW.to_dict()}))
    policy = am.enforce_agent_pcr(doc, OLD.value)
    with pytest.raises(MeasurementsMismatch) as err:
        policy.match(_pcrs(V2, THIRD))
    expected = "PCR 13 (the agent): expected one of 0.2.0=%s, 0.3.0=%s, found %s" % (
        OLD.value.hex(), NEW.value.hex(), THIRD.value.hex())
    assert expected in str(err.value)
    assert am.matched_agent(err.value.checks) is None
    assert "PCR 13: expected one of 0.2.0=" in pcr_mismatch_text(err.value.checks)
    # The validator's own value is not accepted beside a list that leaves it out.
    with pytest.raises(MeasurementsMismatch):
        am.enforce_agent_pcr(parse_policy(_doc(**{"0.3.0": NEW.to_dict()})), OLD.value).match(_pcrs(V1, OLD))


def test_without_agents_the_validator_s_own_value_as_before():
    for doc in (parse_policy(_doc()), parse_policy(_set(V1))):
        policy = am.enforce_agent_pcr(doc, OLD.value)
        _name, checks, _warnings = policy.match(_pcrs(V1, OLD))
        assert am.matched_agent(checks) == am.OWN_AGENT == "self"
        assert "matched" not in [r for r in pcr_rows(checks) if r["index"] == 13][0]
        with pytest.raises(MeasurementsMismatch) as err:
            policy.match(_pcrs(V1, NEW))
        assert "PCR 13: expected %s, found %s" % (OLD.value.hex(), NEW.value.hex()) in str(err.value)


def test_a_set_s_own_pcr_13_entry_is_replaced_and_the_agents_survive_the_transforms():
    doc = _doc(a1=OLD.to_dict())
    doc["accepted"]["v1"]["13"] = {"expected": THIRD.value.hex(), "warnOnly": False}
    policy = fresh_node_policy(am.enforce_agent_pcr(parse_policy(doc), THIRD.value))
    assert list(policy.agents) == ["a1"]
    assert policy.match({**_pcrs(V1, OLD), 15: bytes(32)})[0] == "v1"
    with pytest.raises(MeasurementsMismatch):
        policy.match({**_pcrs(V1, THIRD), 15: bytes(32)})


def test_sealing_never_takes_pcr_13_in_host_mode_whatever_the_agents():
    doc = copy.deepcopy(_doc(a1=OLD.to_dict(), a2=NEW.to_dict()))
    doc["accepted"]["v1"]["13"] = {"expected": OLD.value.hex(), "warnOnly": False}
    policy = parse_policy(doc)
    enforced = am.enforce_agent_pcr(policy, THIRD.value)
    assert sealed_pcr_sets(policy) == sealed_pcr_sets(enforced) == {"v1": [4, 9], "v2": [4, 9]}
    assert all(13 not in values for _pcrs_, values in seal_predictions(enforced).values())


def test_the_controller_accepts_the_listed_agents_though_its_own_code_differs():
    """settings_from_args, what every controller action and the atls connection call: the collection's own agent
    measures to neither listed value, and both pass; without agents, only the collection's own."""
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import settings_from_args

    args = {"variant": "qemu-vtpm", "insecure_trust_any_ak": True, "timeout": 10, "attestation_timeout": 30}
    own = am.AgentMeasurement.of("qemu-vtpm").value
    assert own not in (OLD.value, NEW.value)
    listed = settings_from_args(dict(args, measurements=_doc(**{"0.2.0": OLD.to_dict(), "0.3.0": NEW.to_dict()})))
    assert am.matched_agent(listed.policy.match(_pcrs(V1, NEW))[1]) == "0.3.0"
    with pytest.raises(MeasurementsMismatch, match="expected one of 0.2.0="):
        listed.policy.match({**V1, 13: own})
    unlisted = settings_from_args(dict(args, measurements=_doc()))
    assert am.matched_agent(unlisted.policy.match({**V1, 13: own})[1]) == am.OWN_AGENT


def test_the_agent_names_its_own_agent_as_the_policy_in_force_accepts_it():
    """What the Coordinator reports for itself (accepted_measurements' ``agents``)."""
    from types import SimpleNamespace

    from ansible_collections.constellation.cluster.plugins.module_utils.agent.measurement_policy import (
        NOT_ACCEPTED, MeasurementPolicy)

    def own(policy, measurement, mode="host"):
        attestation = SimpleNamespace(policy=policy, measurement=measurement)
        return MeasurementPolicy(SimpleNamespace(deployment_mode=mode), None, attestation, None, None).own_agent()

    listed = parse_policy(_doc(**{"0.2.0": OLD.to_dict(), "0.3.0": NEW.to_dict()}))
    assert own(listed, NEW) == ("0.3.0", NEW.value)
    assert own(listed, THIRD) == (NOT_ACCEPTED, THIRD.value)
    assert own(parse_policy(_doc()), THIRD) == (am.OWN_AGENT, THIRD.value)
    assert own(listed, None) is None
    # The node image's agent extends nothing: it runs no agent on PCR 13, whatever the document lists.
    assert own(listed, NEW, "image") == own(listed, THIRD, "image")[:1] + (NEW.value,) == (am.IMAGE_AGENT, NEW.value)


def test_the_name_reported_for_the_own_agent_is_reserved_in_documents():
    assert RESERVED_AGENT_NAME == am.OWN_AGENT
    with pytest.raises(InputError) as err:
        am.set_agent_entry(_doc(), am.OWN_AGENT, OLD.to_dict())
    assert err.value.field == "name", str(err.value)
