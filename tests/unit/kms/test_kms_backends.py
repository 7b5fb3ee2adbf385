# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The KMS backend table: a toy backend registered through it alone, the backends that are valid
but not available here, and no error message that ever contains key or salt material."""

from __future__ import annotations

import base64
import hashlib

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError

KEY = bytes(range(1, 33))
SALT = bytes(range(101, 133))


class ToyKMS:
    def __init__(self, seed: str):
        self.seed = seed

    def derive_key(self, key_id: str, length: int = 32) -> bytes:
        return hashlib.sha256((self.seed + key_id).encode()).digest()[:length]


@pytest.fixture
def toy_backend():
    backend = kms.register_backend(kms.Backend("toy", ("seed",), "a test backend",
                                               lambda parsed: ToyKMS(parsed.get("seed"))))
    yield backend
    kms.unregister_backend("toy")


def test_toy_backend_registered_in_the_table_opens_from_its_uri(toy_backend):
    uri = kms.format_kms_uri("toy", seed="abc")
    assert uri == "kms://toy?seed=abc"
    opened = kms.open_kms(uri)
    assert isinstance(opened, kms.KMS)
    assert opened.derive_key("x", 16) == hashlib.sha256(b"abcx").digest()[:16]
    with pytest.raises(ConstellationError, match="seed"):
        kms.open_kms("kms://toy?other=1")


def test_unregistered_toy_is_unknown():
    with pytest.raises(ConstellationError, match="kms_uri backend: expected one of cluster-kms"):
        kms.open_kms("kms://toy?seed=abc")


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
