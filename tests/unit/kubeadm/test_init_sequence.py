"""Constellation's init sequence (docs/kubeadm.md), driven through the kubeadm TEST DOUBLE (tests/doubles/kubeadm)
at the process boundary: the order of the kubeadm commands, the files each step leaves, the kubelet's
serving certificate signed by the new cluster CA, and the ``<clusterName>-admin`` kubeconfig in
``system:masters``; and what the double itself accepts and refuses of kubeadm's init CLI."""

from __future__ import annotations

import base64
import os
import stat
import subprocess
import sys

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ansible_collections.constellation.cluster.plugins.module_utils import kubeadm
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ExternalCommandError

KUBEADM_DOUBLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "doubles", "kubeadm")

SEQUENCE = [
    ("init phase preflight", ["init", "phase", "preflight", "-v=5", "--config"]),
    ("init phase certs all", ["init", "phase", "certs", "all", "-v=5", "--config"]),
    ("init", ["init", "-v=5", "--skip-phases=preflight,certs,addon/coredns,addon/kube-proxy", "--config"]),
    ("kubeconfig user", ["kubeconfig", "user", "--client-name", "constellation-admin", "--config"]),
]


def _ca(control_plane_dir):
    with open(os.path.join(control_plane_dir, "pki", "ca.crt"), "rb") as handle:
        return x509.load_pem_x509_certificate(handle.read())


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def _client_cert(kubeconfig_text):
    doc = yaml.safe_load(kubeconfig_text)
    return doc, x509.load_pem_x509_certificate(base64.b64decode(doc["users"][0]["user"]["client-certificate-data"]))


def test_init_runs_constellations_sequence_in_order(initialised, double_log, control_plane_dir):
    entries = double_log.entries()
    assert [e["command"] for e in entries] == [name for name, _argv in SEQUENCE]
    for entry, (_name, argv) in zip(entries, SEQUENCE):
        assert entry["argv"][:len(argv)] == argv and entry["rc"] == 0
    # Every command read the same generated configuration (the one with the node's hardening in it).
    assert all(e["config"] == entries[0]["config"] for e in entries)
    # The final init ran every phase except those already done and the skipped addons.
    final = entries[2]["phases"]
    assert "preflight" not in final and not any(p.startswith("certs") for p in final)
    assert "addon/coredns" not in final and "addon/kube-proxy" not in final
    assert final[:2] == ["kubeconfig/admin", "kubeconfig/super-admin"] and "wait-control-plane" in final
    assert "upload-certs" in final and "bootstrap-token" in final
    # The module reports each step in order, with the command it ran.
    assert [p["name"] for p in initialised.phases] == list(kubeadm.INIT_STEPS)
    assert {p["status"] for p in initialised.phases} == {"ran"}
    assert initialised.phases[1]["command"] == "kubeadm init phase preflight"
    assert initialised.phases[5]["command"].startswith("kubeadm init --skip-phases=preflight,certs,addon/coredns,")


def test_init_writes_what_kubeadm_writes(initialised, control_plane_dir):
    for name in ("admin.conf", "super-admin.conf", "kubelet.conf", "controller-manager.conf", "scheduler.conf",
                 "manifests/kube-apiserver.yaml", "manifests/kube-controller-manager.yaml",
                 "manifests/kube-scheduler.yaml", "manifests/etcd.yaml", "pki/apiserver.crt", "pki/sa.key",
                 "pki/front-proxy-client.crt", "pki/etcd/server.crt", "pki/apiserver-etcd-client.crt"):
        assert os.path.isfile(os.path.join(control_plane_dir, name)), name
    missing = kubeadm.missing_control_plane_pki(control_plane_dir)
    assert missing == []
    # The audit policy sits where the API server's audit-policy-file flag points, and is Constellation's.
    with open(os.path.join(control_plane_dir, "manifests", "kube-apiserver.yaml"), encoding="utf-8") as handle:
        command = yaml.safe_load(handle)["spec"]["containers"][0]["command"]
    policy = next(arg.split("=", 1)[1] for arg in command if arg.startswith("--audit-policy-file="))
    with open(policy, encoding="utf-8") as handle:
        assert yaml.safe_load(handle) == {"apiVersion": "audit.k8s.io/v1", "kind": "Policy",
                                          "rules": [{"level": "Metadata"}]}
    # The API server certificate was issued by the cluster CA for the VPN IP.
    with open(os.path.join(control_plane_dir, "pki", "apiserver.crt"), "rb") as handle:
        apiserver = x509.load_pem_x509_certificate(handle.read())
    apiserver.verify_directly_issued_by(_ca(control_plane_dir))
    sans = apiserver.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "10.118.0.1" in [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]


def test_kubelet_serving_cert_is_signed_by_the_cluster_ca(initialised, double_log, control_plane_dir):
    kubelet_doc = next(d for d in double_log.entries()[2]["config"] if d["kind"] == "KubeletConfiguration")
    cert_path, key_path = kubelet_doc["tlsCertFile"], kubelet_doc["tlsPrivateKeyFile"]
    assert cert_path == os.path.join(control_plane_dir, "pki", "kubelet-serving.crt")
    with open(cert_path, "rb") as handle:
        cert = x509.load_pem_x509_certificate(handle.read())
    with open(key_path, "rb") as handle:
        key_pem = handle.read()
    assert _mode(key_path) == 0o600
    cert.verify_directly_issued_by(_ca(control_plane_dir))  # raises unless the cluster CA signed it
    key = serialization.load_pem_private_key(key_pem, None)
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    assert key.public_key().public_bytes(serialization.Encoding.DER, spki) == \
        cert.public_key().public_bytes(serialization.Encoding.DER, spki)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:control-plane-0"
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == ["system:nodes"]
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["10.118.0.1"]
    assert sans.get_values_for_type(x509.DNSName) == ["control-plane-0"]
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    key_usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert key_usage.digital_signature and key_usage.key_encipherment and not key_usage.key_cert_sign


def test_admin_kubeconfig_is_cluster_admin_in_system_masters(double_log, init_params, control_plane_dir):
    params = init_params(cluster_name="prod")
    result = kubeadm.init_control_plane(kubeadm.Kubeadm(KUBEADM_DOUBLE, control_plane_dir), params)
    doc, cert = _client_cert(result.kubeconfig)
    assert doc["users"][0]["name"] == "prod-admin"
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "prod-admin"
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == ["system:masters"]
    cert.verify_directly_issued_by(_ca(control_plane_dir))
    with open(os.path.join(control_plane_dir, "pki", "ca.crt"), "rb") as handle:
        assert base64.b64decode(doc["clusters"][0]["cluster"]["certificate-authority-data"]) == handle.read()
    assert doc["clusters"][0]["cluster"]["server"] == "https://10.118.0.1:6443"
    # Kept on the node like admin.conf, readable by root only, and it is what was returned.
    path = os.path.join(control_plane_dir, "prod-admin.conf")
    assert _mode(path) == 0o600
    with open(path, encoding="utf-8") as handle:
        assert handle.read() == result.kubeconfig
    user = next(e for e in double_log.entries() if e["command"] == "kubeconfig user")
    assert user["argv"][user["argv"].index("--client-name") + 1] == "prod-admin"
    assert user["argv"][user["argv"].index("--org") + 1] == "system:masters"


def test_kube_proxy_when_asked_for(double_log, init_params, control_plane_dir):
    kubeadm.init_control_plane(kubeadm.Kubeadm(KUBEADM_DOUBLE, control_plane_dir), init_params(kube_proxy=True))
    final = next(e for e in double_log.entries() if e["command"] == "init")
    assert "--skip-phases=preflight,certs,addon/coredns" in final["argv"]
    assert "addon/kube-proxy" in final["phases"] and "addon/coredns" not in final["phases"]


def test_initialised_control_plane_runs_nothing_again(initialised, double_log, init_params, control_plane_dir):
    before = len(double_log.entries())
    serving = os.path.join(control_plane_dir, "pki", "kubelet-serving.crt")
    with open(serving, "rb") as handle:
        serving_before = handle.read()
    again = kubeadm.init_control_plane(kubeadm.Kubeadm(KUBEADM_DOUBLE, control_plane_dir), init_params(), upload_certs=True)
    assert not again.changed
    assert len(double_log.entries()) == before
    assert {p["status"] for p in again.phases} == {"done before"}
    assert again.kubeconfig == initialised.kubeconfig
    with open(serving, "rb") as handle:
        assert handle.read() == serving_before


def test_missing_admin_kubeconfig_is_made_again_and_nothing_else(initialised, double_log, init_params,
                                                                 control_plane_dir):
    os.remove(os.path.join(control_plane_dir, "constellation-admin.conf"))
    before = len(double_log.entries())
    again = kubeadm.init_control_plane(kubeadm.Kubeadm(KUBEADM_DOUBLE, control_plane_dir), init_params())
    assert again.changed and again.token is None
    assert [e["command"] for e in double_log.entries()[before:]] == ["kubeconfig user"]
    assert [p["name"] for p in again.phases if p["status"] == "ran"] == ["admin-kubeconfig"]
    _doc, cert = _client_cert(again.kubeconfig)
    cert.verify_directly_issued_by(_ca(control_plane_dir))


def test_check_mode_reports_every_step_and_runs_none(double_log, init_params, control_plane_dir):
    result = kubeadm.init_control_plane(kubeadm.Kubeadm(KUBEADM_DOUBLE, control_plane_dir), init_params(), check_mode=True)
    assert result.changed and [p["status"] for p in result.phases] == ["would run"] * len(kubeadm.INIT_STEPS)
    assert double_log.entries() == [] and not os.path.exists(control_plane_dir)


def test_unknown_skip_phase_is_an_input_error(init_params):
    with pytest.raises(kubeadm.InputError) as err:
        init_params(skip_phases=["addon/kube-dns"])
    assert err.value.field == "skip_phases"


def test_sign_kubelet_csr_checks_the_request_as_the_join_service_does(initialised, control_plane_dir):
    pki = os.path.join(control_plane_dir, "pki")
    with open(os.path.join(pki, "ca.crt"), "rb") as handle:
        ca_pem = handle.read()
    with open(os.path.join(pki, "ca.key"), "rb") as handle:
        ca_key = handle.read()
    pair = kubeadm.kubelet_csr("worker-0", ["10.118.0.11"])
    cert = x509.load_pem_x509_certificate(kubeadm.sign_kubelet_csr(pair.csr_pem, ca_pem, ca_key))
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days == 365
    # A CSR claiming system:masters instead of system:nodes is refused.
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    key = ec.generate_private_key(ec.SECP256R1())
    bad = (x509.CertificateSigningRequestBuilder().subject_name(x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
        x509.NameAttribute(NameOID.COMMON_NAME, "system:node:worker-0")])).sign(key, hashes.SHA256()))
    with pytest.raises(kubeadm.InputError, match="exactly one organization system:nodes"):
        kubeadm.sign_kubelet_csr(bad.public_bytes(serialization.Encoding.PEM), ca_pem, ca_key)


# --------------------------------------------------------------------------- the double's init CLI


def _double(config_path, *argv):
    return subprocess.run([sys.executable, KUBEADM_DOUBLE] + list(argv) + ["--config", config_path],
                          capture_output=True, text=True, check=False)


@pytest.fixture
def config_path(init_params, tmp_path):
    path = tmp_path / "kubeadm.yaml"
    path.write_text(kubeadm.dump_documents(kubeadm.render_init(init_params())))
    os.chmod(path, 0o600)
    return str(path)


@pytest.mark.parametrize("argv, message", [
    (["init", "--skip-phases=preflight,addon/kube-dns"], "invalid phase name: addon/kube-dns"),
    (["init", "phase", "certificates", "all"], "unknown command 'certificates' for \"kubeadm init phase\""),
    (["init", "phase", "certs", "everything"], "unknown command 'everything' for \"kubeadm init phase certs\""),
    (["init", "phase", "certs"], "needs a sub-phase"),
    (["init", "phase", "preflight", "--upload-certs"], "unknown flag: --upload-certs"),
    (["init", "--apiserver-advertise-address", "10.118.0.1"], "can not mix '--config' with arguments"),
])
def test_double_refuses_what_kubeadm_refuses(config_path, argv, message):
    proc = _double(config_path, *argv)
    assert proc.returncode == 1 and message in proc.stderr


def test_double_init_skipping_certs_needs_the_pki(config_path, control_plane_dir):
    proc = _double(config_path, "init", "--skip-phases=preflight,certs")
    assert proc.returncode == 1 and "the CA files couldn't be loaded" in proc.stderr


def test_double_needs_the_kubelet_serving_cert_before_the_control_plane_comes_up(config_path, control_plane_dir):
    os.makedirs(control_plane_dir)
    with open(os.path.join(control_plane_dir, "audit-policy.yaml"), "w", encoding="utf-8") as handle:
        handle.write("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: Metadata}]\n")
    assert _double(config_path, "init", "phase", "certs", "all").returncode == 0
    proc = _double(config_path, "init", "--skip-phases=preflight,certs")
    assert proc.returncode == 1 and "tlsCertFile" in proc.stderr and "the kubelet would not start" in proc.stderr


def test_double_reuses_existing_certs_and_refuses_a_second_full_init(initialised, config_path, control_plane_dir):
    with open(os.path.join(control_plane_dir, "pki", "ca.crt"), "rb") as handle:
        ca_before = handle.read()
    proc = _double(config_path, "init")
    assert proc.returncode == 1 and "[preflight] Some fatal errors occurred" in proc.stderr
    # As kubeadm: the preflight errors can be ignored, and then init reuses the CA and certificates on disk.
    proc = _double(config_path, "init", "--ignore-preflight-errors=all")
    assert proc.returncode == 0, proc.stderr
    with open(os.path.join(control_plane_dir, "pki", "ca.crt"), "rb") as handle:
        assert handle.read() == ca_before
    with pytest.raises(ExternalCommandError):
        kubeadm.Kubeadm(KUBEADM_DOUBLE, control_plane_dir).init_phase(["preflight"], config_path)
