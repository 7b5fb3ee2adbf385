"""Bad input is refused with an InputError that names the field; secrets are never echoed."""

from __future__ import annotations

import re

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils import kubeadm

TOKEN = "abcdef.0123456789abcdef"
CA_HASH = "sha256:" + "ab" * 32


def _init(**overrides):
    values = dict(kubernetes_version="v1.31.1", node_name="control-plane-0", node_vpn_ip="10.118.0.1")
    values.update(overrides)
    return kubeadm.InitParams(**values)


def _join(**overrides):
    values = dict(api_server_endpoint="10.118.0.1:6443", token=TOKEN, ca_cert_hash=CA_HASH, node_name="worker-0",
                  node_vpn_ip="10.118.0.11")
    values.update(overrides)
    return kubeadm.JoinParams(**values)


@pytest.mark.parametrize("field, value", [
    ("kubernetes_version", "1.31.1"),
    ("kubernetes_version", "v1.31"),
    ("kubernetes_version", "v1.31.1-rc.0"),
    ("kubernetes_version", "latest"),
    ("service_cidr", "10.96.0.1/12"),
    ("service_cidr", "10.96.0.0/33"),
    ("pod_cidr", "not-a-cidr"),
    ("node_name", "Control_Plane_0"),
    ("node_name", "-leading-dash"),
    ("node_name", "a" * 254),
    ("node_vpn_ip", "10.118.0.300"),
    ("node_vpn_ip", "vpn.example.com"),
    ("cluster_name", "Constellation!"),
    ("control_plane_endpoint", "10.0.0.1:99999"),
    ("apiserver_cert_sans", ["ok.example.com", "bad_name"]),
    ("token", "ABCDEF.0123456789abcdef"),
    ("token", "abcdef:0123456789abcdef"),
    ("token_ttl", "15 minutes"),
    ("certificate_key", "xyz"),
    ("api_version", "v1beta2"),
    ("kubernetes_dir", "relative/dir"),
])
def test_init_bad_input_names_field(field, value):
    with pytest.raises(kubeadm.InputError) as err:
        _init(**{field: value})
    assert err.value.field == field
    assert str(err.value).startswith(field + ":")


@pytest.mark.parametrize("field, value", [
    ("api_server_endpoint", "10.118.0.1"),
    ("api_server_endpoint", "10.118.0.1:0"),
    ("token", "abcdef.0123456789abcde"),
    ("ca_cert_hash", "sha256:" + "ab" * 31),
    ("ca_cert_hash", "md5:" + "ab" * 32),
    ("ca_cert_hash", "AB" * 32),
    ("node_name", "Worker.0"),
    ("node_vpn_ip", "10.118.0"),
])
def test_join_bad_input_names_field(field, value):
    with pytest.raises(kubeadm.InputError) as err:
        _join(**{field: value})
    assert err.value.field == field


@pytest.mark.parametrize("missing", [None, ""])
def test_join_without_ca_hash_says_verification_cannot_be_skipped(missing):
    with pytest.raises(kubeadm.InputError) as err:
        _join(ca_cert_hash=missing)
    assert err.value.field == "ca_cert_hash"
    assert "no way to skip CA verification" in str(err.value)


def test_certificate_key_only_for_control_planes():
    with pytest.raises(kubeadm.InputError) as err:
        _join(certificate_key="ab" * 32)
    assert err.value.field == "certificate_key"


def test_secret_values_are_not_echoed_in_errors():
    almost = "abcdef.0123456789ABCDEF"
    with pytest.raises(kubeadm.InputError) as err:
        _join(token=almost)
    assert almost not in str(err.value)
    with pytest.raises(kubeadm.InputError) as err:
        _init(certificate_key="secret-but-not-hex")
    assert "secret-but-not-hex" not in str(err.value)


@pytest.mark.parametrize("endpoint, normalised", [
    ("10.118.0.1:6443", "10.118.0.1:6443"),
    ("api.example.com:443", "api.example.com:443"),
    ("[fd00::1]:6443", "[fd00::1]:6443"),
])
def test_endpoints_accepted(endpoint, normalised):
    assert kubeadm.validate_endpoint(endpoint, "api_server_endpoint") == normalised


def test_bare_control_plane_endpoint_gets_the_api_port():
    assert _init(control_plane_endpoint="192.0.2.10").control_plane_endpoint == "192.0.2.10:6443"


def test_generated_token_format_and_uniqueness():
    tokens = {kubeadm.generate_token() for _i in range(200)}
    assert len(tokens) == 200
    assert all(re.fullmatch(r"[a-z0-9]{6}\.[a-z0-9]{16}", t) for t in tokens)
    assert all(kubeadm.validate_token(t) == t for t in tokens)


def test_generated_certificate_key_is_32_random_bytes_in_hex():
    keys = {kubeadm.generate_certificate_key() for _i in range(50)}
    assert len(keys) == 50
    assert all(re.fullmatch(r"[0-9a-f]{64}", k) for k in keys)


@pytest.mark.parametrize("ttl, seconds", [("15m", 900), ("1h30m", 5400), ("24h", 86400), ("0s", 0), ("90s", 90)])
def test_ttl(ttl, seconds):
    assert kubeadm.ttl_seconds(ttl) == seconds


@pytest.mark.parametrize("ttl", ["", "15", "m", "1d", "-5m"])
def test_bad_ttl(ttl):
    with pytest.raises(kubeadm.InputError) as err:
        kubeadm.validate_ttl(ttl, "ttl")
    assert err.value.field == "ttl"
