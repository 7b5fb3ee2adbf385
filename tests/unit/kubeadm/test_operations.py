"""The Core's operations driven through the kubeadm TEST DOUBLE (tests/doubles/kubeadm) at the process
boundary: idempotence, CA pinning, tokens, certificate keys, and secrets kept off command lines."""

from __future__ import annotations

import os

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils import kubeadm
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ExternalCommandError
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.operations import _PrivateConfig

KUBEADM_DOUBLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "doubles", "kubeadm")


def _argv_text(log):
    return "\n".join(" ".join(e["argv"]) for e in log.entries())


def test_init_writes_cluster_and_returns_pins(initialised, double_log, control_plane_dir):
    assert initialised.changed
    assert kubeadm.is_initialised(control_plane_dir)
    with open(os.path.join(control_plane_dir, "pki", "ca.crt"), "rb") as handle:
        assert initialised.ca_cert_hash == kubeadm.ca_cert_hash(handle.read())
    assert kubeadm.validate_token(initialised.token)
    assert kubeadm.validate_certificate_key(initialised.certificate_key)
    assert "certificate-authority-data" in initialised.kubeconfig
    # The double saw the real configuration (with secrets), the argv carried none of them.
    entry = next(e for e in double_log.entries() if e["command"] == "init")
    assert "--upload-certs" in entry["argv"] and entry["rc"] == 0
    init_doc = entry["config"][0]
    assert init_doc["bootstrapTokens"][0]["token"] == initialised.token
    assert init_doc["certificateKey"] == initialised.certificate_key
    assert initialised.token not in _argv_text(double_log)
    assert initialised.certificate_key not in _argv_text(double_log)
    # What the caller may print is redacted.
    text = kubeadm.dump_documents(initialised.config)
    assert initialised.token not in text and initialised.certificate_key not in text
    # The audit policy the kube-apiserver mounts was written first.
    assert os.path.isfile(kubeadm.audit_policy_path(control_plane_dir))


def test_init_again_changes_nothing_and_runs_no_kubeadm(initialised, double_log, init_params, control_plane_dir):
    before = len(double_log.entries())
    again = kubeadm.init_control_plane(kubeadm.Kubeadm(KUBEADM_DOUBLE, control_plane_dir), init_params())
    assert not again.changed
    assert again.ca_cert_hash == initialised.ca_cert_hash
    assert again.kubeconfig == initialised.kubeconfig
    assert again.token is None and again.certificate_key is None
    assert len(double_log.entries()) == before


def test_double_refuses_a_second_init(initialised, control_plane_dir, init_params):
    """Our idempotence check is what prevents the double's preflight error, not luck: a full init on an
    initialised control plane fails kubeadm's preflight checks (manifests exist, ports in use)."""
    with _PrivateConfig(kubeadm.render_init(init_params())) as config_path:
        with pytest.raises(ExternalCommandError) as err:
            kubeadm.Kubeadm(KUBEADM_DOUBLE, control_plane_dir).init(config_path, False)
    assert err.value.rc != 0
    assert "[ERROR FileAvailable-" in err.value.stderr and "kube-apiserver.yaml already exists" in err.value.stderr
    assert "[ERROR Port-6443]" in err.value.stderr


def test_check_mode_runs_nothing(double_log, init_params, control_plane_dir):
    result = kubeadm.init_control_plane(kubeadm.Kubeadm(KUBEADM_DOUBLE, control_plane_dir), init_params(),
                                        upload_certs=True, check_mode=True)
    assert result.changed and result.kubeconfig is None
    assert result.config[0]["bootstrapTokens"][0]["token"] == "<redacted>"
    assert result.config[0]["certificateKey"] == "<redacted>"
    assert double_log.entries() == []
    assert not os.path.exists(control_plane_dir)


def test_missing_kubeadm_is_a_clear_error(tmp_path, init_params, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(kubeadm.KubeadmMissing, match="kubeadm was not found on PATH"):
        kubeadm.init_control_plane(kubeadm.Kubeadm(None, str(tmp_path / "k")), init_params(kubernetes_dir=str(tmp_path / "k")))
    assert not (tmp_path / "k").exists()  # refused before the audit policy or anything else was written
    with pytest.raises(kubeadm.KubeadmMissing, match="kubeadm_path"):
        kubeadm.Kubeadm(str(tmp_path / "nope"), str(tmp_path)).path  # noqa: B018


def test_failed_command_raises_external_command_error(tmp_path):
    calls = []

    def runner(argv, timeout):
        calls.append(argv)
        return kubeadm.CommandResult(3, "", "boom")

    cli = kubeadm.Kubeadm(KUBEADM_DOUBLE, str(tmp_path), runner=runner)
    with pytest.raises(ExternalCommandError) as err:
        cli.join("/x.yaml")
    assert err.value.rc == 3 and "boom" in str(err.value)
    assert calls[0][:2] == [KUBEADM_DOUBLE, "join"]


def _join(double_log, tmp_path, monkeypatch, initialised, control_plane_dir, **overrides):
    monkeypatch.setenv("KUBEADM_DOUBLE_CLUSTER", control_plane_dir)
    node_dir = overrides.pop("kubernetes_dir", str(tmp_path / "worker" / "kubernetes"))
    values = dict(api_server_endpoint="10.118.0.1:6443", token=initialised.token,
                  ca_cert_hash=initialised.ca_cert_hash, node_name="worker-0", node_vpn_ip="10.118.0.11",
                  kubernetes_dir=node_dir, patches_dir=None)
    values.update(overrides)
    return kubeadm.join_node(kubeadm.Kubeadm(KUBEADM_DOUBLE, node_dir), kubeadm.JoinParams(**values)), node_dir


def test_worker_join_pins_the_cluster_ca(initialised, double_log, tmp_path, monkeypatch, control_plane_dir):
    result, node_dir = _join(double_log, tmp_path, monkeypatch, initialised, control_plane_dir)
    assert result.changed and kubeadm.is_joined(node_dir)
    assert kubeadm.read_ca_cert_hash(node_dir) == initialised.ca_cert_hash
    entry = double_log.entries()[-1]
    assert entry["argv"][0] == "join" and entry["rc"] == 0
    assert entry["config"][0]["discovery"]["bootstrapToken"]["caCertHashes"] == [initialised.ca_cert_hash]
    assert initialised.token not in _argv_text(double_log)
    again, _log = _join(double_log, tmp_path, monkeypatch, initialised, control_plane_dir)
    assert not again.changed


def test_join_with_the_wrong_ca_pin_is_refused(initialised, double_log, tmp_path, monkeypatch, control_plane_dir):
    with pytest.raises(ExternalCommandError, match="pinned"):
        _join(double_log, tmp_path, monkeypatch, initialised, control_plane_dir, ca_cert_hash="sha256:" + "00" * 32)
    assert not kubeadm.is_joined(str(tmp_path / "worker" / "kubernetes"))


def test_join_with_an_unknown_token_is_refused(initialised, double_log, tmp_path, monkeypatch, control_plane_dir):
    with pytest.raises(ExternalCommandError, match="invalid for this cluster"):
        _join(double_log, tmp_path, monkeypatch, initialised, control_plane_dir, token=kubeadm.generate_token())


def test_control_plane_join_with_certificate_key(initialised, double_log, tmp_path, monkeypatch, control_plane_dir):
    result, node_dir = _join(double_log, tmp_path, monkeypatch, initialised, control_plane_dir,
                             node_name="control-plane-1", node_vpn_ip="10.118.0.2", control_plane=True,
                             certificate_key=initialised.certificate_key)
    assert result.changed and kubeadm.is_initialised(node_dir)
    assert initialised.certificate_key not in _argv_text(double_log)


def test_control_plane_join_with_a_wrong_certificate_key_fails(initialised, double_log, tmp_path, monkeypatch,
                                                               control_plane_dir):
    with pytest.raises(ExternalCommandError, match="certificate key"):
        _join(double_log, tmp_path, monkeypatch, initialised, control_plane_dir, node_name="control-plane-1",
              node_vpn_ip="10.118.0.2", control_plane=True, certificate_key=kubeadm.generate_certificate_key())


def test_control_plane_join_without_key_needs_the_pki(initialised, double_log, tmp_path, monkeypatch,
                                                      control_plane_dir):
    with pytest.raises(kubeadm.InputError) as err:
        _join(double_log, tmp_path, monkeypatch, initialised, control_plane_dir, node_name="control-plane-1",
              node_vpn_ip="10.118.0.2", control_plane=True)
    assert err.value.field == "certificate_key" and "ca.key" in str(err.value)
    # With the PKI shipped (as Constellation's join ticket does) the join skips download-certs and works.
    node_dir = str(tmp_path / "cp1" / "kubernetes")
    for name in kubeadm.CONTROL_PLANE_PKI_FILES:
        src, dst = os.path.join(control_plane_dir, "pki", name), os.path.join(node_dir, "pki", name)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(src, "rb") as a, open(dst, "wb") as b:
            b.write(a.read())
    result, _log = _join(double_log, tmp_path, monkeypatch, initialised, control_plane_dir, node_name="control-plane-1",
                         node_vpn_ip="10.118.0.2", control_plane=True, kubernetes_dir=node_dir)
    assert result.changed
    assert double_log.entries()[-1]["config"][0]["skipPhases"] == ["control-plane-prepare/download-certs"]


def test_token_lifecycle(initialised, double_log, control_plane_dir):
    cli = kubeadm.Kubeadm(KUBEADM_DOUBLE, control_plane_dir)
    created = kubeadm.ensure_token(cli, ttl="1h", description="for worker-3")
    assert created.changed and kubeadm.validate_token(created.token)
    ids = [t["token_id"] for t in created.tokens]
    assert created.token_id in ids and initialised.token.split(".")[0] in ids
    # The listing carries no secret halves.
    assert created.token.split(".")[1] not in repr(created.tokens)
    assert created.token not in _argv_text(double_log)
    # Same token again: nothing to do.
    assert not kubeadm.ensure_token(cli, token=created.token).changed
    # Same ID with another secret: replaced.
    other = created.token_id + "." + kubeadm.generate_token().split(".")[1]
    assert kubeadm.ensure_token(cli, token=other).changed
    removed = kubeadm.remove_token(cli, created.token_id)
    assert removed.changed and created.token_id not in [t["token_id"] for t in removed.tokens]
    assert not kubeadm.remove_token(cli, created.token_id).changed


def test_token_check_mode_creates_nothing(initialised, double_log, control_plane_dir):
    cli = kubeadm.Kubeadm(KUBEADM_DOUBLE, control_plane_dir)
    before = kubeadm.list_tokens(cli).tokens
    assert kubeadm.ensure_token(cli, check_mode=True).changed
    assert kubeadm.list_tokens(cli).tokens == before
    tid = before[0]["token_id"]
    assert kubeadm.remove_token(cli, tid, check_mode=True).changed
    assert kubeadm.list_tokens(cli).tokens == before


def test_tokens_need_a_control_plane(tmp_path):
    with pytest.raises(kubeadm.StateError, match="admin.conf"):
        kubeadm.ensure_token(kubeadm.Kubeadm(KUBEADM_DOUBLE, str(tmp_path)))


def test_parse_token_list_stream_without_secrets():
    text = ('{"kind": "BootstrapToken", "apiVersion": "output.kubeadm.k8s.io/v1alpha3", '
            '"token": "abcdef.0123456789abcdef", "description": "d", "expires": "2030-01-01T00:00:00Z", '
            '"usages": ["signing"], "groups": ["system:bootstrappers:kubeadm:default-node-token"]}\n'
            '{\n "kind": "BootstrapToken", "token": "zyxwvu.0123456789abcdef"\n}\n')
    tokens = kubeadm.parse_token_list(text)
    assert [t.token_id for t in tokens] == ["abcdef", "zyxwvu"]
    assert tokens[0].usages == ("signing",) and tokens[1].expires is None
    assert "0123456789abcdef" not in repr([t.as_dict() for t in tokens])
    assert kubeadm.parse_token_list("") == []
    with pytest.raises(kubeadm.ConstellationError):
        kubeadm.parse_token_list("TOKEN TTL EXPIRES")


def test_upload_certs_phase(initialised, double_log, control_plane_dir):
    cli = kubeadm.Kubeadm(KUBEADM_DOUBLE, control_plane_dir)
    key = kubeadm.generate_certificate_key()
    docs = [{"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "InitConfiguration", "certificateKey": key}]
    with _PrivateConfig(docs) as path:
        cli.upload_certs(path)
    entry = double_log.entries()[-1]
    assert entry["argv"][:3] == ["init", "phase", "upload-certs"] and entry["rc"] == 0
    assert key not in _argv_text(double_log)
