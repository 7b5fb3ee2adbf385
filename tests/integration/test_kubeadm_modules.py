"""The kubeadm modules run by a real ``ansible-playbook`` against the kubeadm TEST DOUBLE
(tests/doubles/kubeadm, passed as ``kubeadm_path``): kubeadm cannot be installed on this machine, so the
process boundary is where the double stands in. Playbooks assert on registered results; the tests
assert on the play's output (-v) and on what the double recorded."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml
from ansible_collections.constellation.cluster.plugins.module_utils.agent.peer_view import CorePeerView
from tests.support import ROOT
from tests.support.playbook import run_tasks

VENV_BIN = os.path.join(ROOT, ".venv", "bin")
KUBEADM_DOUBLE = os.path.join(ROOT, "tests", "doubles", "kubeadm")

pytestmark = pytest.mark.skipif(not os.path.exists(os.path.join(VENV_BIN, "ansible-playbook")),
                                reason="ansible-playbook is not installed in .venv (run make setup)")


def run_playbook(tmp_path, tasks, extra_vars=None, check=False):
    # No cluster for the double unless a task names one (its environment).
    env = {"KUBEADM_DOUBLE_LOG": tmp_path / "kubeadm-double.log", "ANSIBLE_LOCAL_TEMP": tmp_path / "ansible-tmp",
           "KUBEADM_DOUBLE_CLUSTER": ""}
    return run_tasks(tmp_path, tasks, ["-v"] + (["--check"] if check else []), play={"vars": extra_vars or {}},
                     env=env)


def double_log(tmp_path):
    path = tmp_path / "kubeadm-double.log"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _task(module, args, **extra):
    task = {"name": "%s %s" % (module, extra.pop("label", "")), "constellation.cluster.%s" % module: args}
    task.update(extra)
    return task


def _assert(*conditions, **extra):
    task = {"ansible.builtin.assert": {"that": list(conditions), "quiet": True}}
    task.update(extra)
    return task


@pytest.fixture
def dirs(tmp_path):
    return {"cp": str(tmp_path / "cp" / "kubernetes"), "worker": str(tmp_path / "worker" / "kubernetes"),
            "patches": str(tmp_path / "patches")}


def _init_args(dirs, **extra):
    args = {"kubeadm_path": KUBEADM_DOUBLE, "kubernetes_dir": dirs["cp"], "patches_dir": dirs["patches"],
            "kubernetes_version": "v1.31.1", "node_name": "control-plane-0", "node_vpn_ip": "10.118.0.1"}
    args.update(extra)
    return args


def test_init_token_join_lifecycle(tmp_path, dirs):
    token_re = "^[a-z0-9]{6}[.][a-z0-9]{16}$"
    tasks = [
        _task("kubeadm_init", _init_args(dirs, upload_certs=True), label="dry run", check_mode=True,
              register="dry"),
        _assert("dry.changed", "not dry.initialised", "dry.config[0].bootstrapTokens[0].token == '<redacted>'",
                "dry.config[0].certificateKey == '<redacted>'", "dry.kubeconfig is not defined"),
        _task("kubeadm_init", _init_args(dirs, upload_certs=True, return_secrets=True), label="for real",
              register="init", no_log=True),
        _assert("init.changed", "init.token is match('%s')" % token_re,
                "init.certificate_key is match('^[0-9a-f]{64}$')",
                "'certificate-authority-data' in init.kubeconfig",
                "init.ca_cert_hash == lookup('ansible.builtin.file', '%s/pki/ca.crt') "
                "| constellation.cluster.ca_cert_hash" % dirs["cp"],
                "init.token_id == init.token.split('.')[0]", no_log=True),
        _task("kubeadm_init", _init_args(dirs, upload_certs=True), label="again", register="again"),
        _assert("not again.changed", "again.ca_cert_hash == init.ca_cert_hash", "again.token is not defined"),
        _task("kubeadm_token", {"kubeadm_path": KUBEADM_DOUBLE, "kubernetes_dir": dirs["cp"], "ttl": "1h",
                                "return_secrets": True}, label="create", register="tok", no_log=True),
        _assert("tok.changed", "tok.token is match('%s')" % token_re,
                "tok.token_id in (tok.tokens | map(attribute='token_id'))", no_log=True),
        _task("kubeadm_token_info", {"kubeadm_path": KUBEADM_DOUBLE, "kubernetes_dir": dirs["cp"]},
              label="list", register="listed"),
        _assert("not listed.changed", "listed.tokens | length == 2",
                "(listed.tokens | map(attribute='token_id') | sort) == ([init.token_id, tok.token_id] | sort)"),
        _task("kubeadm_join", {"kubeadm_path": KUBEADM_DOUBLE, "kubernetes_dir": dirs["worker"], "patches_dir": "",
                               "api_server_endpoint": "10.118.0.1:6443", "token": "{{ tok.token }}",
                               "ca_cert_hash": "{{ init.ca_cert_hash }}", "node_name": "worker-0",
                               "node_vpn_ip": "10.118.0.11"},
              label="worker dry run", check_mode=True, register="jdry"),
        _assert("jdry.changed", "not jdry.joined", "jdry.config[0].discovery.bootstrapToken.token == '<redacted>'"),
        _task("kubeadm_join", {"kubeadm_path": KUBEADM_DOUBLE, "kubernetes_dir": dirs["worker"], "patches_dir": "",
                               "api_server_endpoint": "10.118.0.1:6443", "token": "{{ tok.token }}",
                               "ca_cert_hash": "{{ init.ca_cert_hash }}", "node_name": "worker-0",
                               "node_vpn_ip": "10.118.0.11"},
              label="worker", register="joined", environment={"KUBEADM_DOUBLE_CLUSTER": dirs["cp"]}),
        _task("kubeadm_join", {"kubeadm_path": KUBEADM_DOUBLE, "kubernetes_dir": dirs["worker"], "patches_dir": "",
                               "api_server_endpoint": "10.118.0.1:6443", "token": "{{ tok.token }}",
                               "ca_cert_hash": "{{ init.ca_cert_hash }}", "node_name": "worker-0",
                               "node_vpn_ip": "10.118.0.11"},
              label="worker again", register="rejoined", environment={"KUBEADM_DOUBLE_CLUSTER": dirs["cp"]}),
        _assert("joined.changed", "joined.joined", "not rejoined.changed"),
        _task("kubeadm_token", {"kubeadm_path": KUBEADM_DOUBLE, "kubernetes_dir": dirs["cp"], "state": "absent",
                                "token_id": "{{ tok.token_id }}"}, label="delete", register="deleted"),
        _task("kubeadm_token", {"kubeadm_path": KUBEADM_DOUBLE, "kubernetes_dir": dirs["cp"], "state": "absent",
                                "token_id": "{{ tok.token_id }}"}, label="delete again", register="deleted2"),
        _assert("deleted.changed", "not deleted2.changed", "tok.token_id not in (deleted.tokens | map(attribute='token_id'))"),
    ]
    proc = run_playbook(tmp_path, tasks)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    log = double_log(tmp_path)
    commands = [" ".join(e["argv"][:2]) for e in log]
    # Check mode ran nothing; the second init and the second join ran nothing either.
    assert commands.count("init -v=5") == 1
    assert commands.count("join -v=5") == 1
    assert all(e["rc"] == 0 for e in log)

    # Secrets the double saw must not appear in the play's -v output.
    init_doc = next(e for e in log if e["argv"][0] == "init")["config"][0]
    join_doc = next(e for e in log if e["argv"][0] == "join")["config"][0]
    secrets = [init_doc["bootstrapTokens"][0]["token"], init_doc["certificateKey"],
               join_doc["discovery"]["bootstrapToken"]["token"]]
    with open(os.path.join(dirs["cp"], "admin.conf"), encoding="utf-8") as handle:
        admin = yaml.safe_load(handle)
    secrets.append(admin["users"][0]["user"]["client-key-data"])
    for secret in secrets:
        assert secret not in proc.stdout and secret not in proc.stderr
    # ...while the non-secret results are visible.
    assert "ca_cert_hash" in proc.stdout and "sha256:" in proc.stdout


def test_bad_input_and_missing_ca_hash_fail_clearly(tmp_path, dirs):
    join = {"kubeadm_path": KUBEADM_DOUBLE, "kubernetes_dir": dirs["worker"], "patches_dir": "",
            "api_server_endpoint": "10.118.0.1:6443", "token": "abcdef.0123456789abcdef",
            "node_name": "worker-0", "node_vpn_ip": "10.118.0.11"}
    cases = [
        ("nohash", "kubeadm_join", join, "ca_cert_hash"),
        ("emptyhash", "kubeadm_join", dict(join, ca_cert_hash=""), "no way to skip CA verification"),
        ("version", "kubeadm_init", _init_args(dirs, kubernetes_version="1.31"), "kubernetes_version: expected"),
        ("cidr", "kubeadm_init", _init_args(dirs, service_cidr="10.96.0.1/12"), "service_cidr: expected"),
        ("name", "kubeadm_init", _init_args(dirs, node_name="Control_Plane"), "node_name: expected"),
        ("vpnip", "kubeadm_init", _init_args(dirs, node_vpn_ip="10.118.0.256"), "node_vpn_ip: expected"),
        ("token", "kubeadm_join", dict(join, token="abcdef-0123456789abcdef", ca_cert_hash="sha256:" + "a" * 64),
         "token: expected"),
        ("nokubeadm", "kubeadm_init", _init_args(dirs, kubeadm_path=str(tmp_path / "no-kubeadm")),
         "is not an executable file"),
    ]
    tasks = []
    for label, module, args, _expected in cases:
        tasks.append(_task(module, args, label=label, register=label, ignore_errors=True))
    for label, _module, _args, expected in cases:
        tasks.append(_assert("%s.failed" % label, "%r in %s.msg" % (expected, label),
                             "'Traceback' not in (%s.module_stderr | default(''))" % label))
    proc = run_playbook(tmp_path, tasks)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert double_log(tmp_path) == []  # every refusal happened before kubeadm ran
    assert "abcdef.0123456789abcdef" not in proc.stdout
    assert not os.path.exists(dirs["cp"]) and not os.path.exists(dirs["worker"])


def test_whole_play_in_check_mode_changes_nothing(tmp_path, dirs):
    tasks = [
        _task("kubeadm_init", _init_args(dirs), register="init"),
        _assert("init.changed", "init.config | length == 3", "init.config[1].kind == 'ClusterConfiguration'"),
    ]
    proc = run_playbook(tmp_path, tasks, check=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert double_log(tmp_path) == []
    assert not os.path.exists(dirs["cp"])
    assert "<redacted>" in proc.stdout


def test_no_kubeadm_on_path_is_reported(tmp_path, dirs):
    tasks = [_task("kubeadm_init", {k: v for k, v in _init_args(dirs).items() if k != "kubeadm_path"},
                   register="init", ignore_errors=True, environment={"PATH": "/nonexistent"}),
             _assert("init.failed", "'kubeadm was not found on PATH' in init.msg")]
    proc = run_playbook(tmp_path, tasks)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture
def coordinator_vpnapi(tmp_path, dirs, monkeypatch):
    """A Coordinator's vpnapi in this process: a real Core (in-memory TPM and store) activated with the VPN
    127.0.0.0/16, its kubeadm provider on a control plane the kubeadm TEST DOUBLE initialised in dirs['cp'].
    Loopback connections come from 127.0.0.1, the Coordinator's own VPN IP: a known peer."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from ansible_collections.constellation.cluster.plugins.module_utils import core, kms
    from ansible_collections.constellation.cluster.plugins.module_utils import kubeadm as kcore
    from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.join_provider import JoinProvider
    from ansible_collections.constellation.cluster.plugins.module_utils.rpc import schema
    from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import FrameServer
    from ansible_collections.constellation.cluster.plugins.module_utils.agent.wiring import vpnapi_handlers
    from ansible_collections.constellation.cluster.plugins.module_utils.store import MemoryStore
    from ansible_collections.constellation.cluster.tests.support.core_fakes import MemoryTPM, RecordingVPN

    class LoopbackVPN(RecordingVPN):
        vpn_cidr = "127.0.0.0/16"

    monkeypatch.setenv("KUBEADM_DOUBLE_LOG", str(tmp_path / "kubeadm-double.log"))
    monkeypatch.delenv("KUBEADM_DOUBLE_CLUSTER", raising=False)
    kcore.init_control_plane(kcore.Kubeadm(KUBEADM_DOUBLE, dirs["cp"]), kcore.InitParams(
        kubernetes_version="v1.31.1", node_name="control-plane-0", node_vpn_ip="10.118.0.1",
        kubernetes_dir=dirs["cp"], patches_dir=dirs["patches"]))
    state_dir = tmp_path / "coordinator"
    state_dir.mkdir()
    peer = core.Core(MemoryStore(), MemoryTPM(), LoopbackVPN(), str(state_dir), "10.42.0.10", core.new_disk_uuid())
    peer.recovery.load()
    admin = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    peer.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), admin,
                                             cluster_config={"vpn_cidr": "127.0.0.0/16"})
    peer.kubernetes.kubeadm_provider = JoinProvider(KUBEADM_DOUBLE, dirs["cp"])  # as the agent config gives it
    api = vpnapi_handlers(peer)
    server = FrameServer("vpnapi", ("127.0.0.1", 0), api.handlers(), accept_check=api.accept_check,
                         apis=(schema.VPNAPI,), peer_view=CorePeerView(peer)).start()
    # Loopback connections come from the Coordinator's own VPN IP: the module proves the Coordinator's key.
    key_file = tmp_path / "wg0.key"
    key_file.write_text(peer.context.node_state["vpn_priv_key"] + "\n")
    key_file.chmod(0o600)
    yield "127.0.0.1:%d" % server.address[1], str(key_file)
    server.stop()


def test_join_with_what_the_coordinator_hands_out_over_the_vpnapi(tmp_path, dirs, coordinator_vpnapi):
    """kubeadm_join coordinator_vpn_endpoint: the module asks the Coordinator's vpnapi (GetJoinArgs) for a
    fresh token, the pinned CA hash and its kubelet certificate, and joins (the double checks token and hash
    against the control plane's cluster); check mode and a second run ask nothing."""
    endpoint, key_file = coordinator_vpnapi
    join = {"kubeadm_path": KUBEADM_DOUBLE, "kubernetes_dir": dirs["worker"], "patches_dir": "",
            "coordinator_vpn_endpoint": endpoint, "vpn_priv_key_file": key_file, "node_name": "worker-0",
            "node_vpn_ip": "127.0.0.1"}
    env = {"KUBEADM_DOUBLE_CLUSTER": dirs["cp"]}
    from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import generate_priv_key

    stranger_key = tmp_path / "stranger.key"  # a process on the node without the agent's key
    stranger_key.write_text(generate_priv_key() + "\n")
    tasks = [
        _task("kubeadm_join", join, label="dry run", check_mode=True, register="dry", environment=env),
        _task("kubeadm_join", dict(join, vpn_priv_key_file=str(stranger_key)), label="stranger", register="stranger",
              environment=env, ignore_errors=True),
        _task("kubeadm_join", join, label="for real", register="joined", environment=env),
        _task("kubeadm_join", join, label="again", register="again", environment=env),
        _task("kubeadm_join", dict(join, token="abcdef.0123456789abcdef"), label="both", register="both",
              ignore_errors=True),
        _assert("dry.changed", "not dry.joined", "joined.changed", "joined.joined", "not again.changed",
                "joined.kubelet_cert_path == '%s/pki/kubelet-serving.crt'" % dirs["worker"],
                "both.failed", "'mutually exclusive: coordinator_vpn_endpoint|token' in both.msg",
                "stranger.failed", "'did not prove the WireGuard private key' in stranger.msg"),
    ]
    proc = run_playbook(tmp_path, tasks)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = double_log(tmp_path)
    joins = [e for e in log if e["argv"][0] == "join"]
    creates = [e for e in log if e["argv"][:2] == ["token", "create"]]
    assert len(joins) == 1 and joins[0]["rc"] == 0 and len(creates) == 1  # check mode and the re-run asked nothing
    discovery = joins[0]["config"][0]["discovery"]["bootstrapToken"]
    with open(os.path.join(dirs["cp"], "pki", "ca.crt"), "rb") as handle:
        from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm import ca_cert_hash
        assert discovery["caCertHashes"] == [ca_cert_hash(handle.read())]
    assert discovery["token"] not in proc.stdout and discovery["token"].split(".")[1] not in proc.stdout
    verify = subprocess.run(["openssl", "verify", "-CAfile", os.path.join(dirs["cp"], "pki", "ca.crt"),
                             os.path.join(dirs["worker"], "pki", "kubelet-serving.crt")],
                            capture_output=True, text=True, check=False)
    assert verify.returncode == 0, verify.stdout + verify.stderr
