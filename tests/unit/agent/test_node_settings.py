# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Per-node settings outside the measured image (agent/config.py ``read_node_settings``; docs/agent.md, "Per-node
settings"; docs/security.md, "Deployment modes"). Nothing measures the ``node_settings`` device: whoever provisions
the node writes it. The attacks: settings that would change what the node trusts (refused, the agent does not
start), and the attacker's own init secret hash (the admin's activation fails, nothing is given out). The agent is
the real one (agent/wiring.py: ``main`` and ``build_agent``, real pubapi on loopback, real swtpm)."""

from __future__ import annotations

import io
import json
import os

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from lab.swtpm import free_port
from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import (
    MAX_NODE_SETTINGS, NODE_SETTINGS_KEYS, AgentConfig, read_node_settings)
from ansible_collections.constellation.cluster.plugins.module_utils.agent.json_log import JSONLog
from ansible_collections.constellation.cluster.plugins.module_utils.agent.wiring import build_agent, main
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import DummyValidator
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.tpm import read_pcrs
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.kms.init_secret import init_secret_hash
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import RemoteError

ADMIN_INIT_SECRET = os.urandom(32)


def _baked(tmp_path, swtpm, **extra):
    """The image's baked config (the test suite's dummy variant, so that nothing but the settings matters)."""
    data = {"state_dir": str(tmp_path / "state"), "public_endpoint": "127.0.0.1:%d" % free_port(),
            "tcti": swtpm.tcti, "variant": "dummy", "verify_grpc_endpoint": "", "verify_http_endpoint": "",
            "reattest_interval": 0, "node_settings": str(tmp_path / "node.raw")}
    data.update(extra)
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(data))
    return path


def _device(tmp_path, settings, size=1024 * 1024):
    """A raw disk image as QEMU gives it to the guest: the JSON document, then NULs up to the disk's size."""
    raw = json.dumps(settings).encode() if not isinstance(settings, bytes) else settings
    (tmp_path / "node.raw").write_bytes(raw + b"\0" * (size - len(raw)))


def test_per_node_values_override_the_baked_ones(tmp_path, swtpm):
    baked = _baked(tmp_path, swtpm, init_secret_hash="ab" * 32, public_ip="192.0.2.1")
    _device(tmp_path, {"public_endpoint": "127.0.0.1:9555", "public_ip": "198.51.100.7", "init_secret_hash": "cd" * 32})
    config = AgentConfig.load(str(baked))
    assert (config.public_endpoint, config.public_ip, config.init_secret_hash) == (
        "127.0.0.1:9555", "198.51.100.7", "cd" * 32)
    # Only some of them: the others stay baked.
    _device(tmp_path, {"init_secret_hash": "ef" * 32})
    config = AgentConfig.load(str(baked))
    assert (config.public_ip, config.init_secret_hash) == ("192.0.2.1", "ef" * 32)
    # A missing device: no per-node settings, the baked values.
    os.unlink(tmp_path / "node.raw")
    assert AgentConfig.load(str(baked)).init_secret_hash == "ab" * 32
    # ... and without a baked init_secret_hash the agent needs the device's (the secure default holds).
    with pytest.raises(InputError) as refused:
        AgentConfig.load(str(_baked(tmp_path, swtpm, public_ip="192.0.2.1")))
    assert refused.value.field == "init_secret_hash"
    assert NODE_SETTINGS_KEYS == ("public_endpoint", "public_ip", "init_secret_hash")


@pytest.mark.parametrize("key, value", [
    ("ek_ca", "/tmp/attacker-ca.pem"), ("measurements_pub_key", "/tmp/attacker.pub"), ("deployment_mode", "host"),
    ("insecure_trust_any_ak", True), ("variant", "qemu-vtpm"), ("measurements", "/tmp/attacker.json"),
    ("insecure_unauthenticated_activation", True), ("state_dir", "/tmp/elsewhere"), ("node_settings", "/dev/vdc")])
def test_settings_that_would_change_what_the_node_trusts_are_refused_and_the_agent_does_not_start(
        tmp_path, swtpm, capsys, key, value):
    """The attacker writes the unmeasured per-node device: next to a genuine init secret hash, a key that would
    change what the node trusts. The agent refuses to start (exit 2, nothing listens), naming the key."""
    baked = _baked(tmp_path, swtpm, init_secret_hash="ab" * 32)
    _device(tmp_path, {"init_secret_hash": "cd" * 32, key: value})
    with pytest.raises(InputError) as refused:
        AgentConfig.load(str(baked))
    assert refused.value.field == "node_settings" and refused.value.got == key
    assert "would change what this node trusts" in str(refused.value)
    assert main(["--config", str(baked)]) == 2
    failed = [json.loads(line) for line in capsys.readouterr().err.splitlines() if '"agent_failed"' in line]
    assert failed and failed[0]["error"].startswith("node_settings: expected only the keys public_endpoint")
    assert repr(key) in failed[0]["error"]
    assert not (tmp_path / "state" / "store.json").exists()


@pytest.mark.parametrize("content, expected", [
    (b"not json", "one JSON object"), (b"[1, 2]", "one JSON object"), (b"", "one JSON object"),
    (b'{"public_ip": "192.0.2.1", "public_ip": "192.0.2.2"}', "each key once"),
    (b'{"public_ip": 7}', "public_ip as a string"), (b'{"public_ip": "192.0.2.1"}\0garbage', "NUL bytes only"),
    (b"\xff\xfe{}", "one JSON object (UTF-8)"), (b'{"public_ip": "' + b"1" * MAX_NODE_SETTINGS + b'"}', "at most 65536"),
])
def test_a_malformed_document_is_refused_naming_node_settings_and_the_path(tmp_path, swtpm, content, expected):
    baked = _baked(tmp_path, swtpm, init_secret_hash="ab" * 32)
    _device(tmp_path, content, size=max(1024 * 1024, len(content) + 1))
    with pytest.raises(InputError) as refused:
        AgentConfig.load(str(baked))
    assert refused.value.field == "node_settings" and str(tmp_path / "node.raw") in str(refused.value)
    assert expected in str(refused.value)
    for path in ("relative/node.json", "/dev/vd\0c"):
        with pytest.raises(InputError, match="^node_settings: expected the absolute path"):
            AgentConfig.from_mapping(json.loads(baked.read_text()) | {"node_settings": path})
    assert read_node_settings(str(tmp_path / "missing")) == {}
    # A value of the right type that the agent's own check refuses: named as coming from the per-node settings.
    for key, value, expected in (("init_secret_hash", "xyz", "init_secret_hash the hex SHA-256"),
                                 ("public_endpoint", "nowhere", "public_endpoint ")):
        _device(tmp_path, {key: value})
        with pytest.raises(InputError) as refused:
            AgentConfig.load(str(baked))
        assert refused.value.field == "node_settings" and str(tmp_path / "node.raw") in str(refused.value)
        assert str(refused.value).startswith("node_settings: expected " + expected), str(refused.value)


def test_an_init_secret_hash_from_the_node_settings_fails_the_admins_activation_and_nothing_is_given_out(
        tmp_path, swtpm):
    """The attacker puts the hash of his own init secret on the node's device. The admin's activation proves the
    admin's init secret: it is refused, the node stays AcceptingInit, PCR 15 stays zero and no cluster secret (the
    master secret in the KMS URI) reaches the node."""
    attacker_secret = os.urandom(32)
    baked = _baked(tmp_path, swtpm, init_secret_hash=init_secret_hash(ADMIN_INIT_SECRET, "127.0.0.1"))
    _device(tmp_path, {"init_secret_hash": init_secret_hash(attacker_secret, "127.0.0.1")})
    config = AgentConfig.load(str(baked))
    agent = build_agent(config, JSONLog(stream=io.StringIO())).start()
    master = kms.MasterSecret.generate().to_uri()
    admin_pem = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    try:
        with AgentClient.connect(config.public_endpoint, [DummyValidator()]) as admin:
            with pytest.raises(RemoteError) as refused:
                admin.activate_as_coordinator(master, os.urandom(32), admin_pem, init_secret=ADMIN_INIT_SECRET)
            assert refused.value.kind == "AccessDenied" and "init secret" in str(refused.value)
            assert admin.get_state()["state"] == "AcceptingInit"
        assert agent.store.get_default("kmsData") is None
    finally:
        agent.stop()
    assert read_pcrs(swtpm.tcti)[15] == bytes(32)
