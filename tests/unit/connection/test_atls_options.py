# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Option parsing and validation of the atls connection plugin (no network)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ansible_collections.constellation.cluster.plugins.connection.atls import (
    Connection, Settings, SettingsError, pipelined_module, settings_from_options)
from tests.unit.connection.atls_options import POLICY, options


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "admin.key"
    path.write_text("not parsed here")
    return str(path)


def test_defaults_build_endpoint_from_host_and_port(key_file):
    s = settings_from_options(options(key_file))
    assert s.endpoint == "10.0.0.5:9000"
    assert s.variant == "qemu-vtpm" and s.measurements == POLICY
    assert s.persist == 60 and s.command_timeout == 0
    assert s.control_path_dir == os.path.expanduser("~/.ansible/cp")


def test_endpoint_overrides_host_and_ipv6_is_bracketed(key_file):
    assert settings_from_options(options(key_file, endpoint="192.0.2.1:9100")).endpoint == "192.0.2.1:9100"
    assert settings_from_options(options(key_file, host="fd00::1")).endpoint == "[fd00::1]:9000"


@pytest.mark.parametrize("endpoint, needle", [
    ("10.0.0.5", "endpoint: expected host:port"),
    ("10.0.0.5:http", "numeric port"),
    ("10.0.0.5:70000", "port in 1-65535"),
    (":9000", "endpoint: expected host:port"),
])
def test_bad_endpoint_is_named(key_file, endpoint, needle):
    with pytest.raises(SettingsError, match=needle):
        settings_from_options(options(key_file, endpoint=endpoint))


def test_policy_from_file_json_or_yaml(key_file, tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(POLICY))
    s = settings_from_options(options(key_file, measurements=None, measurements_file=str(path)))
    assert s.measurements == POLICY
    path = tmp_path / "m.yml"
    path.write_text("'4':\n  expected: '%s'\n  warnOnly: false\n" % ("aa" * 32))
    assert settings_from_options(options(key_file, measurements=None, measurements_file=str(path))).measurements


@pytest.mark.parametrize("changes, needle", [
    ({"measurements": None}, "measurements: expected a measurements policy"),
    ({"measurements": {}}, "measurements: expected a measurements policy"),
    ({"measurements": {"4": {"expected": "zz"}}}, "measurements: "),
    ({"measurements": {"99": {"expected": "aa" * 32}}}, "measurements: "),
    ({"measurements": ["4"]}, "measurements: expected a mapping"),
    ({"measurements_file": "/nonexistent/m.json"}, "mutually exclusive"),
    ({"measurements": None, "measurements_file": "/nonexistent/m.json"}, "measurements_file: expected a readable"),
    ({"attestation_variant": "qemu-tdx"}, "attestation_variant: expected one of qemu-vtpm, qemu-vtpm-ek, sev-snp, azure-sev-snp, aws-sev-snp, dummy"),
    ({"admin_priv_key_file": None}, "admin_priv_key_file: expected the path"),
    ({"admin_priv_key_file": "/nonexistent/admin.key"}, "admin_priv_key_file: expected a readable"),
    ({"connect_timeout": 0}, r"connect_timeout: expected seconds in \(0, 86400\]"),
    ({"connect_timeout": "soon"}, "connect_timeout: expected a number of seconds"),
    ({"persist": -1}, r"persist: expected seconds in \[0, 86400\]"),
    ({"netns": "../etc"}, "netns: expected the name of a network namespace"),
    ({"host": None}, "host: expected the node's address"),
])
def test_bad_options_name_the_option(key_file, changes, needle):
    with pytest.raises(SettingsError, match=needle):
        settings_from_options(options(key_file, **changes))


def test_dummy_variant_needs_no_policy(key_file):
    s = settings_from_options(options(key_file, attestation_variant="dummy", measurements=None))
    assert s.variant == "dummy" and s.measurements is None


def test_settings_round_trip_json(key_file):
    s = settings_from_options(options(key_file, netns="cl-lab-br", persist=0))
    assert Settings.from_json(s.to_json()) == s


def test_control_path_separates_runs_policies_and_keys(key_file, tmp_path):
    s = settings_from_options(options(key_file))
    base = s.control_path("100")
    assert base.startswith(s.control_path_dir + "/atls-") and len(base) < 100  # fits sun_path
    assert s.control_path("100") == base
    assert s.control_path("101") != base
    other_policy = settings_from_options(options(key_file, measurements={"4": {"expected": "cc" * 32}}))
    assert other_policy.control_path("100") != base
    other_key = tmp_path / "other.key"
    other_key.write_text("another key")
    assert settings_from_options(options(str(other_key))).control_path("100") != base


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _adhoc(tmp_path, *extra):
    """An ad-hoc ansible run over atls against an inventory host (options as -e variables)."""
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "local"), CONSTELLATION_ATLS_CONTROL_PATH_DIR=str(tmp_path / "cp"))
    argv = [os.path.join(REPO, ".venv", "bin", "ansible"), "all", "-i", "node0,", "-m", "ansible.builtin.command",
            "-a", "/bin/true", "-e", "ansible_connection=constellation.cluster.atls",
            # qemu-vtpm on purpose (no EK CA needed), acknowledged as the plugin requires.
            "-e", "constellation_attestation_variant=qemu-vtpm", "-e", "constellation_insecure_trust_any_ak=true"]
    for item in extra:
        argv += ["-e", item]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=120, check=False)


def test_plugin_class_declares_pipelining():
    assert Connection.has_pipelining is True
    assert Connection.transport == "constellation.cluster.atls"


def test_bad_option_is_unreachable_naming_it(key_file, tmp_path):
    proc = _adhoc(tmp_path, "constellation_public_endpoint=127.0.0.1:1",
                  "constellation_admin_priv_key_file=%s" % key_file)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "measurements: expected a measurements policy" in proc.stdout + proc.stderr


@pytest.mark.parametrize("persist", ["0", "30"])
def test_unreachable_endpoint_names_it(tmp_path, persist):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = tmp_path / "k.pem"
    key.write_bytes(ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    # Port 1 on loopback: nothing listens.
    proc = _adhoc(tmp_path, "constellation_public_endpoint=127.0.0.1:1", "constellation_admin_priv_key_file=%s" % key,
                  "constellation_atls_persist=%s" % persist,
                  "{\"constellation_measurements\": %s}" % json.dumps(POLICY))
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "127.0.0.1:1: cannot connect" in proc.stdout + proc.stderr
    assert not list((tmp_path / "cp").glob("*.sock"))  # no relay was left behind


def test_relative_remote_paths_are_refused():
    with pytest.raises(Exception, match="absolute remote path"):
        Connection._remote_path("relative/file", "out_path")  # pylint: disable=protected-access


# --------------------------------------------------------------------------- which commands go to ExecModule

PAYLOAD = b"#!/usr/bin/python3\n_ANSIBALLZ_WRAPPER = True\n"


@pytest.mark.parametrize("cmd, expected", [
    ("/bin/sh -c '/usr/bin/python3 && sleep 0'", ("/usr/bin/python3", {})),
    ("/bin/sh -c /usr/bin/python3", ("/usr/bin/python3", {})),
    ("/bin/bash -c 'LANG=C FOO='\"'\"'a b'\"'\"' /usr/bin/python3 && sleep 0'",
     ("/usr/bin/python3", {"LANG": "C", "FOO": "a b"})),
])
def test_pipelined_module_is_recognised(cmd, expected):
    assert pipelined_module(cmd, PAYLOAD) == expected


@pytest.mark.parametrize("cmd, data", [
    ("/bin/sh -c '/usr/bin/python3 && sleep 0'", None),  # no payload: not pipelined
    ("/bin/sh -c '/usr/bin/python3 && sleep 0'", b"print(1)\n"),  # no shebang
    ("/bin/sh -c '/usr/bin/python3.11 && sleep 0'", PAYLOAD),  # shebang names another interpreter
    ("/bin/sh -c 'python3 && sleep 0'", b"#!python3\n"),  # not an absolute path
    ("sudo -H -S -n -u root /bin/sh -c '/usr/bin/python3 && sleep 0'", PAYLOAD),  # become
    ("/bin/sh -c 'FOO=$(id) /usr/bin/python3'", PAYLOAD),  # an expansion the shell would make
    ("/bin/sh -c '/usr/bin/python3; rm -rf /tmp/x'", PAYLOAD),
    ("/bin/sh -c '/usr/bin/python3 && sleep 1'", PAYLOAD),
    ("/bin/sh -c '/usr/bin/cat'", b"#!/usr/bin/cat\n"),  # not a Python
    ("/bin/sh -c 'echo unbalanced", PAYLOAD),
    ("/bin/sh -c '1X=2 /usr/bin/python3'", PAYLOAD),
])
def test_other_commands_stay_exec(cmd, data):
    assert pipelined_module(cmd, data) is None


def test_fresh_proof_option_is_on_by_default_and_separates_relays(key_file):
    on = settings_from_options(options(key_file))
    off = settings_from_options(options(key_file, fresh_proof="false"))
    assert on.fresh_proof is True and off.fresh_proof is False
    assert on.control_path("1") != off.control_path("1")  # a relay never serves another proof regime
    with pytest.raises(SettingsError, match="fresh_proof: expected a boolean"):
        settings_from_options(options(key_file, fresh_proof="sometimes"))


def test_prestart_option_is_on_by_default_and_names_a_bad_value(key_file):
    assert settings_from_options(options(key_file)).prestart is True
    assert settings_from_options(options(key_file, prestart="false")).prestart is False
    with pytest.raises(SettingsError, match="prestart: expected a boolean"):
        settings_from_options(options(key_file, prestart="sometimes"))


def test_warm_interpreter_option(key_file):
    assert settings_from_options(options(key_file)).warm_interpreter is True
    assert settings_from_options(options(key_file, warm_interpreter="no")).warm_interpreter is False
    with pytest.raises(SettingsError, match="warm_interpreter: expected a boolean"):
        settings_from_options(options(key_file, warm_interpreter="maybe"))


def test_task_workers_import_no_atls_and_no_more_cryptography():
    """A task worker (a fork of ansible's task executor) loads the plugin and rpc/client.py per task;
    neither may pull in aTLS, attestation or cryptography modules ansible had not loaded already, nor
    the RPC schema (its records cost ~15 ms to build, per task)."""
    code = ("import sys, ansible.executor.task_executor; before = set(sys.modules); "
            "from ansible_collections.constellation.cluster.plugins.connection import atls; "
            "from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient; "
            "print(sorted(m for m in set(sys.modules) - before if 'crypt' in m or 'atls' in m.replace("
            "'connection.atls', '').replace('plugin_utils.atls', '') or 'attestation' in m "
            "or m.endswith('rpc.schema')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "collections"), REPO])))
    assert proc.stdout.strip() == "[]"


def test_ek_variant_needs_an_ek_ca_file(key_file, tmp_path):
    with pytest.raises(SettingsError, match="ek_ca_path: expected the PEM file"):
        settings_from_options(options(key_file, attestation_variant="qemu-vtpm-ek"))
    with pytest.raises(SettingsError, match="ek_ca_path: expected a readable PEM file or a folder"):
        settings_from_options(options(key_file, attestation_variant="qemu-vtpm-ek", ek_ca_path=str(tmp_path / "no")))
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    s = settings_from_options(options(key_file, attestation_variant="qemu-vtpm-ek", ek_ca_path=str(tmp_path / "ca.pem")))
    assert s.variant == "qemu-vtpm-ek" and s.ek_ca_path == str(tmp_path / "ca.pem")
    # Another CA file is another relay: a connection attested under one trust anchor is never reused.
    before = s.control_path("1")
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\nchanged\n")
    assert s.control_path("1") != before
    # The plain variant ignores an EK CA.
    assert settings_from_options(options(key_file, ek_ca_path=str(tmp_path / "ca.pem"))).ek_ca_path is None


def test_signed_policy_file_is_used_only_when_its_signature_verifies(key_file, tmp_path):
    """measurements_pub_key_file pins the key: the policy file is read only after its detached
    signature (cosign sign-blob form) verifies; an altered or unsigned file, or inline measurements,
    are refused naming what is wrong."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from ansible_collections.constellation.cluster.plugins.module_utils.attestation import signature

    priv_key = ec.generate_private_key(ec.SECP256R1())
    pub_path = tmp_path / "measurements.pub"
    pub_path.write_bytes(priv_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                            serialization.PublicFormat.SubjectPublicKeyInfo))
    policy_path = tmp_path / "measurements.json"
    policy_path.write_text(json.dumps(POLICY))
    (tmp_path / "measurements.json.sig").write_text(signature.sign_blob(priv_key, policy_path.read_bytes()))
    signed = options(key_file, measurements=None, measurements_file=str(policy_path),
                     measurements_pub_key_file=str(pub_path))
    assert settings_from_options(signed).measurements == json.loads(policy_path.read_text())
    policy_path.write_text(json.dumps(POLICY) + "\n")  # one byte more: altered
    with pytest.raises(SettingsError, match="measurements.json"):
        settings_from_options(signed)
    (tmp_path / "measurements.json.sig").unlink()
    with pytest.raises(SettingsError, match="measurements.json"):
        settings_from_options(signed)
    with pytest.raises(SettingsError, match="needs a signed measurements_file"):
        settings_from_options(options(key_file, measurements_pub_key_file=str(pub_path)))


# ------------------------------------------------------------------ secure by default


def test_default_variant_is_qemu_vtpm_ek_and_needs_the_ek_ca(key_file, tmp_path):
    with pytest.raises(SettingsError, match="ek_ca_path: expected the PEM file .*constellation_ek_ca_path"):
        settings_from_options(options(key_file, attestation_variant=None, insecure_trust_any_ak=None))
    (tmp_path / "ca").mkdir()  # a folder of PEM files is accepted as well
    s = settings_from_options(options(key_file, attestation_variant=None, insecure_trust_any_ak=None,
                                      ek_ca_path=str(tmp_path / "ca")))
    assert s.variant == "qemu-vtpm-ek" and s.insecure_trust_any_ak is False


@pytest.mark.parametrize("ack", [None, False, "false", "no"])
def test_qemu_vtpm_without_the_acknowledgement_is_refused_naming_it(key_file, ack):
    with pytest.raises(SettingsError, match="insecure_trust_any_ak: expected true to use variant qemu-vtpm, which "
                                            "trusts ANY attestation key.*constellation_insecure_trust_any_ak"):
        settings_from_options(options(key_file, insecure_trust_any_ak=ack))


def test_qemu_vtpm_with_the_acknowledgement_is_its_own_relay(key_file):
    s = settings_from_options(options(key_file, insecure_trust_any_ak="yes"))
    assert s.variant == "qemu-vtpm" and s.insecure_trust_any_ak is True
    assert Settings.from_json(s.to_json()) == s


def test_dummy_is_refused_outside_the_test_suite(key_file, monkeypatch):
    monkeypatch.delenv("CONSTELLATION_TEST_SUITE")
    with pytest.raises(SettingsError, match="attestation_variant: expected a variant with security .*dummy proves "
                                            "nothing.*CONSTELLATION_TEST_SUITE=1"):
        settings_from_options(options(key_file, attestation_variant="dummy", measurements=None))


def test_a_policy_that_enforces_nothing_is_refused_naming_it(key_file, tmp_path):
    for policy in ({"4": {"expected": "aa" * 32, "warnOnly": True}}, {"15": {"expected": "00" * 32}}):
        with pytest.raises(SettingsError, match="enforces at least one PCR other than 15.*inline measurements"):
            settings_from_options(options(key_file, measurements=policy))
        path = tmp_path / "warn-only.json"
        path.write_text(json.dumps(policy))
        with pytest.raises(SettingsError, match="enforces at least one PCR.*%s" % path):
            settings_from_options(options(key_file, measurements=None, measurements_file=str(path)))
