# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The KMS backend table: the backends that are valid but not available here, and no error message that
ever contains key or salt material (a toy backend registered through the table alone: test_kms_toy_backend.py)."""

from __future__ import annotations

import base64

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError

KEY = bytes(range(1, 33))
SALT = bytes(range(101, 133))


@pytest.mark.parametrize("uri", [
    kms.format_kms_uri("aws", region="eu-west-1", accessKeyID="AKIA0", accessKey="s3cret", keyName="k"),
    kms.format_kms_uri("gcp", projectID="p", location="l", keyRing="r", credentialsPath="/c.json", keyName="k"),
    kms.format_kms_uri("azure", tenantID="t", clientID="c", clientSecret="s", vaultName="v",
                       vaultType="vault.azure.net", keyName="k"),
])
def test_known_cloud_backends_are_valid_but_not_available_here(uri):
    with pytest.raises(kms.KMSBackendUnavailable, match="is valid but not available on this controller"):
        kms.open_kms(uri)
    assert kms.BACKENDS[kms.parse_uri(uri).backend].open is None


def test_the_cluster_kms_implements_the_protocol():
    opened = kms.open_kms(kms.MasterSecret(KEY, SALT).to_uri())
    assert isinstance(opened, kms.KMS) and isinstance(opened, kms.ClusterKMS)


def _forbidden():
    """Every spelling of the key and salt, and each of their 8-character pieces."""
    spellings = set()
    for raw in (KEY, SALT):
        for text in (base64.urlsafe_b64encode(raw).decode(), base64.b64encode(raw).decode(), raw.hex()):
            spellings |= {text[i:i + 8] for i in range(0, len(text) - 7)}
    return spellings


GOOD_KEY = base64.urlsafe_b64encode(KEY).decode()
GOOD_SALT = base64.urlsafe_b64encode(SALT).decode()
BAD_URIS = [
    "kms:/cluster-kms?key=%s&salt=%s" % (GOOD_KEY, GOOD_SALT),        # one slash
    "kms//cluster-kms?key=%s&salt=%s" % (GOOD_KEY, GOOD_SALT),        # no colon
    "%s://cluster-kms?salt=%s" % (GOOD_KEY, GOOD_SALT),               # the key as the scheme
    "kms://cluster-kms&key=%s&salt=%s" % (GOOD_KEY, GOOD_SALT),       # '&' instead of '?'
    "kms://%s?key=%s" % (GOOD_KEY, GOOD_SALT),                        # the key as the backend
    "kms://cluster-kms/%s?key=%s&salt=%s" % (GOOD_KEY, GOOD_KEY, GOOD_SALT),  # a path
    "kms://cluster-kms?kez=%s&salt=%s" % (GOOD_KEY, GOOD_SALT),       # a bad parameter name
    "kms://cluster-kms?%s=%s&salt=%s" % (GOOD_KEY, GOOD_KEY, GOOD_SALT),  # the key as a name
    "kms://cluster-kms?%s&salt=%s" % (GOOD_KEY, GOOD_SALT),           # no '='
    "kms://cluster-kms?key=%s&key=%s&salt=%s" % (GOOD_KEY, GOOD_KEY, GOOD_SALT),  # repeated
    "kms://cluster-kms?key=%s&salt=%s&x=1" % (GOOD_KEY, GOOD_SALT),   # unknown extra
    "kms://cluster-kms?key=%s" % GOOD_KEY,                            # missing salt
    "kms://cluster-kms?key=%s!&salt=%s" % (GOOD_KEY, GOOD_SALT),      # bad base64 alphabet
    "kms://cluster-kms?key=%s&salt=%s" % (GOOD_KEY.rstrip("="), GOOD_SALT),  # bad padding
    "kms://cluster-kms?key=%s&salt=%s" % (base64.urlsafe_b64encode(KEY[:8]).decode(), GOOD_SALT),  # too short
    "kms://cluster-kms?key=%s%%zz&salt=%s" % (GOOD_KEY, GOOD_SALT),   # bad escape
    "kms://cluster-kms?key=%s&salt=%s#frag" % (GOOD_KEY, GOOD_SALT),  # fragment
    "kms://user:%s@cluster-kms?key=%s&salt=%s" % (GOOD_KEY, GOOD_KEY, GOOD_SALT),  # user info
    "storage://no-store?key=%s" % GOOD_KEY,                          # storage with parameters
    "kms://cluster-kms?key=%s &salt=%s" % (GOOD_KEY, GOOD_SALT),      # a space
    "kms://aws?region=%s&accessKeyID=a&accessKey=%s&keyName=k" % ("a" * 3000, GOOD_KEY),  # too long
]


@pytest.mark.parametrize("uri", BAD_URIS)
def test_no_kms_uri_error_contains_key_material(uri):
    with pytest.raises(ConstellationError) as err:
        kms.open_kms(uri)
    message = str(err.value)
    leaked = sorted(piece for piece in _forbidden() if piece in message)
    assert not leaked, "%r leaks %s" % (message, leaked[:3])
    assert message.split(":", maxsplit=1)[0]  # still names the field


def test_master_secret_file_errors_contain_no_key_material():
    key_b64, salt_b64 = base64.b64encode(KEY).decode(), base64.b64encode(SALT).decode()
    doc = '{"key": "%s", "salt": "%s", "%s": 1}' % (key_b64, salt_b64, key_b64)
    with pytest.raises(ConstellationError) as err:
        kms.MasterSecret.from_json(doc)
    assert not [p for p in _forbidden() if p in str(err.value)]
    with pytest.raises(ConstellationError) as err:
        kms.MasterSecret.from_json('{"key": "%s!", "salt": "x"}' % base64.b64encode(KEY).decode())
    assert not [p for p in _forbidden() if p in str(err.value)]
