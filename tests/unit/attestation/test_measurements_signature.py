# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The measurements_signature module: signs in cosign's form (idempotent), verifies, and refuses an
altered file or another key, naming the file; the init_secret_hash filter never echoes the secret."""

from __future__ import annotations

import base64
import json

import pytest
from ansible.errors import AnsibleFilterError
from ansible.module_utils.testing import patch_module_args
from cryptography.hazmat.primitives import serialization

from ansible_collections.constellation.cluster.plugins.filter.init_secret import init_secret_hash
from ansible_collections.constellation.cluster.plugins.modules import measurements_signature
from ansible_collections.constellation.cluster.tests.support.keys import measurements_key


def run_module(capsys, args):
    with patch_module_args(args), pytest.raises(SystemExit):
        measurements_signature.main()
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def files(tmp_path):
    pub = tmp_path / "measurements.pub"
    key = measurements_key(pub)
    priv = tmp_path / "measurements.key"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    policy = tmp_path / "measurements.json"
    policy.write_text('{"9": {"expected": "%s", "warnOnly": false}}\n' % ("12" * 32))
    return priv, pub, policy


def test_sign_is_idempotent_and_verify_passes(capsys, files):
    priv, pub, policy = files
    first = run_module(capsys, {"path": str(policy), "state": "signed", "priv_key_file": str(priv),
                                "pub_key_file": str(pub)})
    assert first["changed"] and first["verified"]
    assert base64.b64decode(first["signature"])[0] == 0x30  # ASN.1 DER SEQUENCE
    again = run_module(capsys, {"path": str(policy), "state": "signed", "priv_key_file": str(priv)})
    assert not again["changed"] and again["signature"] == first["signature"]
    checked = run_module(capsys, {"path": str(policy), "pub_key_file": str(pub)})
    assert checked["verified"] and not checked["changed"]


def test_verify_refuses_an_altered_file_and_signing_refuses_another_key(capsys, files, tmp_path):
    priv, pub, policy = files
    run_module(capsys, {"path": str(policy), "state": "signed", "priv_key_file": str(priv)})
    policy.write_text(policy.read_text().replace("12", "13", 1))
    out = run_module(capsys, {"path": str(policy), "pub_key_file": str(pub)})
    assert out["failed"] and str(policy) in out["msg"] and "does not verify" in out["msg"]
    other = tmp_path / "other.pub"
    measurements_key(other)  # another key's
    out = run_module(capsys, {"path": str(policy), "state": "signed", "priv_key_file": str(priv),
                              "pub_key_file": str(other)})
    assert out["failed"] and "not the one pub_key_file pins" in out["msg"]
    assert "PRIVATE" not in out["msg"]


def test_init_secret_hash_filter_never_echoes_the_secret():
    secret = base64.b64encode(b"s" * 32).decode()
    assert len(init_secret_hash(secret, "10.42.0.11")) == 64
    with pytest.raises(AnsibleFilterError) as err:
        init_secret_hash(secret[:-4], "10.42.0.11")
    assert secret[:-4] not in str(err.value)
    with pytest.raises(AnsibleFilterError, match="public_ip"):
        init_secret_hash(secret, "not-an-ip")
