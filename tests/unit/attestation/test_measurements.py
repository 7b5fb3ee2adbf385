# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Measurements policy: Constellation's JSON shape, legacy values, comparison, bad input."""

from __future__ import annotations

import json

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    Measurement,
    Measurements,
    MeasurementsMismatch,
    expected_pcr15,
)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError

PCR4 = "5198fd549fc9f44a49168b788f58e366af624866647dbe7e917388a0b1673c1d"
ZERO = "00" * 32


def test_json_round_trip(tmp_path):
    text = json.dumps({"4": {"expected": PCR4, "warnOnly": False}, "14": {"expected": ZERO, "warnOnly": True}})
    policy = Measurements.loads(text)
    assert policy.pcrs[4] == Measurement(bytes.fromhex(PCR4), False)
    assert policy.pcrs[14].warn_only
    path = tmp_path / "measurements.json"
    policy.save(str(path))
    assert json.loads(path.read_text()) == json.loads(text)
    assert Measurements.load(str(path)) == policy
    assert list(json.loads(path.read_text())) == ["4", "14"]  # ascending PCR order
    assert [p.name for p in tmp_path.iterdir()] == ["measurements.json"]  # no temp file left


def test_legacy_bare_hex_is_enforced():
    policy = Measurements.from_dict({"15": ZERO, "4": PCR4.upper()})
    assert policy.pcrs[15] == Measurement(bytes(32), False)
    assert policy.pcrs[4].expected.hex() == PCR4


@pytest.mark.parametrize("data, field, expected", [
    ({"4": {"expected": "zz" * 32}}, "measurements[4].expected", "hex"),
    ({"4": {"expected": "ab" * 31}}, "measurements[4].expected", "32 or 48 bytes"),
    ({"9": "UZj9VJ/J9EpJFot4j1jjZq9iSGZkfb5+kXOIoLFnPB0="}, "measurements[9]", "hex"),
    ({"24": ZERO}, "measurements", "PCR index in 0..23"),
    ({"-1": ZERO}, "measurements", "PCR index in 0..23"),
    ({"four": ZERO}, "measurements", "PCR index in 0..23"),
    ({"4": {"expected": ZERO, "warnOnly": "yes"}}, "measurements[4].warnOnly", "a boolean"),
    ({"4": {"warnOnly": True}}, "measurements[4].expected", "a hex string"),
    ({"4": {"expected": ZERO, "enforce": True}}, "measurements[4]", "only the keys"),
    ({"4": 7}, "measurements[4]", "a hex string"),
    ({"4": ZERO, "5": "00" * 48}, "measurements", "equal length"),
])
def test_bad_values_name_the_field(data, field, expected):
    with pytest.raises(InputError) as err:
        Measurements.from_dict(data)
    assert err.value.field == field
    assert expected in str(err.value)


def test_bad_json_and_shape():
    with pytest.raises(InputError, match="valid JSON"):
        Measurements.loads("{")
    with pytest.raises(InputError, match="mapping"):
        Measurements.loads("[]")


def test_compare_enforced_and_warn_only():
    policy = Measurements.from_dict({"4": PCR4, "14": {"expected": ZERO, "warnOnly": True}})
    good = {4: bytes.fromhex(PCR4), 14: bytes(32)}
    checks, warnings = policy.compare(good)
    assert [(c.index, c.ok) for c in checks] == [(4, True), (14, True)] and warnings == []
    checks, warnings = policy.compare({4: bytes.fromhex(PCR4), 14: b"\x01" * 32})
    assert warnings == ["PCR 14: expected %s, found %s (warn-only)" % (ZERO, "01" * 32)]
    assert not checks[1].ok and checks[1].warn_only
    with pytest.raises(MeasurementsMismatch) as err:
        policy.compare({4: b"\x02" * 32, 14: bytes(32)})
    assert "PCR 4: expected %s, found %s" % (PCR4, "02" * 32) in str(err.value)
    assert [c.ok for c in err.value.checks] == [False, True]
    with pytest.raises(MeasurementsMismatch, match="PCR 4: expected .*, found nothing"):
        policy.compare({14: bytes(32)})


def test_pcr15_vector_from_spec():
    cluster_id = bytes.fromhex("128c164378fe8767f998fbdfe4b4d6463ec5ae1b664ea5999bc27417607ae9b6")
    assert expected_pcr15(cluster_id).hex() == "23400370357e846478cce7cc0c76cdfe4da077cc57b36dee0f665ede2c8b3f2f"
