"""The Core's operations driven through the kubeadm TEST DOUBLE (tests/doubles/kubeadm) at the process
boundary: idempotence, CA pinning, tokens, certificate keys, and secrets kept off command lines."""

from __future__ import annotations

import os

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils import kubeadm as core
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ExternalCommandError

KUBEADM_DOUBLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "doubles", "kubeadm")


def _argv_text(log):
    return "\n".join(" ".join(e["argv"]) for e in log.entries())


def test_init_writes_cluster_and_returns_pins(initialised, double_log, control_plane_dir):
    assert initialised.changed
    assert core.is_initialised(control_plane_dir)
    with open(os.path.join(control_plane_dir, "pki", "ca.crt"), "rb") as handle:
        assert initialised.ca_cert_hash == core.ca_cert_hash(handle.read())
    assert core.validate_token(initialised.token)
    assert core.validate_certificate_key(initialised.certificate_key)
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
    text = core.dump_documents(initialised.config)
    assert initialised.token not in text and initialised.certificate_key not in text
    # The audit policy the kube-apiserver mounts was written first.
    assert os.path.isfile(core.audit_policy_path(control_plane_dir))


def test_init_again_changes_nothing_and_runs_no_kubeadm(initialised, double_log, init_params, control_plane_dir):
    before = len(double_log.entries())
    again = core.init_control_plane(core.Kubeadm(KUBEADM_DOUBLE, control_plane_dir), init_params())
    assert not again.changed
    assert again.ca_cert_hash == initialised.ca_cert_hash
    assert again.kubeconfig == initialised.kubeconfig
    assert again.token is None and again.certificate_key is None
    assert len(double_log.entries()) == before


def test_double_refuses_a_second_init(initialised, control_plane_dir, init_params):
    """Our idempotence check is what prevents the double's preflight error, not luck: a full init on an
    initialised control plane fails kubeadm's preflight checks (manifests exist, ports in use)."""
    with core._PrivateConfig(core.render_init(init_params())) as config_path:
        with pytest.raises(ExternalCommandError) as err:
            core.Kubeadm(KUBEADM_DOUBLE, control_plane_dir).init(config_path, False)
    assert err.value.rc != 0
    assert "[ERROR FileAvailable-" in err.value.stderr and "kube-apiserver.yaml already exists" in err.value.stderr
    assert "[ERROR Port-6443]" in err.value.stderr


def test_check_mode_runs_nothing(double_log, init_params, control_plane_dir):
    result = core.init_control_plane(core.Kubeadm(KUBEADM_DOUBLE, control_plane_dir), init_params(),
                                     upload_certs=True, check_mode=True)
    assert result.changed and result.kubeconfig is None
    assert result.config[0]["bootstrapTokens"][0]["token"] == "<redacted>"
    assert result.config[0]["certificateKey"] == "<redacted>"
    assert double_log.entries() == []
    assert not os.path.exists(control_plane_dir)


def test_missing_kubeadm_is_a_clear_error(tmp_path, init_params, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(core.KubeadmMissing, match="kubeadm was not found on PATH"):
        core.init_control_plane(core.Kubeadm(None, str(tmp_path / "k")), init_params(kubernetes_dir=str(tmp_path / "k")))
    assert not (tmp_path / "k").exists()  # refused before the audit policy or anything else was written
    with pytest.raises(core.KubeadmMissing, match="kubeadm_path"):
        core.Kubeadm(str(tmp_path / "nope"), str(tmp_path)).path  # noqa: B018


def test_failed_command_raises_external_command_error(tmp_path):
    calls = []

    def runner(argv, timeout):
        calls.append(argv)
        return core.CommandResult(3, "", "boom")

    kubeadm = core.Kubeadm(KUBEADM_DOUBLE, str(tmp_path), runner=runner)
    with pytest.raises(ExternalCommandError) as err:
        kubeadm.join("/x.yaml")
    assert err.value.rc == 3 and "boom" in str(err.value)
    assert calls[0][:2] == [KUBEADM_DOUBLE, "join"]


def _join(double_log, tmp_path, monkeypatch, initialised, control_plane_dir, **overrides):
    monkeypatch.setenv("KUBEADM_DOUBLE_CLUSTER", control_plane_dir)
    node_dir = overrides.pop("kubernetes_dir", str(tmp_path / "worker" / "kubernetes"))
    values = dict(api_server_endpoint="10.118.0.1:6443", token=initialised.token,
                  ca_cert_hash=initialised.ca_cert_hash, node_name="worker-0", node_vpn_ip="10.118.0.11",
                  kubernetes_dir=node_dir, patches_dir=None)
    values.update(overrides)
    return core.join_node(core.Kubeadm(KUBEADM_DOUBLE, node_dir), core.JoinParams(**values)), node_dir


def test_worker_join_pins_the_cluster_ca(initialised, double_log, tmp_path, monkeypatch, control_plane_dir):
    result, node_dir = _join(double_log, tmp_path, monkeypatch, initialised, control_plane_dir)
    assert result.changed and core.is_joined(node_dir)
    assert core.read_ca_cert_hash(node_dir) == initialised.ca_cert_hash
    entry = double_log.entries()[-1]
    assert entry["argv"][0] == "join" and entry["rc"] == 0
    assert entry["config"][0]["discovery"]["bootstrapToken"]["caCertHashes"] == [initialised.ca_cert_hash]
    assert initialised.token not in _argv_text(double_log)
    again, _log = _join(double_log, tmp_path, monkeypatch, initialised, control_plane_dir)
    assert not again.changed


def test_join_with_the_wrong_ca_pin_is_refused(initialised, double_log, tmp_path, monkeypatch, control_plane_dir):
    with pytest.raises(ExternalCommandError, match="pinned"):
        _join(double_log, tmp_path, monkeypatch, initialised, control_plane_dir, ca_cert_hash="sha256:" + "00" * 32)
    assert not core.is_joined(str(tmp_path / "worker" / "kubernetes"))


def test_join_with_an_unknown_token_is_refused(initialised, double_log, tmp_path, monkeypatch, control_plane_dir):
    with pytest.raises(ExternalCommandError, match="invalid for this cluster"):
        _join(double_log, tmp_path, monkeypatch, initialised, control_plane_dir, token=core.generate_token())


def test_control_plane_join_with_certificate_key(initialised, double_log, tmp_path, monkeypatch, control_plane_dir):
    result, node_dir = _join(double_log, tmp_path, monkeypatch, initialised, control_plane_dir,
                             node_name="control-plane-1", node_vpn_ip="10.118.0.2", control_plane=True,
                             certificate_key=initialised.certificate_key)
    assert result.changed and core.is_initialised(node_dir)
    assert initialised.certificate_key not in _argv_text(double_log)


def test_control_plane_join_with_a_wrong_certificate_key_fails(initialised, double_log, tmp_path, monkeypatch,
                                                               control_plane_dir):
    with pytest.raises(ExternalCommandError, match="certificate key"):
        _join(double_log, tmp_path, monkeypatch, initialised, control_plane_dir, node_name="control-plane-1",
              node_vpn_ip="10.118.0.2", control_plane=True, certificate_key=core.generate_certificate_key())


def test_control_plane_join_without_key_needs_the_pki(initialised, double_log, tmp_path, monkeypatch,
                                                      control_plane_dir):
    with pytest.raises(core.InputError) as err:
        _join(double_log, tmp_path, monkeypatch, initialised, control_plane_dir, node_name="control-plane-1",
              node_vpn_ip="10.118.0.2", control_plane=True)
    assert err.value.field == "certificate_key" and "ca.key" in str(err.value)
    # With the PKI shipped (as Constellation's join ticket does) the join skips download-certs and works.
    node_dir = str(tmp_path / "cp1" / "kubernetes")
    for name in core.CONTROL_PLANE_PKI_FILES:
        src, dst = os.path.join(control_plane_dir, "pki", name), os.path.join(node_dir, "pki", name)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(src, "rb") as a, open(dst, "wb") as b:
            b.write(a.read())
    result, _log = _join(double_log, tmp_path, monkeypatch, initialised, control_plane_dir, node_name="control-plane-1",
                         node_vpn_ip="10.118.0.2", control_plane=True, kubernetes_dir=node_dir)
    assert result.changed
    assert double_log.entries()[-1]["config"][0]["skipPhases"] == ["control-plane-prepare/download-certs"]


def test_token_lifecycle(initialised, double_log, control_plane_dir):
    kubeadm = core.Kubeadm(KUBEADM_DOUBLE, control_plane_dir)
    created = core.ensure_token(kubeadm, ttl="1h", description="for worker-3")
    assert created.changed and core.validate_token(created.token)
    ids = [t["token_id"] for t in created.tokens]
    assert created.token_id in ids and initialised.token.split(".")[0] in ids
    # The listing carries no secret halves.
    assert created.token.split(".")[1] not in repr(created.tokens)
    assert created.token not in _argv_text(double_log)
    # Same token again: nothing to do.
    assert not core.ensure_token(kubeadm, token=created.token).changed
    # Same ID with another secret: replaced.
    other = created.token_id + "." + core.generate_token().split(".")[1]
    assert core.ensure_token(kubeadm, token=other).changed
    removed = core.remove_token(kubeadm, created.token_id)
    assert removed.changed and created.token_id not in [t["token_id"] for t in removed.tokens]
    assert not core.remove_token(kubeadm, created.token_id).changed


def test_token_check_mode_creates_nothing(initialised, double_log, control_plane_dir):
    kubeadm = core.Kubeadm(KUBEADM_DOUBLE, control_plane_dir)
    before = core.list_tokens(kubeadm).tokens
    assert core.ensure_token(kubeadm, check_mode=True).changed
    assert core.list_tokens(kubeadm).tokens == before
    tid = before[0]["token_id"]
    assert core.remove_token(kubeadm, tid, check_mode=True).changed
    assert core.list_tokens(kubeadm).tokens == before


def test_tokens_need_a_control_plane(tmp_path):
    with pytest.raises(core.StateError, match="admin.conf"):
        core.ensure_token(core.Kubeadm(KUBEADM_DOUBLE, str(tmp_path)))


def test_parse_token_list_stream_without_secrets():
    text = ('{"kind": "BootstrapToken", "apiVersion": "output.kubeadm.k8s.io/v1alpha3", '
            '"token": "abcdef.0123456789abcdef", "description": "d", "expires": "2030-01-01T00:00:00Z", '
            '"usages": ["signing"], "groups": ["system:bootstrappers:kubeadm:default-node-token"]}\n'
            '{\n "kind": "BootstrapToken", "token": "zyxwvu.0123456789abcdef"\n}\n')
    tokens = core.parse_token_list(text)
    assert [t.token_id for t in tokens] == ["abcdef", "zyxwvu"]
    assert tokens[0].usages == ("signing",) and tokens[1].expires is None
    assert "0123456789abcdef" not in repr([t.as_dict() for t in tokens])
    assert core.parse_token_list("") == []
    with pytest.raises(core.ConstellationError):
        core.parse_token_list("TOKEN TTL EXPIRES")


def test_upload_certs_phase(initialised, double_log, control_plane_dir):
    kubeadm = core.Kubeadm(KUBEADM_DOUBLE, control_plane_dir)
    key = core.generate_certificate_key()
    docs = [{"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "InitConfiguration", "certificateKey": key}]
    with core._PrivateConfig(docs) as path:
        kubeadm.upload_certs(path)
    entry = double_log.entries()[-1]
    assert entry["argv"][:3] == ["init", "phase", "upload-certs"] and entry["rc"] == 0
    assert key not in _argv_text(double_log)
