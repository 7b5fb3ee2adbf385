# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""constellation-mastersecret.json and atomic secret files."""

from __future__ import annotations

import json
import os
import stat

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError


def test_json_format_is_constellations():
    secret = kms.MasterSecret(b"\xfb\xff" * 16, b"\xfe" * 32)
    doc = json.loads(secret.to_json())
    # Go encoding/json writes []byte as standard base64 with padding
    assert doc == {"key": "+//7//v/" * 5 + "+/8=", "salt": "/v7+" * 10 + "/v4="}
    assert kms.MasterSecret.from_json(json.dumps(doc)) == secret


def test_generate_lengths_and_freshness():
    one, two = kms.MasterSecret.generate(), kms.MasterSecret.generate()
    assert len(one.key) == 32 and len(one.salt) == 32
    assert one != two


@pytest.mark.parametrize("text,field", [
    ("", "master_secret"),
    ("not json", "master_secret"),
    ("[]", "master_secret"),
    ('{"key": "AAAAAAAAAAAAAAAAAAAAAA=="}', "master_secret.salt"),
    ('{"key": "AAAAAAAAAAAAAAAAAAAAAA==", "salt": ""}', "master_secret.salt"),
    ('{"key": "AAAA", "salt": "AAAA"}', "master_secret.key"),
    ('{"key": "AAAAAAAAAAAAAAAAAAAAAA==", "salt": "A!AA"}', "master_secret.salt"),
    ('{"key": "AAAAAAAAAAAAAAAAAAAAAA==", "salt": 5}', "master_secret.salt"),
    ('{"key": "AAAAAAAAAAAAAAAAAAAAAA==", "salt": "AAAA", "extra": 1}', "master_secret"),
    ('{"key": "%s", "salt": "AAAA"}' % ("A" * 5000), "master_secret.key"),
    ("x" * 20000, "master_secret"),
])
def test_bad_json(text, field):
    with pytest.raises(InputError) as err:
        kms.MasterSecret.from_json(text)
    assert err.value.field == field


def test_bad_json_does_not_echo_secret():
    text = '{"key": "c2VjcmV0c2VjcmV0c2VjcmV0", "salt": "AAAA",}'
    with pytest.raises(InputError) as err:
        kms.MasterSecret.from_json(text)
    assert "c2VjcmV0" not in str(err.value)


def test_from_file(tmp_path):
    path = tmp_path / kms.MASTER_SECRET_FILE_NAME
    secret = kms.MasterSecret.generate()
    path.write_text(secret.to_json())
    assert kms.MasterSecret.from_file(str(path)) == secret
    with pytest.raises(InputError) as err:
        kms.MasterSecret.from_file(str(tmp_path / "missing.json"))
    assert err.value.field == "master_secret_path"


def test_write_secret_file_atomic_mode_and_state(tmp_path):
    path = str(tmp_path / "k")
    assert kms.secret_file_state(path, b"abc") == {"path": path, "exists": False}
    kms.write_secret_file(path, b"abc")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    state = kms.secret_file_state(path, b"abc")
    assert state["content_matches"] and state["mode_matches"] and state["size"] == 3
    assert "abc" not in repr(state)
    assert not kms.secret_file_state(path, b"abd")["content_matches"]
    os.chmod(path, 0o644)
    assert not kms.secret_file_state(path, b"abc")["mode_matches"]
    kms.write_secret_file(path, b"xyz")
    assert open(path, "rb").read() == b"xyz" and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.listdir(str(tmp_path)) == ["k"]


def test_write_secret_file_failure_keeps_old(tmp_path):
    path = str(tmp_path / "k")
    kms.write_secret_file(path, b"old")
    with pytest.raises(TypeError):
        kms.write_secret_file(path, "not bytes")
    assert open(path, "rb").read() == b"old"
    assert os.listdir(str(tmp_path)) == ["k"]


def test_secret_file_state_refuses_non_regular(tmp_path):
    os.symlink("/etc/passwd", str(tmp_path / "link"))
    with pytest.raises(InputError) as err:
        kms.secret_file_state(str(tmp_path / "link"), b"x")
    assert err.value.field == "dest"


def test_write_secret_file_exclusive_never_replaces(tmp_path):
    path = str(tmp_path / "ms.json")
    assert kms.write_secret_file(path, b"first", exclusive=True) is True
    assert kms.write_secret_file(path, b"second", exclusive=True) is False
    assert open(path, "rb").read() == b"first"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.listdir(str(tmp_path)) == ["ms.json"]
