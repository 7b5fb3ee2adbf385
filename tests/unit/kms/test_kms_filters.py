# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kms_uri and derive_key filters, called as Jinja calls them."""

from __future__ import annotations

import base64
import json

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.constellation.cluster.plugins.filter.kms import FilterModule

FILTERS = FilterModule().filters()
kms_uri, derive_key = FILTERS["kms_uri"], FILTERS["derive_key"]

KEY = bytes(range(0x40, 0x60))
SALT = bytes(range(0x60, 0x80))
MEASUREMENT_SECRET_HEX = "4790578891f3fe6cc22cb661ecdc1b7e33121b1287546a52ba33a9136719c213"
EXPECTED_URI = "kms://cluster-kms?key=%s&salt=%s" % (base64.urlsafe_b64encode(KEY).decode(),
                                                     base64.urlsafe_b64encode(SALT).decode())


def b64(raw):
    return base64.b64encode(raw).decode()


def test_kms_uri_from_parts_json_and_mapping():
    doc = {"key": b64(KEY), "salt": b64(SALT)}
    assert kms_uri(b64(KEY), b64(SALT)) == EXPECTED_URI
    assert kms_uri(base64.urlsafe_b64encode(KEY).decode(), b64(SALT)) == EXPECTED_URI
    assert kms_uri(json.dumps(doc)) == EXPECTED_URI
    assert kms_uri(doc) == EXPECTED_URI


def test_derive_key_vector_and_prefix():
    assert derive_key(EXPECTED_URI, "measurementSecret") == MEASUREMENT_SECRET_HEX
    assert derive_key(EXPECTED_URI, "measurementSecret", length=32) == MEASUREMENT_SECRET_HEX
    # the filter adds "key-": passing it again gives another key
    assert derive_key(EXPECTED_URI, "key-measurementSecret") != MEASUREMENT_SECRET_HEX
    assert len(derive_key(EXPECTED_URI, "x", length=82)) == 164
    assert derive_key(EXPECTED_URI, "x", length="16") == derive_key(EXPECTED_URI, "x", 16)


@pytest.mark.parametrize("args,name", [
    ((b64(KEY),), "salt"),
    ((b64(KEY), ""), "salt"),
    ((b64(KEY[:15]), b64(SALT)), "key"),
    ((b64(KEY), "not base64!"), "salt"),
    (("a2V5a2V5a2V5a2V5a2V5a2V5", "c2FsdA"), "salt"),
    ((b64(KEY), b64(b"s" * 600)), "salt"),
    ((json.dumps({"key": b64(KEY)}),), "master_secret.salt"),
    (({"key": b64(KEY), "salt": b64(SALT), "x": 1},), "master_secret"),
])
def test_kms_uri_errors(args, name):
    with pytest.raises(AnsibleFilterError) as err:
        kms_uri(*args)
    assert str(err.value).startswith("kms_uri: %s" % name)
    assert b64(KEY) not in str(err.value)


@pytest.mark.parametrize("uri,key_id,length,name", [
    ("kms://gcp?projectID=p&location=l&keyRing=r&credentialsPath=/c&keyName=k", "x", 32, "kms_uri"),
    ("storage://no-store", "x", 32, "kms_uri"),
    (EXPECTED_URI + "&key=AAAA", "x", 32, "key"),
    (EXPECTED_URI, "", 32, "key_id"),
    (EXPECTED_URI, "x", 0, "length"),
    (EXPECTED_URI, "x", 9000, "length"),
])
def test_derive_key_errors(uri, key_id, length, name):
    with pytest.raises(AnsibleFilterError) as err:
        derive_key(uri, key_id, length)
    assert str(err.value).startswith("derive_key: %s" % name)


def test_coordinator_pub_key_is_the_ed25519_key_of_the_derived_seed():
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    coordinator_pub_key = FILTERS["coordinator_pub_key"]
    seed = bytes.fromhex(derive_key(EXPECTED_URI, "coordinator_signing_key"))
    raw = ed25519.Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert coordinator_pub_key(EXPECTED_URI) == b64(raw)
    with pytest.raises(AnsibleFilterError, match="coordinator_pub_key"):
        coordinator_pub_key("kms://cluster-kms?key=&salt=")
