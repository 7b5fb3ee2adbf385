# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""kms:// and storage:// URIs (docs/kms.md, "The KMS URI"): Constellation's forms, and what a strict parser refuses."""

from __future__ import annotations

import base64
import string

import pytest
from hypothesis import given, settings, strategies as st

from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError

GOOD_KEY = base64.urlsafe_b64encode(b"k" * 32).decode()
GOOD_SALT = base64.urlsafe_b64encode(b"s" * 32).decode()
GOOD = "kms://cluster-kms?key=%s&salt=%s" % (GOOD_KEY, GOOD_SALT)

AZURE = dict(tenantID="tenant", clientID="client", clientSecret="s3cr3t~.x", vaultName="vault",
             vaultType="vault.azure.net", keyName="kek")
AWS = dict(region="eu-central-1", accessKeyID="AKIAEXAMPLE", accessKey="abc/def+ghi", keyName="kek")
GCP = dict(projectID="proj-1", location="europe-west3", keyRing="ring", credentialsPath="/etc/gcp sa.json",
           keyName="kek")


def test_constellation_example_parses():
    # Constellation's unit-test input Key="key", Salt="salt" (docs/kms.md, "The KMS URI"; below our 16-byte minimum for keys)
    parsed = kms.parse_uri("kms://cluster-kms?key=a2V5&salt=c2FsdA==")
    assert parsed.scheme == "kms" and parsed.backend == "cluster-kms"
    assert dict(parsed.params) == {"key": "a2V5", "salt": "c2FsdA=="}


def test_cluster_kms_uri_exact_form():
    secret = kms.MasterSecret(b"0123456789abcdef", b"salt")
    assert secret.to_uri() == "kms://cluster-kms?key=MDEyMzQ1Njc4OWFiY2RlZg==&salt=c2FsdA=="
    assert kms.MasterSecret.from_uri(secret.to_uri()) == secret


def test_url_safe_alphabet_used():
    secret = kms.MasterSecret(b"\xfb\xff" * 8, b"\xfe\xff")
    uri = secret.to_uri()
    assert "-" in uri and "_" in uri and "+" not in uri and "/" not in uri.split("?", 1)[1]
    assert kms.MasterSecret.from_uri(uri) == secret


@pytest.mark.parametrize("backend,params", [("aws", AWS), ("azure", AZURE), ("gcp", GCP)])
def test_external_kms_round_trip_and_unavailable(backend, params):
    uri = kms.format_kms_uri(backend, **params)
    assert uri.startswith("kms://%s?%s=" % (backend, kms.BACKENDS[backend].params[0]))
    parsed = kms.parse_kms_uri(uri)
    assert dict(parsed.params) == params
    with pytest.raises(kms.KMSBackendUnavailable, match="not available on this controller"):
        kms.open_kms(uri)


def test_constellation_azure_encoding_parses():
    # Constellation's encoder escapes once with QueryEscape; its parser unescapes twice.
    uri = ("kms://azure?tenantID=t&clientID=c&clientSecret=a%26b%3Dc&vaultName=v"
           "&vaultType=managedhsm.azure.net&keyName=k")
    assert kms.parse_uri(uri).get("clientSecret") == "a&b=c"


@pytest.mark.parametrize("uri,params", [
    (kms.NO_STORE_URI, {}),
    (None, dict(bucket="b", region="us-east-2", accessKeyID="id", accessKey="k+/=")),
    (None, dict(account="acc", container="c", tenantID="t", clientID="c", clientSecret="x&y")),
    (None, dict(projectID="p", bucket="b", credentialsPath="/c.json")),
])
def test_storage_uris(uri, params):
    backend = {0: "no-store", 4: "aws", 5: "azure", 3: "gcp"}[len(params)]
    formatted = kms.format_storage_uri(backend, **params)
    if uri:
        assert formatted == uri
    parsed = kms.parse_storage_uri(formatted)
    assert dict(parsed.params) == params and parsed.backend == backend
    assert parsed.to_uri() == formatted


def test_open_kms_cluster():
    cluster = kms.open_kms(GOOD)
    assert cluster.master_secret.key == b"k" * 32


@pytest.mark.parametrize("uri,field", [
    ("http://cluster-kms?key=%s&salt=%s" % (GOOD_KEY, GOOD_SALT), "uri scheme"),
    ("cluster-kms?key=a", "uri scheme"),
    ("", "uri"),
    ("kms://vault?key=a", "uri backend"),
    ("kms://terraform?key=a", "uri backend"),
    ("kms://admin@cluster-kms?key=%s&salt=%s" % (GOOD_KEY, GOOD_SALT), "uri backend"),
    ("kms://cluster-kms:443?key=%s&salt=%s" % (GOOD_KEY, GOOD_SALT), "uri backend"),
    ("storage://cluster-kms?key=a", "uri backend"),
    ("kms://cluster-kms", "key"),
    ("kms://cluster-kms?salt=%s" % GOOD_SALT, "key"),
    ("kms://cluster-kms?key=%s" % GOOD_KEY, "salt"),
    ("kms://cluster-kms?key=&salt=%s" % GOOD_SALT, "key"),
    ("kms://cluster-kms?key=%s&salt=" % GOOD_KEY, "salt"),
    # query injection
    ("kms://cluster-kms?key=%s&key=%s&salt=%s" % (GOOD_KEY, GOOD_KEY, GOOD_SALT), "key"),
    ("kms://cluster-kms?key=%s&salt=%s&salt=%s" % (GOOD_KEY, GOOD_SALT, GOOD_SALT), "salt"),
    ("kms://cluster-kms?key=%s%%26salt%%3D%s&salt=%s" % (GOOD_KEY, GOOD_SALT, GOOD_SALT), "key"),
    ("kms://cluster-kms?key=%s%%2526salt%%253D%s" % (GOOD_KEY, GOOD_SALT), "key"),
    ("kms://cluster-kms?key=%s&salt=%s&masterSecret=x" % (GOOD_KEY, GOOD_SALT), "masterSecret"),
    ("kms://cluster-kms?key=%s;salt=%s" % (GOOD_KEY, GOOD_SALT), "key"),
    ("kms://cluster-kms?key=%s&&salt=%s" % (GOOD_KEY, GOOD_SALT), "uri query"),
    ("kms://cluster-kms?key=%s#salt=%s" % (GOOD_KEY, GOOD_SALT), "uri fragment"),
    ("kms://cluster-kms/path?key=%s&salt=%s" % (GOOD_KEY, GOOD_SALT), "uri path"),
    ("kms://cluster-kms?key=%s&salt=%s x" % (GOOD_KEY, GOOD_SALT), "uri"),
    # bad base64
    ("kms://cluster-kms?key=a2V5a2V5a2V5a2V5a2V5a2V5&salt=c2FsdA", "salt"),
    ("kms://cluster-kms?key=a2V5a2V5a2V5a2V5a2V5a2V5&salt=c2F*dA==", "salt"),
    ("kms://cluster-kms?key=a2V5+2V5a2V5a2V5a2V5a2V5&salt=c2FsdA==", "key"),
    ("kms://cluster-kms?key=a2V5/2V5a2V5a2V5a2V5a2V5&salt=c2FsdA==", "key"),
    ("kms://cluster-kms?key=a2V5a2V5a2V5a2V5a2V5a2V5&salt=c2FsdB==", "salt"),
    ("kms://cluster-kms?key=a2V5a2V5a2V5a2V5a2V5a2V5&salt=%ZZ", "salt"),
    # decodes fine, but too short a master secret
    ("kms://cluster-kms?key=a2V5&salt=c2FsdA==", "key"),
    # over-long
    ("kms://cluster-kms?key=%s&salt=%s" % ("A" * 3000, GOOD_SALT), "key"),
    ("kms://cluster-kms?key=%s&salt=%s" % (GOOD_KEY, "A" * 9000), "uri"),
    ("kms://cluster-kms?key=%s&salt=%s" % (base64.urlsafe_b64encode(b"k" * 600).decode(), GOOD_SALT), "key"),
])
def test_bad_cluster_kms_uris(uri, field):
    with pytest.raises(InputError) as err:
        kms.open_kms(uri, field="uri")
    assert err.value.field == field
    assert field in str(err.value)
    # secret values are never echoed
    assert GOOD_KEY not in str(err.value) and GOOD_SALT not in str(err.value)


@pytest.mark.parametrize("backend,params,bad,field", [
    ("azure", AZURE, dict(vaultType="vault.evil.example"), "vaultType"),
    ("azure", AZURE, dict(vaultName="v&keyName=evil"), "vaultName"),
    ("azure", AZURE, dict(tenantID="t?x=y"), "tenantID"),
    ("azure", AZURE, dict(clientSecret=""), "clientSecret"),
    ("azure", AZURE, dict(clientSecret="x\ny"), "clientSecret"),
    ("aws", AWS, dict(region="eu central"), "region"),
    ("aws", AWS, dict(keyName="k" * 3000), "keyName"),
    ("gcp", GCP, dict(keyRing="r#frag"), "keyRing"),
    ("gcp", GCP, dict(extra="1"), "extra"),
])
def test_bad_external_params_on_format(backend, params, bad, field):
    with pytest.raises(InputError) as err:
        kms.format_kms_uri(backend, **dict(params, **bad))
    assert err.value.field == field


@pytest.mark.parametrize("backend,params,missing", [
    ("azure", AZURE, "vaultType"), ("aws", AWS, "accessKey"), ("gcp", GCP, "credentialsPath"),
])
def test_missing_external_param_on_parse(backend, params, missing):
    uri = kms.format_kms_uri(backend, **params)
    pieces = [p for p in uri.split("?", 1)[1].split("&") if not p.startswith(missing + "=")]
    with pytest.raises(InputError) as err:
        kms.parse_uri("kms://%s?%s" % (backend, "&".join(pieces)))
    assert err.value.field == missing


def test_smuggled_parameter_in_identifier_refused_on_parse():
    uri = kms.format_kms_uri("azure", **AZURE).replace("vaultName=vault", "vaultName=vault%26keyName%3Devil")
    with pytest.raises(InputError) as err:
        kms.parse_uri(uri)
    assert err.value.field == "vaultName"


def test_wrong_scheme_for_purpose():
    with pytest.raises(InputError) as err:
        kms.parse_kms_uri(kms.NO_STORE_URI)
    assert err.value.field == "kms_uri"
    with pytest.raises(InputError) as err:
        kms.parse_storage_uri(GOOD)
    assert err.value.field == "storage_uri"
    with pytest.raises(InputError):
        kms.parse_uri("storage://no-store?x=1")


@settings(max_examples=150, deadline=None)
@given(key=st.binary(min_size=16, max_size=512), salt=st.binary(min_size=1, max_size=512))
def test_cluster_kms_round_trip(key, salt):
    secret = kms.MasterSecret(key, salt)
    uri = secret.to_uri()
    assert kms.MasterSecret.from_uri(uri) == secret
    assert kms.MasterSecret.from_json(secret.to_json()) == secret
    assert kms.parse_uri(uri).to_uri() == uri


_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp", "Zs", "Cf", "Co", "Cn")),
                min_size=1, max_size=200)


@settings(max_examples=150, deadline=None)
@given(secret=_TEXT | st.text(alphabet=string.printable.strip() + "%+&=#?", min_size=1, max_size=64),
       name=st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,40}\Z"))
def test_azure_round_trip(secret, name):
    params = dict(AZURE)
    params.update(clientSecret=secret, keyName=name)
    uri = kms.format_kms_uri("azure", **params)
    assert dict(kms.parse_uri(uri).params) == params
