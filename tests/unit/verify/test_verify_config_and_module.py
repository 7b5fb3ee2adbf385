# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent's verify_grpc_endpoint / verify_http_endpoint settings, and the module
constellation_verify (its main, with the arguments Ansible would pass) against real services on
loopback: a real swtpm quote, a replaying service, a host whose PCRs differ from the policy."""

from __future__ import annotations

import json
import os
import socket

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.constellation.cluster.plugins.module_utils.agent import verify_service as vs
from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import AgentConfig
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import DummyIssuer
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError
from ansible_collections.constellation.cluster.plugins.modules import constellation_verify

BASE = {"state_dir": "/nonexistent", "public_endpoint": "10.0.0.1:9000", "variant": "dummy",
        "insecure_unauthenticated_activation": True}  # these tests are about other keys


# --------------------------------------------------------------------------- agent settings


def test_every_agent_serves_it_on_constellations_ports_by_default():
    config = AgentConfig.from_mapping(BASE)
    assert (config.verify_grpc_endpoint, config.verify_http_endpoint) == ("10.0.0.1:9090", "10.0.0.1:8080")
    config = AgentConfig.from_mapping(dict(BASE, public_endpoint="[fd00::1]:9000"))
    assert (config.verify_grpc_endpoint, config.verify_http_endpoint) == ("[fd00::1]:9090", "[fd00::1]:8080")


@pytest.mark.parametrize("wildcard", ["0.0.0.0:9000", "[::]:9000"])
def test_it_binds_the_public_address_not_all_addresses_by_default(wildcard):
    """Least disclosure: with public_endpoint on all addresses, the verification service listens on
    public_ip only (it was 0.0.0.0); an explicit endpoint is taken as it is."""
    config = AgentConfig.from_mapping(dict(BASE, public_endpoint=wildcard, public_ip="192.0.2.7"))
    assert (config.verify_grpc_endpoint, config.verify_http_endpoint) == ("192.0.2.7:9090", "192.0.2.7:8080")
    config = AgentConfig.from_mapping(dict(BASE, public_endpoint=wildcard, public_ip="fd00::7"))
    assert (config.verify_grpc_endpoint, config.verify_http_endpoint) == ("[fd00::7]:9090", "[fd00::7]:8080")
    config = AgentConfig.from_mapping(dict(BASE, public_endpoint=wildcard, public_ip="192.0.2.7",
                                           verify_http_endpoint="0.0.0.0:8080"))
    assert config.verify_http_endpoint == "0.0.0.0:8080"


def test_empty_turns_one_transport_off():
    config = AgentConfig.from_mapping(dict(BASE, verify_grpc_endpoint="", verify_http_endpoint="127.0.0.1:18080"))
    assert (config.verify_grpc_endpoint, config.verify_http_endpoint) == ("", "127.0.0.1:18080")


@pytest.mark.parametrize("settings, field, expected", [
    ({"verify_grpc_endpoint": 9090}, "verify_grpc_endpoint", 'host:port, or "" to turn it off'),
    ({"verify_http_endpoint": ["0.0.0.0:8080"]}, "verify_http_endpoint", 'host:port, or "" to turn it off'),
    ({"verify_http_endpoint": "8080"}, "verify_http_endpoint", "host:port"),
    ({"verify_grpc_endpoint": "10.0.0.1:0"}, "verify_grpc_endpoint", "a port in 1-65535"),
    ({"verify_grpc_endpoint": "0.0.0.0:9000"}, "verify_grpc_endpoint", "an endpoint other than public_endpoint's"),
    ({"verify_http_endpoint": "10.0.0.1:9090"}, "verify_http_endpoint", "an endpoint other than verify_grpc_endpoint's"),
])
def test_bad_settings_are_refused_naming_the_key(settings, field, expected):
    with pytest.raises(InputError) as refused:
        AgentConfig.from_mapping(dict(BASE, **settings))
    assert refused.value.field == field and expected in refused.value.expected


def test_a_taken_port_is_named_and_nothing_stays_open():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        free = socket.socket()
        free.bind(("127.0.0.1", 0))
        free_port = free.getsockname()[1]
        free.close()
        with pytest.raises(ConstellationError, match="verify_http_endpoint 127.0.0.1:%d" % port):
            vs.serve("127.0.0.1:%d" % free_port, "127.0.0.1:%d" % port, DummyIssuer().issue)
    # The gRPC server started first was stopped again: its port is free.
    with socket.socket() as again:
        again.bind(("127.0.0.1", free_port))


# --------------------------------------------------------------------------- the module


def run_module(capsys, args):
    """Runs the module's main; returns its JSON result (exit_json and fail_json both end the process).
    Variant qemu-vtpm unless ``args`` says otherwise (the module serves Constellation's), acknowledged."""
    args = {k: v for k, v in dict({"variant": "qemu-vtpm", "insecure_trust_any_ak": True}, **args).items() if v is not None}
    with patch_module_args(args), pytest.raises(SystemExit) as done:
        constellation_verify.main()
    result = json.loads(capsys.readouterr().out)
    assert (done.value.code == 0) != bool(result.get("failed"))
    return result


@pytest.fixture
def node(tpm):
    """A node's verification service (both transports) on a real swtpm, and its PCRs."""
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.tpm import read_pcrs
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import VTPMIssuer

    with VTPMIssuer(tpm.tcti, event_log_path=None) as issuer:
        servers = [vs.GRPCVerifyServer(("127.0.0.1", 0), issuer.issue).start(),
                   vs.HTTPVerifyServer(("127.0.0.1", 0), issuer.issue).start()]
        endpoints = {"grpc": "127.0.0.1:%d" % servers[0].address[1], "http": "127.0.0.1:%d" % servers[1].address[1]}
        yield endpoints, read_pcrs(tpm.tcti), issuer
        for server in servers:
            server.stop()


def _policy(pcrs, **override):
    policy = {str(i): {"expected": pcrs[i].hex(), "warnOnly": False} for i in (4, 9, 15)}
    policy.update(override)
    return policy


@pytest.mark.parametrize("transport", vs.TRANSPORTS)
@pytest.mark.parametrize("check_mode", [False, True])
def test_module_attests_a_real_quote_and_prints_the_table(node, capsys, transport, check_mode):
    endpoints, pcrs, _issuer = node
    result = run_module(capsys, {"endpoint": endpoints[transport], "transport": transport,
                                 "measurements": _policy(pcrs), "_ansible_check_mode": check_mode})
    assert result["changed"] is False and result["transport"] == transport
    assert [(row["index"], row["ok"]) for row in result["pcrs"]] == [(4, True), (9, True), (15, True)]
    assert result["measurements"]["9"] == pcrs[9].hex() and len(bytes.fromhex(result["nonce"])) == 32
    assert result["table"][0].split() == ["endpoint", "PCR", "expected", "found", "match", "verdict"]
    assert result["table"][2].split() == [endpoints[transport], "9", pcrs[9].hex()[:10] + "..",
                                          pcrs[9].hex()[:10] + "..", "yes", "ok"]


def test_module_refuses_a_host_whose_pcrs_differ_naming_the_pcr(node, capsys):
    endpoints, pcrs, _issuer = node
    result = run_module(capsys, {"endpoint": endpoints["grpc"],
                                 "measurements": _policy(pcrs, **{"9": {"expected": "ab" * 32, "warnOnly": False}})})
    assert result["failed"] and "refused" in result["msg"]
    assert "PCR 9: expected %s, found %s" % ("ab" * 32, pcrs[9].hex()) in result["msg"]
    assert [(row["index"], row["ok"]) for row in result["pcrs"]] == [(4, True), (9, False), (15, True)]
    assert result["table"][2].split()[-2:] == ["NO", "FAIL"]


def test_module_warns_for_a_warn_only_mismatch(node, capsys, monkeypatch):
    # As on a target: a worker that imported controller code (plugins' tests) would otherwise send
    # module warnings to the controller's display instead of the result.
    from ansible.module_utils import _internal
    monkeypatch.setattr(_internal, "is_controller", False)
    endpoints, pcrs, _issuer = node
    result = run_module(capsys, {"endpoint": endpoints["http"], "transport": "http",
                                 "measurements": _policy(pcrs, **{"14": {"expected": "cd" * 32, "warnOnly": True}})})
    assert not result.get("failed")
    assert "PCR 14: expected %s, found %s (warn-only)" % ("cd" * 32, pcrs[14].hex()) in json.dumps(result["warnings"])
    assert "variant qemu-vtpm trusts ANY attestation key" in json.dumps(result["warnings"])  # acknowledged, warned


@pytest.mark.parametrize("transport", vs.TRANSPORTS)
def test_module_refuses_a_replayed_answer(node, capsys, transport):
    endpoints, pcrs, issuer = node
    recorded = issuer.issue(vs.VERIFY_USER_DATA, os.urandom(32))  # a genuine answer, for another nonce
    replayer = (vs.GRPCVerifyServer if transport == "grpc" else vs.HTTPVerifyServer)(
        ("127.0.0.1", 0), lambda user_data, nonce: recorded).start()
    try:
        result = run_module(capsys, {"endpoint": "127.0.0.1:%d" % replayer.address[1], "transport": transport,
                                     "measurements": _policy(pcrs)})
    finally:
        replayer.stop()
    assert result["failed"] and "refused" in result["msg"] and result["pcrs"] == []
    del endpoints


def test_module_refuses_qemu_vtpm_ek_and_bad_input_clearly(capsys):
    result = run_module(capsys, {"endpoint": "127.0.0.1:9090", "variant": "qemu-vtpm-ek", "ek_ca_path": "/x.pem"})
    assert result["failed"] and result["msg"].startswith("variant: expected qemu-vtpm (with insecure_trust_any_ak: true) or dummy")
    result = run_module(capsys, {"endpoint": "127.0.0.1", "variant": "dummy"})
    assert result["failed"] and result["msg"] == "endpoint: expected host:port, got '127.0.0.1'"
    result = run_module(capsys, {"endpoint": "127.0.0.1:9090"})
    assert result["failed"] and "measurements" in result["msg"]
    # Its default (the collection's, qemu-vtpm-ek) is refused, saying what to set; qemu-vtpm needs the acknowledgement.
    result = run_module(capsys, {"endpoint": "127.0.0.1:9090", "variant": None, "insecure_trust_any_ak": None})
    assert result["failed"] and "qemu-vtpm (with insecure_trust_any_ak: true)" in result["msg"]
    result = run_module(capsys, {"endpoint": "127.0.0.1:9090", "insecure_trust_any_ak": False})
    assert result["failed"] and result["msg"].startswith("insecure_trust_any_ak: expected true to use variant qemu-vtpm")
