# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kubernetes' etcd snapshot (kubeadm/etcd_snapshot.py) against a REAL etcd (/usr/bin/etcd) with TLS from a
throwaway CA in kubeadm's layout (pki/etcd/ca.crt, server, healthcheck-client): the round trip, the integrity
check etcd's appended SHA-256 allows, and the refusals - another CA, no client certificate, a small max_size."""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import json
import os
import shutil
import stat
import tempfile
import uuid

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm import etcd_snapshot
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.store import EtcdStore
from ansible_collections.constellation.cluster.tests.unit.worker_fixtures import worker_fixture
from lab.etcd import Etcd, free_ports, tmpfs_dir


def _ca(name):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def _leaf(ca_key, ca_cert, name, server):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH] if server else [ExtendedKeyUsageOID.CLIENT_AUTH]
    builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
               .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


def _write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data)
    os.chmod(path, 0o600)


def _kubeadm_pki(base, ca_key, ca_cert):
    """<base>/pki in kubeadm's layout: etcd/ca.crt, etcd/server.*, etcd/healthcheck-client.*."""
    from cryptography.hazmat.primitives import serialization

    etcd_dir = os.path.join(base, "pki", "etcd")
    _write(os.path.join(etcd_dir, "ca.crt"), ca_cert.public_bytes(serialization.Encoding.PEM))
    for name, server in (("server", True), ("healthcheck-client", False)):
        cert, key = _leaf(ca_key, ca_cert, "kube-etcd-" + name, server)
        _write(os.path.join(etcd_dir, name + ".crt"), cert)
        _write(os.path.join(etcd_dir, name + ".key"), key)
    return etcd_dir


@worker_fixture
def kubernetes_etcd(get):  # pylint: disable=unused-argument
    """A real /usr/bin/etcd with TLS (client certificates required) from a throwaway CA in kubeadm's layout;
    {"etcd", "kubernetes_dir", "other_dir"} (other_dir: the same layout from another CA)."""
    if not os.path.exists("/usr/bin/etcd"):
        pytest.skip("/usr/bin/etcd is missing (apt-get install etcd-server)")
    base = tempfile.mkdtemp(prefix="k8s-etcd-", dir=tmpfs_dir())
    ca_key, ca_cert = _ca("etcd-ca")
    etcd_dir = _kubeadm_pki(os.path.join(base, "kubernetes"), ca_key, ca_cert)
    other_key, other_cert = _ca("etcd-ca")  # same name, another key: an impostor's CA
    _kubeadm_pki(os.path.join(base, "other"), other_key, other_cert)
    client_port, peer_port = free_ports(2)
    server = Etcd(os.path.join(base, "data"), client_port, peer_port, name="k8s",
                  tls={"ca_cert": os.path.join(etcd_dir, "ca.crt"), "cert": os.path.join(etcd_dir, "server.crt"),
                       "key": os.path.join(etcd_dir, "server.key")})
    server.start()
    try:
        yield {"etcd": server, "kubernetes_dir": os.path.join(base, "kubernetes"), "other_dir": os.path.join(base, "other")}
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def tls(kubernetes_etcd):
    return etcd_snapshot.kubeadm_tls(kubernetes_etcd["kubernetes_dir"])


def test_snapshot_round_trip_holds_the_keys_and_verifies(kubernetes_etcd, tls):
    secret = b"kubernetes-secret-" + uuid.uuid4().hex.encode()
    store = EtcdStore([kubernetes_etcd["etcd"].url], prefix="/registry/", tls=tls)
    try:
        store.put("secrets/default/token-%s" % uuid.uuid4().hex, secret)
    finally:
        store.close()
    snap = etcd_snapshot.take(kubernetes_etcd["etcd"].endpoint, tls)
    assert secret in snap.data  # the database itself, as etcdutl snapshot restore reads it
    assert snap.sha256 == hashlib.sha256(snap.data).hexdigest() == etcd_snapshot.verify(snap.data)
    assert snap.data[-32:] == hashlib.sha256(snap.data[:-32]).digest()  # etcd's own digest, appended
    assert snap.revision >= 2 and snap.etcd_version.startswith("3.")
    assert secret.decode() not in repr(snap) and "sha256" in repr(snap)
    # Unchanged etcd, same snapshot: the backup's fingerprint can say "unchanged".
    assert etcd_snapshot.take("https://" + kubernetes_etcd["etcd"].endpoint, tls).sha256 == snap.sha256


def test_truncated_or_altered_snapshot_is_refused(kubernetes_etcd, tls):
    data = etcd_snapshot.take(kubernetes_etcd["etcd"].endpoint, tls).data
    with pytest.raises(etcd_snapshot.SnapshotError, match="damaged.*truncated or altered"):
        etcd_snapshot.verify(data[:-1000], "backup.enc's snapshot")
    altered = bytearray(data)
    altered[len(altered) // 2] ^= 0x01
    with pytest.raises(etcd_snapshot.SnapshotError, match="backup.enc's snapshot is damaged"):
        etcd_snapshot.verify(bytes(altered), "backup.enc's snapshot")
    with pytest.raises(etcd_snapshot.SnapshotError, match="too short"):
        etcd_snapshot.verify(data[:100])
    fake = b"\0" * 8192
    with pytest.raises(etcd_snapshot.SnapshotError, match="no etcd snapshot"):
        etcd_snapshot.verify(fake + hashlib.sha256(fake).digest())


def test_another_ca_is_refused_naming_the_endpoint(kubernetes_etcd, tls):
    other = etcd_snapshot.kubeadm_tls(kubernetes_etcd["other_dir"])
    # The impostor's CA does not verify the real server; the real CA with the impostor's client
    # certificate is refused by etcd.
    with pytest.raises(etcd_snapshot.SnapshotError, match="https://%s: the TLS handshake failed: its server certificate is not one of the pinned CA"
                       % kubernetes_etcd["etcd"].endpoint):
        etcd_snapshot.take(kubernetes_etcd["etcd"].endpoint, dict(tls, ca_cert=other["ca_cert"]))
    with pytest.raises(etcd_snapshot.SnapshotError, match="https://%s: the TLS handshake failed: it refused the client certificate"
                       % kubernetes_etcd["etcd"].endpoint):
        etcd_snapshot.take(kubernetes_etcd["etcd"].endpoint, dict(tls, cert=other["cert"], key=other["key"]))


def test_no_client_certificate_is_refused(kubernetes_etcd, tls):
    with pytest.raises(etcd_snapshot.SnapshotError, match="https://%s: the TLS handshake failed: it asks for a client certificate "
                       "and none was given" % kubernetes_etcd["etcd"].endpoint):
        etcd_snapshot.take(kubernetes_etcd["etcd"].endpoint, {"ca_cert": tls["ca_cert"]})


def test_bounds_and_inputs(kubernetes_etcd, tls, tmp_path):
    with pytest.raises(etcd_snapshot.SnapshotError, match="more than max_size 4096: nothing was taken"):
        etcd_snapshot.take(kubernetes_etcd["etcd"].endpoint, tls, max_size=4096)
    with pytest.raises(InputError, match="max_size"):
        etcd_snapshot.take(kubernetes_etcd["etcd"].endpoint, tls, max_size=etcd_snapshot.MAX_SIZE + 1)
    with pytest.raises(InputError, match="https://"):
        etcd_snapshot.take("http://" + kubernetes_etcd["etcd"].endpoint, tls)
    with pytest.raises(InputError, match="no kubeadm control plane"):
        etcd_snapshot.kubeadm_tls(str(tmp_path))
    port = free_ports(1)[0]
    with pytest.raises(etcd_snapshot.SnapshotError, match="https://127.0.0.1:%d did not answer" % port):
        etcd_snapshot.take("127.0.0.1:%d" % port, tls)


def test_a_real_snapshot_goes_into_the_encrypted_backup_and_comes_back(kubernetes_etcd, tls, tmp_path):
    from ansible_collections.constellation.cluster.plugins.module_utils import kms
    from ansible_collections.constellation.cluster.plugins.plugin_utils import backup

    master, salt = kms.MasterSecret.generate(), os.urandom(32)
    cluster_id = kms.ClusterKMS(master).cluster_id(salt)
    exported = {"format": "constellation.cluster/coordinator-state/v1", "vpn_ip": "10.118.0.1", "items": {},
                "cluster_id": base64.b64encode(cluster_id).decode()}
    snap = etcd_snapshot.take(kubernetes_etcd["etcd"].endpoint, tls)
    manifest, data, name = backup.seal(kms.ClusterKMS(master), exported, "192.0.2.10:9000", {"revision": snap.revision}, snap.data)
    path = backup.write(str(tmp_path), manifest, data, name)
    assert backup.kubernetes_etcd_entry(manifest)["sha256"] == snap.sha256
    assert backup.open_all(path, kms.ClusterKMS(master), cluster_id)[2] == snap.data


def _run(capsys, args, check_mode=False, diff=False):
    from ansible.module_utils.testing import patch_module_args

    from ansible_collections.constellation.cluster.plugins.modules import kubernetes_etcd_snapshot

    with patch_module_args(dict(args, _ansible_check_mode=check_mode, _ansible_diff=diff)), pytest.raises(SystemExit) as done:
        kubernetes_etcd_snapshot.main()
    out = capsys.readouterr().out
    result = json.loads(out)
    assert (done.value.code == 0) != bool(result.get("failed"))
    return result, out


def test_the_module_takes_a_snapshot_and_writes_one_back(kubernetes_etcd, capsys, tmp_path):
    args = {"endpoint": kubernetes_etcd["etcd"].endpoint, "kubernetes_dir": kubernetes_etcd["kubernetes_dir"]}
    taken, _out = _run(capsys, args, check_mode=True)  # read-only: check mode takes it as well
    assert taken["changed"] is False and taken["size"] > 4096 and taken["revision"] >= 1
    data = base64.b64decode(taken["snapshot"])
    assert hashlib.sha256(data).hexdigest() == taken["sha256"] == etcd_snapshot.verify(data)
    dest = str(tmp_path / "etcd-restore.db")
    write = {"dest": dest, "snapshot": taken["snapshot"]}
    predicted, out = _run(capsys, write, check_mode=True, diff=True)
    assert predicted["changed"] is True and not os.path.exists(dest)
    assert taken["snapshot"][:64] not in out  # the secret argument is never echoed
    written, _out = _run(capsys, write, diff=True)
    assert written["changed"] is True and written["diff"]["after"] == {"size": len(data), "sha256": taken["sha256"],
                                                                       "mode": "0600"}
    assert open(dest, "rb").read() == data and stat.S_IMODE(os.stat(dest).st_mode) == 0o600
    again, _out = _run(capsys, write)
    assert again["changed"] is False
    damaged = bytearray(data)
    damaged[len(damaged) // 2] ^= 1
    refused, out = _run(capsys, {"dest": dest, "snapshot": base64.b64encode(bytes(damaged)).decode()})
    assert refused["failed"] and "dest %s: the snapshot to write to %s is damaged" % (dest, dest) in refused["msg"]
    assert open(dest, "rb").read() == data  # left as it was
    failed, _out = _run(capsys, dict(args, kubernetes_dir=kubernetes_etcd["other_dir"]))
    assert failed["failed"] and failed["msg"].startswith("Kubernetes etcd snapshot: etcd at https://%s: the TLS handshake failed"
                                                         % kubernetes_etcd["etcd"].endpoint)
