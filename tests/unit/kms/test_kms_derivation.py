# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""HKDF derivations against Constellation's test vectors (docs/kms.md, "Test vectors") and its case rules."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives import serialization

from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError


def seq(start, end):
    return bytes(range(start, end + 1))


# (name, ikm, salt, info, length, output): docs/kms.md, "Test vectors" says where each comes from
VECTORS = [
    ("HKDFZero", bytes(32), bytes(32), b"key-00000000-0000-0000-0000-000000000000", 32,
     "2b5c829f691bfd4232f8aac464bccc07e605c7c8e82cbca09837e86d0b6d0665"),
    ("HKDF0xFF", b"\xff" * 32, b"\xff" * 32, b"key-ffffffff-ffff-ffff-ffff-ffffffffffff", 32,
     "1484aa39d3415e906e07940ff215d8b1eee705d3027dba93306af4abff4f70be"),
    ("HKDFClusterID", seq(0x00, 0x1f), seq(0x20, 0x3f), b"key-clusterID", 32,
     "128c164378fe8767f998fbdfe4b4d6463ec5ae1b664ea5999bc27417607ae9b6"),
    ("HKDFMeasurementSecret", seq(0x40, 0x5f), seq(0x60, 0x7f), b"key-measurementSecret", 32,
     "4790578891f3fe6cc22cb661ecdc1b7e33121b1287546a52ba33a9136719c213"),
    ("HKDFrfc1", b"\x0b" * 22, seq(0x00, 0x0c), seq(0xf0, 0xf9), 42,
     "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"),
    ("HKDFrfc2", seq(0x00, 0x4f), seq(0x60, 0xaf), seq(0xb0, 0xff), 82,
     "b11e398dc80327a1c8e7f78c596a49344f012eda2d4efad8a050cc4c19afa97c59045a99cac7827271cb41c65e590e"
     "09da3275600c2f09b8367793a9aca3db71cc30c58179ec3e87c14c01d5c1f3434f1d87"),
    ("HKDFrfc3", b"\x0b" * 22, b"", b"", 42,
     "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8"),
]
CHAINED_CLUSTER_ID = "1f3d87784b0ce2d13d608d8455627a238acf5c96a62164cf02b236877e0bb0d9"


@pytest.mark.parametrize("name,ikm,salt,info,length,output", VECTORS, ids=[v[0] for v in VECTORS])
def test_hkdf_vectors(name, ikm, salt, info, length, output):
    assert kms.hkdf_sha256(ikm, salt, info, length).hex() == output


@pytest.mark.parametrize("name,ikm,salt,info,length,output", VECTORS[:2] + VECTORS[3:4],
                         ids=["HKDFZero", "HKDF0xFF", "HKDFMeasurementSecret"])
def test_cluster_kms_derive_key_adds_prefix(name, ikm, salt, info, length, output):
    cluster = kms.ClusterKMS(kms.MasterSecret(ikm, salt))
    key_id = info.decode()[len(kms.DEK_PREFIX):]
    assert cluster.derive_key(key_id, length).hex() == output
    # GetDEK takes the info verbatim (the KeyService adds the prefix, not the KMS)
    assert cluster.get_dek(info.decode(), length).hex() == output
    assert cluster.get_dek(key_id, length).hex() != output


def test_disk_uuid_vectors_through_state_disk_key():
    zero = kms.ClusterKMS(kms.MasterSecret(bytes(32), bytes(32)))
    ff = kms.ClusterKMS(kms.MasterSecret(b"\xff" * 32, b"\xff" * 32))
    assert zero.state_disk_key("00000000-0000-0000-0000-000000000000").hex() == VECTORS[0][5]
    assert ff.state_disk_key("ffffffff-ffff-ffff-ffff-ffffffffffff").hex() == VECTORS[1][5]


def test_disk_uuid_is_lower_cased_but_dek_id_is_case_sensitive():
    ff = kms.ClusterKMS(kms.MasterSecret(b"\xff" * 32, b"\xff" * 32))
    upper = "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF"
    # initserver lower-cases the UUID: same key for both spellings
    assert ff.state_disk_key(upper).hex() == VECTORS[1][5]
    # the KMS itself is case-sensitive: upper-case dek ID gives another key
    assert ff.derive_key(upper).hex() != VECTORS[1][5]
    assert ff.get_dek("key-" + upper).hex() != VECTORS[1][5]


def test_measurement_secret_and_cluster_id():
    cluster = kms.ClusterKMS(kms.MasterSecret(seq(0x40, 0x5f), seq(0x60, 0x7f)))
    assert cluster.measurement_secret().hex() == VECTORS[3][5]
    assert cluster.cluster_id(seq(0x20, 0x3f)).hex() == CHAINED_CLUSTER_ID


def test_derive_cluster_id_vector():
    assert kms.derive_cluster_id(seq(0x00, 0x1f), seq(0x20, 0x3f)).hex() == VECTORS[2][5]


def test_emergency_ssh_ca_is_hkdf_of_its_key_id():
    secret = kms.MasterSecret(seq(0x40, 0x5f), seq(0x60, 0x7f))
    cluster = kms.ClusterKMS(secret)
    seed = cluster.emergency_ssh_ca_seed()
    assert seed == kms.hkdf_sha256(secret.key, secret.salt, b"key-ca_emergency_ssh", 32)
    raw = cluster.emergency_ssh_ca_priv_key().private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    assert raw == seed


def test_empty_salt_refused():
    # RFC case 3 has an empty salt: HKDF allows it, the cluster KMS must not (cluster.New)
    with pytest.raises(InputError) as err:
        kms.MasterSecret(b"\x0b" * 22, b"")
    assert err.value.field == "salt"


@pytest.mark.parametrize("length", [0, 1, 15])
def test_short_master_secret_refused(length):
    with pytest.raises(InputError) as err:
        kms.MasterSecret(b"\x01" * length, b"\x02" * 32)
    assert err.value.field == "key"
    assert "16" in str(err.value)


def test_sixteen_byte_master_secret_accepted():
    assert len(kms.ClusterKMS(kms.MasterSecret(b"\x01" * 16, b"\x02")).derive_key("x")) == 32


@pytest.mark.parametrize("key,salt,field", [
    (b"\x01" * 513, b"s", "key"),
    (b"\x01" * 32, b"s" * 513, "salt"),
    ("not bytes" * 4, b"s", "key"),
])
def test_master_secret_bounds(key, salt, field):
    with pytest.raises(InputError) as err:
        kms.MasterSecret(key, salt)
    assert err.value.field == field


@pytest.mark.parametrize("key_id,length,field", [
    ("", 32, "key_id"),
    ("x" * 257, 32, "key_id"),
    ("a\nb", 32, "key_id"),
    (5, 32, "key_id"),
    ("ok", 0, "length"),
    ("ok", 8161, "length"),
    ("ok", True, "length"),
    ("ok", "32", "length"),
])
def test_derive_key_bad_input(key_id, length, field):
    cluster = kms.ClusterKMS(kms.MasterSecret(bytes(32), bytes(32)))
    with pytest.raises(InputError) as err:
        cluster.derive_key(key_id, length)
    assert err.value.field == field


@pytest.mark.parametrize("uuid", ["", "not-a-uuid", "00000000000000000000000000000000",
                                  "00000000-0000-0000-0000-00000000000g", "../../etc/passwd"])
def test_bad_disk_uuid(uuid):
    cluster = kms.ClusterKMS(kms.MasterSecret(bytes(32), bytes(32)))
    with pytest.raises(InputError) as err:
        cluster.state_disk_key(uuid)
    assert err.value.field == "disk_uuid"


def test_secrets_not_in_repr_or_errors():
    secret = kms.MasterSecret(b"\xab" * 32, b"\xcd" * 32)
    text = repr(secret) + repr(kms.ClusterKMS(secret)) + repr(kms.parse_uri(secret.to_uri()))
    assert "abab" not in text and "q6ur" not in text and "zc3N" not in text
    with pytest.raises(InputError) as err:
        kms.MasterSecret(b"\xab" * 8, b"\xcd" * 32)
    assert "\\xab" not in str(err.value)
