"""Helpers for tests against the STAND-IN for the Kubernetes API server (tests/doubles/kube_apiserver.py,
not Kubernetes): start it on loopback for a cluster the kubeadm TEST DOUBLE made, and write kubeconfigs
that point at it."""

from __future__ import annotations

import base64
import datetime
import os
import select
import subprocess
import sys

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KUBE_APISERVER_STANDIN = os.path.join(REPO, "tests", "doubles", "kube_apiserver.py")
KUBEADM_DOUBLE = os.path.join(REPO, "tests", "doubles", "kubeadm")
# What a kubelet without a CNI reports (the stand-in's NotReady condition).
NOT_READY_MESSAGE = ("container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady "
                     "message:Network plugin returns error: cni plugin not initialized")


class ApiServerStandIn:
    """A running stand-in process (killed by ``stop``), serving the cluster in ``cluster_dir``."""

    def __init__(self, cluster_dir: str, work_dir: str, lifetime: int = 120, listen: str = "127.0.0.1:0"):
        self.cluster_dir = cluster_dir
        self.admin_conf = os.path.join(cluster_dir, "admin.conf")
        self.not_ready_file = os.path.join(work_dir, "not-ready-nodes")
        self.proc = subprocess.Popen(  # pylint: disable=consider-using-with
            [sys.executable, KUBE_APISERVER_STANDIN, "--cluster", cluster_dir, "--listen", listen,
             "--not-ready-file", self.not_ready_file, "--lifetime", str(lifetime)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready = select.select([self.proc.stdout], [], [], 30)[0]
        line = self.proc.stdout.readline().strip() if ready else ""
        if not line.startswith("listening https://"):
            self.stop()
            raise RuntimeError("the API server stand-in did not start: %r %s" % (line, self.proc.stderr.read()))
        self.url = line.split(" ", 1)[1]
        self.kubeconfig = kubeconfig_for(self.admin_conf, self.url, os.path.join(work_dir, "standin-admin.conf"))

    def not_ready(self, *names: str) -> None:
        """From the next request on, these nodes (and no others) report Ready=False."""
        with open(self.not_ready_file, "w", encoding="utf-8") as handle:
            handle.write("".join(name + "\n" for name in names))

    def node_names(self) -> list:
        """The names of the Node objects the stand-in serves, sorted (read with the kubernetes client)."""
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(config_file=self.kubeconfig, client_configuration=configuration)
        with client.ApiClient(configuration) as api_client:
            return sorted(n.metadata.name for n in client.CoreV1Api(api_client).list_node().items)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()


def _client_certificate(cluster_dir: str, user: str, groups: list) -> tuple:
    pki = os.path.join(cluster_dir, "pki")
    with open(os.path.join(pki, "ca.crt"), "rb") as handle:
        ca_cert = x509.load_pem_x509_certificate(handle.read())
    with open(os.path.join(pki, "ca.key"), "rb") as handle:
        ca_key = serialization.load_pem_private_key(handle.read(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
                     + [x509.NameAttribute(NameOID.COMMON_NAME, user)])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def kubeconfig_for(admin_conf: str, url: str, out_path, ca_pem: bytes = None, user: dict = None,
                   client_groups: list = None) -> str:
    """``admin_conf`` (what the kubeadm double wrote) pointed at ``url``; optionally another CA, other
    credentials, or a client certificate of the same CA for user ``dev`` in ``client_groups``."""
    with open(admin_conf, encoding="utf-8") as handle:
        doc = yaml.safe_load(handle)
    cluster = doc["clusters"][0]["cluster"]
    cluster["server"] = url
    if ca_pem is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    if client_groups is not None:
        cert, key = _client_certificate(os.path.dirname(admin_conf), "dev", client_groups)
        user = {"client-certificate-data": base64.b64encode(cert).decode(),
                "client-key-data": base64.b64encode(key).decode()}
    if user is not None:
        doc["users"][0]["user"] = user
    with open(out_path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(doc, handle)
    os.chmod(out_path, 0o600)
    return str(out_path)


def build_double_cluster(root: str, endpoint: str, kubernetes_version: str, control_planes=("control-plane-0",),
                         workers=()) -> dict:
    """A cluster made by the kubeadm TEST DOUBLE under ``root`` (``root/<node>/kubernetes``): the first of
    ``control_planes`` initialised with ``endpoint`` as its control plane endpoint (every kubeconfig points
    there: start the stand-in on it), the others joined as control planes, ``workers`` joined as workers.
    Returns node name -> kubernetes directory. $KUBEADM_DOUBLE_CLUSTER is set only while it joins."""
    from ansible_collections.constellation.cluster.plugins.module_utils import kubeadm

    dirs = {name: os.path.join(root, name, "kubernetes") for name in tuple(control_planes) + tuple(workers)}
    first = dirs[control_planes[0]]
    saved = {key: os.environ.pop(key, None) for key in ("KUBEADM_DOUBLE_LOG", "KUBEADM_DOUBLE_CLUSTER")}
    try:
        init = kubeadm.init_control_plane(kubeadm.Kubeadm(KUBEADM_DOUBLE, first), kubeadm.InitParams(
            kubernetes_version=kubernetes_version, node_name=control_planes[0], node_vpn_ip="10.118.0.1",
            kubernetes_dir=first, patches_dir=None, control_plane_endpoint=endpoint), upload_certs=True)
        os.environ["KUBEADM_DOUBLE_CLUSTER"] = first
        for index, name in enumerate(tuple(control_planes[1:]) + tuple(workers)):
            control_plane = name in control_planes
            kubeadm.join_node(kubeadm.Kubeadm(KUBEADM_DOUBLE, dirs[name]), kubeadm.JoinParams(
                api_server_endpoint=endpoint, token=init.token, ca_cert_hash=init.ca_cert_hash, node_name=name,
                node_vpn_ip="10.118.0.%d" % (index + 2), control_plane=control_plane,
                certificate_key=init.certificate_key if control_plane else None, kubernetes_dir=dirs[name],
                patches_dir=None))
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None)
            if value is not None:
                os.environ[key] = value
    return dirs
