# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A fresh agent with the defaults cannot be taken by a stranger. Without
``init_secret_hash`` it does not start at all (unless ``insecure_unauthenticated_activation: true``,
which it then warns about on every start); with the hash the role derives from the cluster's init
secret, a stranger's activation with his own admin key is refused before the node lock, and he gets
no admin channel, so no Exec. The agent is the real one (agent/wiring.py, real pubapi on loopback,
real swtpm), with the test suite's dummy attestation so that the stranger attests nothing special."""

from __future__ import annotations

import io
import json
import os

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from lab.swtpm import free_port
from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.module_utils.agent.wiring import build_agent, main
from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import AgentConfig
from ansible_collections.constellation.cluster.plugins.module_utils.agent.json_log import JSONLog
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import DummyValidator
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.tpm import read_pcrs
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.kms.init_secret import init_secret_hash
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import RemoteError
from ansible_collections.constellation.cluster.tests.support.keys import sign_policy

CLUSTER_INIT_SECRET = os.urandom(32)


def base_config(tmp_path, swtpm, **extra):
    data = {"state_dir": str(tmp_path / "state"), "public_endpoint": "127.0.0.1:%d" % free_port(),
            "tcti": swtpm.tcti, "variant": "dummy", "verify_grpc_endpoint": "", "verify_http_endpoint": "",
            "reattest_interval": 0}
    data.update(extra)
    return data


def test_the_agent_does_not_start_without_an_init_secret_hash(tmp_path, swtpm, capsys):
    data = base_config(tmp_path, swtpm)
    with pytest.raises(InputError) as refused:
        AgentConfig.from_mapping(data)
    assert refused.value.field == "init_secret_hash"
    assert "insecure_unauthenticated_activation: true" in str(refused.value)
    # The real entry point: exit 2 with the reason in its log, nothing listens.
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(data))
    assert main(["--config", str(path)]) == 2
    failed = [json.loads(line) for line in capsys.readouterr().err.splitlines() if '"agent_failed"' in line]
    assert failed and failed[0]["error"].startswith("init_secret_hash: expected the hex SHA-256")
    for wrong in ("yes", 1, "true"):
        with pytest.raises(InputError, match="^insecure_unauthenticated_activation: expected true or false"):
            AgentConfig.from_mapping(dict(data, insecure_unauthenticated_activation=wrong))


def _start(config: AgentConfig):
    log = io.StringIO()
    agent = build_agent(config, JSONLog(stream=log)).start()
    return agent, log


def test_the_explicit_opt_out_starts_and_warns_on_every_start(tmp_path, swtpm):
    config = AgentConfig.from_mapping(base_config(tmp_path, swtpm, insecure_unauthenticated_activation=True))
    assert config.init_secret_hash is None
    for _start_again in range(2):
        agent, log = _start(config)
        agent.stop()
        warnings = [json.loads(line) for line in log.getvalue().splitlines() if '"init_secret_not_configured"' in line]
        assert len(warnings) == 1 and warnings[0]["level"] == "warning"


def _admin_key():
    key = ed25519.Ed25519PrivateKey.generate()
    return key, key.public_key().public_bytes(serialization.Encoding.PEM,
                                              serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def test_a_stranger_cannot_activate_a_fresh_agent_provisioned_with_the_hash(tmp_path, swtpm):
    """The agent as the node_agent role configures it by default: init_secret_hash derived from the
    cluster's init secret and the node's public IP. A stranger who reaches its port tries to make it
    his Coordinator with his own admin key, then to run a command: everything is refused, PCR 15
    stays zero and the node stays AcceptingInit."""
    config = AgentConfig.from_mapping(base_config(
        tmp_path, swtpm, init_secret_hash=init_secret_hash(CLUSTER_INIT_SECRET, "127.0.0.1")))
    agent, log = _start(config)
    key, pem = _admin_key()
    try:
        with AgentClient.connect(config.public_endpoint, [DummyValidator()]) as stranger:
            for guess in (None, os.urandom(32)):
                with pytest.raises(RemoteError) as refused:
                    stranger.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), pem,
                                                     init_secret=guess)
                assert refused.value.kind == "AccessDenied" and "init secret" in str(refused.value)
            with pytest.raises(RemoteError):
                stranger.admin_auth(key)
            with pytest.raises(RemoteError):
                stranger.exec_command("touch %s" % (tmp_path / "owned"))
            assert stranger.get_state()["state"] == "AcceptingInit"
    finally:
        agent.stop()
    assert not (tmp_path / "owned").exists()
    assert read_pcrs(swtpm.tcti)[15] == bytes(32)
    assert "init_secret_not_configured" not in log.getvalue()


def test_qemu_vtpm_is_refused_without_the_acknowledgement_and_warned_about_on_every_start(tmp_path, swtpm):
    """A forged AK at the agent: qemu-vtpm trusts any AK; the agent refuses it unless its config
    says insecure_trust_any_ak: true, and then logs insecure_variant (warning) at every start."""
    pcrs = read_pcrs(swtpm.tcti)
    policy = tmp_path / "measurements.json"
    policy.write_text(json.dumps({"4": {"expected": pcrs[4].hex(), "warnOnly": False}}))
    data = base_config(tmp_path, swtpm, variant="qemu-vtpm", measurements=str(policy),
                       init_secret_hash=init_secret_hash(CLUSTER_INIT_SECRET, "127.0.0.1"),
                       measurements_pub_key=sign_policy(tmp_path, policy))
    with pytest.raises(InputError) as refused:
        AgentConfig.from_mapping(data)
    assert refused.value.field == "insecure_trust_any_ak" and "trusts ANY attestation key" in str(refused.value)
    config = AgentConfig.from_mapping(dict(data, insecure_trust_any_ak=True))
    for _start_again in range(2):
        agent, log = _start(config)
        agent.stop()
        warnings = [json.loads(line) for line in log.getvalue().splitlines() if '"insecure_variant"' in line]
        assert len(warnings) == 1 and warnings[0]["level"] == "warning"
        assert "trusts ANY attestation key" in warnings[0]["message"]
