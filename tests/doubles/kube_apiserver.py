#!/usr/bin/env python
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""STAND-IN for the Kubernetes API server -- not Kubernetes. Never run it on a real host.

No kube-apiserver can run on the machines the tests run on, so the Ready wait
(``wait_for_nodes_ready``, kubernetes.core's ``k8s_info`` in the roles), the drains (kubernetes.core's ``k8s_drain``)
and the other API calls are tested against this program at the
HTTP boundary, with the real ``kubernetes`` Python client on the other side. It serves a small
read-only part of the API as the real one answers it:

* the discovery the ``kubernetes`` client's DynamicClient does first (as kubernetes.core's modules use it):
  ``GET /version``, ``GET /api`` (``APIVersions``: v1), ``GET /apis`` (an ``APIGroupList`` with no group) and
  ``GET /api/v1`` (the ``APIResourceList`` of what is served below: nodes, pods, pods/eviction);
* ``GET /api/v1/nodes`` (a ``v1`` ``NodeList``), ``GET /api/v1/nodes/<name>``;
  ``DELETE /api/v1/nodes/<name>`` (the Coordinator deletes an evicted Node: the node leaves the
  double's state, a success ``Status``; only ``system:masters`` and ``kubeadm:cluster-admins`` may);
  ``GET /api/v1/pods`` and ``/api/v1/namespaces/kube-system/pods`` (each control plane's kube-apiserver mirror
  pod, its image tagged with the control plane's version, and the workload pods a test put in the state's
  ``pods``; ``fieldSelector=spec.nodeName=N``, ``labelSelector=k=v``), ``GET
  /api/v1/namespaces/<namespace>/pods/<name>`` (one pod, 404 once evicted), ``PATCH /api/v1/nodes/<name>`` of
  ``spec.unschedulable`` (cordon, uncordon) and ``POST .../pods/<name>/eviction`` (the pod leaves the state;
  ``pdb_blocked`` pods answer 429 as a PodDisruptionBudget would), for admins only;
  any other path is a 404 ``Status``, any other method a 405.
* the nodes are those the kubeadm TEST DOUBLE (tests/doubles/kubeadm) registered in its "cluster"
  (``<cluster>/.kubeadm-double/state.json``: ``init`` registers its node, a ``join`` with
  KUBEADM_DOUBLE_CLUSTER the joining node). A registered node is Ready; a node named in the
  ``--not-ready-file`` (one name a line, read on every request) reports ``Ready=False`` with the
  kubelet's reason for a node without a CNI.
* TLS as the real API server: a server certificate signed by the cluster CA the double wrote
  (``<cluster>/pki/ca.crt``, ``ca.key``) for the address it listens on (plus ``--san``), and client
  certificates verified against that CA. No client certificate: 401. A client whose groups may not
  read nodes: 403 (``system:masters``, ``kubeadm:cluster-admins`` and ``system:nodes`` may).
* bounded: it exits by itself after ``--lifetime`` seconds (at most an hour), and on SIGTERM. It
  listens only on loopback, unless it runs in another network namespace than the process that
  started it (a lab host entered with nsenter or ``ip netns exec``): then on that namespace's addresses.

``--background --pid-file P`` starts it detached (idempotent: a live stand-in in P is left running)
and returns once it listens; ``--stop --pid-file P`` stops it. The first line it prints is
``listening https://HOST:PORT``.
"""

import argparse
import datetime
import fcntl
import ipaddress
import json
import os
import select
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

MAX_LIFETIME = 3600
READ_GROUPS = ("system:masters", "kubeadm:cluster-admins", "system:nodes")
DELETE_GROUPS = ("system:masters", "kubeadm:cluster-admins")
NOT_READY_REASON = "KubeletNotReady"
NOT_READY_MESSAGE = ("container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady "
                     "message:Network plugin returns error: cni plugin not initialized")
MARKER = "kube_apiserver.py"


class StandInError(Exception):
    """The stand-in cannot start as asked."""


# --------------------------------------------------------------------------- the cluster (kubeadm double)


def load_cluster(cluster_dir):
    path = os.path.join(cluster_dir, ".kubeadm-double", "state.json")
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return {}


def delete_node(cluster_dir, name):
    """Removes ``name`` from the kubeadm double's cluster (under its lock); True if it was there."""
    state_dir = os.path.join(cluster_dir, ".kubeadm-double")
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    with open(os.path.join(state_dir, "lock"), "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cluster = load_cluster(cluster_dir)
        if name not in (cluster.get("nodes") or {}):
            return False
        del cluster["nodes"][name]
        path = os.path.join(state_dir, "state.json")
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            json.dump(cluster, handle)
        os.replace(path + ".tmp", path)
        return True


def not_ready_names(path):
    if not path:
        return set()
    try:
        with open(path, encoding="utf-8") as handle:
            return {line.strip() for line in handle if line.strip() and not line.startswith("#")}
    except FileNotFoundError:
        return set()


def node_object(record, not_ready, resource_version):
    """A v1 Node as the API server returns it (every field the client's models require)."""
    name = record["name"]
    ready = name not in not_ready
    condition = {"type": "Ready", "status": "True" if ready else "False",
                 "reason": "KubeletReady" if ready else NOT_READY_REASON,
                 "message": "kubelet is posting ready status" if ready else NOT_READY_MESSAGE,
                 "lastHeartbeatTime": record["registered"], "lastTransitionTime": record["registered"]}
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64"}
    if record.get("control_plane"):
        labels["node-role.kubernetes.io/control-plane"] = ""
    version = record.get("kubelet_version") or "v0.0.0"
    status = {
        "conditions": [condition],
        "nodeInfo": {"architecture": "amd64", "bootID": str(uuid.uuid5(uuid.NAMESPACE_DNS, name + ".boot")),
                     "containerRuntimeVersion": "containerd://1.7.22", "kernelVersion": "6.1.0-stand-in",
                     "kubeProxyVersion": "", "kubeletVersion": version,
                     "machineID": uuid.uuid5(uuid.NAMESPACE_DNS, name).hex, "operatingSystem": "linux",
                     "osImage": "STAND-IN, not Kubernetes", "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_DNS, name))},
    }
    if record.get("node_ip"):
        status["addresses"] = [{"type": "InternalIP", "address": record["node_ip"]}, {"type": "Hostname", "address": name}]
    return {"metadata": {"name": name, "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, "node/" + name)),
                         "resourceVersion": str(resource_version), "creationTimestamp": record["registered"],
                         "labels": labels},
            "spec": {"unschedulable": True} if record.get("unschedulable") else {}, "status": status}


def pod_objects(cluster):
    """The pods the stand-in knows: the kube-apiserver static pod of each control plane (a mirror pod whose
    image carries the control plane's version, as the real one) and the workload pods a test put in the
    double's state (``pods``: namespace, name, node; ``daemonset: true`` for a DaemonSet's; any other is a
    ReplicaSet's, as a Deployment's pod, unless ``bare: true``)."""
    pods = []
    for record in sorted((cluster.get("nodes") or {}).values(), key=lambda r: r["name"]):
        if record.get("control_plane") and record.get("control_plane_version"):
            name = "kube-apiserver-" + record["name"]
            pods.append({"metadata": {"name": name, "namespace": "kube-system",
                                      "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, "pod/kube-system/" + name)),
                                      "labels": {"component": "kube-apiserver", "tier": "control-plane"},
                                      "annotations": {"kubernetes.io/config.mirror": "stand-in"}},
                         "spec": {"nodeName": record["name"], "containers": [
                             {"name": "kube-apiserver",
                              "image": "registry.k8s.io/kube-apiserver:%s" % record["control_plane_version"]}]},
                         "status": {"phase": "Running"}})
    for item in cluster.get("pods") or []:
        meta = {"name": item["name"], "namespace": item["namespace"],
                "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, "pod/%s/%s" % (item["namespace"], item["name"]))),
                "labels": {"app": item["name"]}}
        if not item.get("bare"):
            kind = "DaemonSet" if item.get("daemonset") else "ReplicaSet"
            meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": kind, "name": item["name"],
                                        "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, "%s/%s" % (kind, item["name"]))),
                                        "controller": True}]
        pods.append({"metadata": meta, "spec": {"nodeName": item["node"], "containers": [
            {"name": "app", "image": "registry.example/app:1"}]}, "status": {"phase": "Running"}})
    return pods


def update_cluster(cluster_dir, change):
    """change(state) under the kubeadm double's lock; returns what change returned."""
    state_dir = os.path.join(cluster_dir, ".kubeadm-double")
    with open(os.path.join(state_dir, "lock"), "a", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cluster = load_cluster(cluster_dir)
        result = change(cluster)
        path = os.path.join(state_dir, "state.json")
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            json.dump(cluster, handle)
        os.replace(path + ".tmp", path)
        return result


# What discovery reads (GET /api, /apis, /api/v1): the core group only, and of it only what this stand-in serves.
API_RESOURCES = [
    {"name": "nodes", "singularName": "node", "namespaced": False, "kind": "Node",
     "verbs": ["delete", "get", "list", "patch"], "shortNames": ["no"]},
    {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod", "verbs": ["get", "list"],
     "shortNames": ["po"], "categories": ["all"]},
    {"name": "pods/eviction", "singularName": "", "namespaced": True, "group": "policy", "version": "v1",
     "kind": "Eviction", "verbs": ["create"]},
]


def discovery_object(path, server_address):
    """The discovery document at ``path`` (None: not a discovery path)."""
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]}
    if path == "/apis":
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": []}
    if path == "/api/v1":
        return {"kind": "APIResourceList", "groupVersion": "v1", "resources": API_RESOURCES}
    return None


def status_object(code, reason, message, details=None):
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}
    if details:
        body["details"] = details
    return body


# --------------------------------------------------------------------------- TLS


def _now():
    return datetime.datetime.now(datetime.timezone.utc)


def server_certificate(cluster_dir, hosts, out_dir):
    """A serving certificate for ``hosts`` signed by the cluster CA; returns (cert path, key path)."""
    pki = os.path.join(cluster_dir, "pki")
    with open(os.path.join(pki, "ca.crt"), "rb") as handle:
        ca_cert = x509.load_pem_x509_certificate(handle.read())
    with open(os.path.join(pki, "ca.key"), "rb") as handle:
        ca_key = serialization.load_pem_private_key(handle.read(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName(n) for n in ("kubernetes", "kubernetes.default", "kubernetes.default.svc")]
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(_now() - datetime.timedelta(minutes=5))
            .not_valid_after(_now() + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()), critical=False)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .sign(ca_key, hashes.SHA256()))
    cert_path, key_path = os.path.join(out_dir, "apiserver.crt"), os.path.join(out_dir, "apiserver.key")
    with open(cert_path, "wb") as handle:
        handle.write(cert.public_bytes(serialization.Encoding.PEM))
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return cert_path, key_path


def tls_context(cluster_dir, cert_path, key_path):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_path, key_path)
    # Optional at the TLS layer, as kube-apiserver does: a request without one is answered 401.
    context.verify_mode = ssl.CERT_OPTIONAL
    context.load_verify_locations(os.path.join(cluster_dir, "pki", "ca.crt"))
    return context


# --------------------------------------------------------------------------- HTTP


class Handler(BaseHTTPRequestHandler):
    server_version = "kube-apiserver-STAND-IN"
    protocol_version = "HTTP/1.1"

    def handle(self):
        try:
            self.request.do_handshake()
        except (ssl.SSLError, OSError) as err:
            self.log_message("TLS handshake refused: %s", err)
            return
        super().handle()

    def log_message(self, format, *args):  # noqa: A002  (the base class's name)  # pylint: disable=redefined-builtin
        sys.stderr.write("kube-apiserver STAND-IN: %s\n" % (format % args))

    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _user(self):
        cert = self.request.getpeercert()
        if not cert:
            return None, []
        subject = [attr for rdn in cert.get("subject", ()) for attr in rdn]
        user = next((value for key, value in subject if key == "commonName"), "")
        groups = [value for key, value in subject if key == "organizationName"]
        return user, groups

    def do_GET(self):  # noqa: N802  (http.server's name)
        path = urlsplit(self.path).path.rstrip("/")
        user, groups = self._user()
        if user is None:
            self._send(401, status_object(401, "Unauthorized", "Unauthorized"))
            return
        cluster = load_cluster(self.server.cluster_dir)
        discovery = discovery_object(path, "%s:%d" % self.server.server_address[:2])
        if discovery is not None:
            self._send(200, discovery)
            return
        if path == "/version":
            version = cluster.get("kubernetes_version") or "v0.0.0"
            major, minor = version.lstrip("v").split(".")[:2]
            self._send(200, {"major": major, "minor": minor, "gitVersion": version, "gitCommit": "0" * 40,
                             "gitTreeState": "clean", "buildDate": "1970-01-01T00:00:00Z",
                             "goVersion": "STAND-IN, not Kubernetes", "compiler": "gc", "platform": "linux/amd64"})
            return
        if path == "/api/v1/nodes" or path.startswith("/api/v1/nodes/"):
            verb = "list" if path == "/api/v1/nodes" else "get"
            if not set(groups) & set(READ_GROUPS):
                self._send(403, status_object(
                    403, "Forbidden", 'nodes is forbidden: User "%s" cannot %s resource "nodes" in API group "" at the '
                    'cluster scope' % (user, verb), {"kind": "nodes"}))
                return
            not_ready = not_ready_names(self.server.not_ready_file)
            records = sorted((cluster.get("nodes") or {}).values(), key=lambda r: r["registered"])
            nodes = [node_object(r, not_ready, i + 1) for i, r in enumerate(records)]
            if verb == "list":
                self._send(200, {"kind": "NodeList", "apiVersion": "v1",
                                 "metadata": {"resourceVersion": str(len(nodes))}, "items": nodes})
                return
            name = path[len("/api/v1/nodes/"):]
            match = [n for n in nodes if n["metadata"]["name"] == name]
            if match:
                self._send(200, dict({"kind": "Node", "apiVersion": "v1"}, **match[0]))
            else:
                self._send(404, status_object(404, "NotFound", 'nodes "%s" not found' % name,
                                              {"name": name, "kind": "nodes"}))
            return
        if path in ("/api/v1/pods", "/api/v1/namespaces/kube-system/pods"):
            self._list_pods(path, groups, cluster)
            return
        parts = path.split("/")
        if len(parts) == 7 and parts[1:4] == ["api", "v1", "namespaces"] and parts[5] == "pods":
            self._get_pod(parts[4], parts[6], groups, cluster)
            return
        self._send(404, status_object(404, "NotFound", "the server could not find the requested resource"))

    def _list_pods(self, path, groups, cluster):
        """Pods, filtered as the client asks: ``fieldSelector=spec.nodeName=N``, ``labelSelector=k=v``."""
        if not set(groups) & set(DELETE_GROUPS):
            self._send(403, status_object(403, "Forbidden", "pods is forbidden for this user"))
            return
        query = dict(parse_qsl(urlsplit(self.path).query))
        pods = pod_objects(cluster)
        if path.startswith("/api/v1/namespaces/"):
            pods = [p for p in pods if p["metadata"]["namespace"] == path.split("/")[4]]
        for selector in filter(None, (query.get("fieldSelector") or "").split(",")):
            key, _sep, value = selector.partition("=")
            if key != "spec.nodeName":
                self._send(400, status_object(400, "BadRequest", "the STAND-IN selects by spec.nodeName only"))
                return
            pods = [p for p in pods if p["spec"]["nodeName"] == value]
        for selector in filter(None, (query.get("labelSelector") or "").split(",")):
            key, _sep, value = selector.partition("=")
            pods = [p for p in pods if (p["metadata"].get("labels") or {}).get(key) == value]
        self._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                         "items": [dict({"kind": "Pod", "apiVersion": "v1"}, **p) for p in pods]})

    def _get_pod(self, namespace, name, groups, cluster):
        if not set(groups) & set(DELETE_GROUPS):
            self._send(403, status_object(403, "Forbidden", "pods is forbidden for this user"))
            return
        match = [p for p in pod_objects(cluster)
                 if p["metadata"]["namespace"] == namespace and p["metadata"]["name"] == name]
        if match:
            self._send(200, dict({"kind": "Pod", "apiVersion": "v1"}, **match[0]))
        else:
            self._send(404, status_object(404, "NotFound", 'pods "%s" not found' % name, {"name": name, "kind": "pods"}))

    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= 65536:
            return None
        try:
            return json.loads(self.rfile.read(length))
        except ValueError:
            return None

    def _admin_node(self, path, forbidden):
        """(the name of the Node ``path`` addresses, the user) when an admin asks; (None, None) once the answer
        is sent: 401 without a user, 405 for another path, 403 (``forbidden`` % (name, user)) for a non-admin."""
        user, groups = self._user()
        if user is None:
            self._send(401, status_object(401, "Unauthorized", "Unauthorized"))
            return None, None
        if not path.startswith("/api/v1/nodes/"):
            self._not_allowed()
            return None, None
        name = path[len("/api/v1/nodes/"):]
        if not set(groups) & set(DELETE_GROUPS):
            self._send(403, status_object(403, "Forbidden", forbidden % (name, user), {"name": name, "kind": "nodes"}))
            return None, None
        return name, user

    def do_PATCH(self):  # noqa: N802  (http.server's name)
        """Cordon / uncordon: a merge patch of a Node's ``spec.unschedulable`` (admins only)."""
        path = urlsplit(self.path).path.rstrip("/")
        body = self._body()
        name, user = self._admin_node(path, 'nodes "%s" is forbidden: User "%s" cannot patch resource "nodes"')
        if name is None:
            return
        spec = (body or {}).get("spec") if isinstance(body, dict) else None
        if not isinstance(spec, dict) or set(spec) != {"unschedulable"} or not isinstance(spec["unschedulable"], bool):
            self._send(422, status_object(422, "Invalid", "the STAND-IN patches spec.unschedulable only"))
            return

        def change(cluster):
            record = (cluster.get("nodes") or {}).get(name)
            if record is not None:
                record["unschedulable"] = spec["unschedulable"]
            return record is not None
        if not update_cluster(self.server.cluster_dir, change):
            self._send(404, status_object(404, "NotFound", 'nodes "%s" not found' % name, {"name": name, "kind": "nodes"}))
            return
        self.log_message("PATCH node %s unschedulable=%s by %s", name, spec["unschedulable"], user)
        cluster = load_cluster(self.server.cluster_dir)
        records = sorted(cluster["nodes"].values(), key=lambda r: r["registered"])
        node = next(node_object(r, set(), i + 1) for i, r in enumerate(records) if r["name"] == name)
        self._send(200, dict({"kind": "Node", "apiVersion": "v1"}, **node))

    def do_POST(self):  # noqa: N802  (http.server's name)
        """An Eviction of a workload pod (``.../pods/<name>/eviction``): the pod leaves the state; a pod with
        ``pdb_blocked: true`` is refused 429 as a PodDisruptionBudget would."""
        parts = urlsplit(self.path).path.rstrip("/").split("/")
        self._body()
        user, groups = self._user()
        if user is None:
            self._send(401, status_object(401, "Unauthorized", "Unauthorized"))
            return
        if len(parts) != 8 or parts[1:4] != ["api", "v1", "namespaces"] or parts[5] != "pods" or parts[7] != "eviction":
            self._not_allowed()
            return
        namespace, name = parts[4], parts[6]
        if not set(groups) & set(DELETE_GROUPS):
            self._send(403, status_object(403, "Forbidden", "pods/eviction is forbidden for this user"))
            return

        def change(cluster):
            pods = cluster.get("pods") or []
            match = [p for p in pods if p["namespace"] == namespace and p["name"] == name]
            if not match:
                return 404
            if match[0].get("pdb_blocked"):
                return 429
            cluster["pods"] = [p for p in pods if p is not match[0]]
            return 201
        code = update_cluster(self.server.cluster_dir, change)
        if code == 404:
            self._send(404, status_object(404, "NotFound", 'pods "%s" not found' % name, {"name": name, "kind": "pods"}))
        elif code == 429:
            self._send(429, status_object(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's "
                                          "disruption budget."))
        else:
            self.log_message("EVICT pod %s/%s by %s", namespace, name, user)
            self._send(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})

    def do_DELETE(self):  # noqa: N802  (http.server's name)
        path = urlsplit(self.path).path.rstrip("/")
        self._drain()
        name, user = self._admin_node(path, 'nodes "%s" is forbidden: User "%s" cannot delete resource "nodes" in API '
                                            'group "" at the cluster scope')
        if name is None:
            return
        if not delete_node(self.server.cluster_dir, name):
            self._send(404, status_object(404, "NotFound", 'nodes "%s" not found' % name,
                                          {"name": name, "kind": "nodes"}))
            return
        self.log_message("DELETE node %s by %s", name, user)
        self._send(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                         "details": {"name": name, "kind": "nodes",
                                     "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, "node/" + name))}})

    def _drain(self):
        length = int(self.headers.get("Content-Length") or 0)
        if 0 < length <= 65536:
            self.rfile.read(length)

    def _not_allowed(self):
        self._send(405, status_object(405, "MethodNotAllowed", "this STAND-IN serves GET, DELETE and PATCH "
                                      "(unschedulable) of a node and evictions only"))

    do_PUT = _not_allowed  # noqa: N815


class StandInServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, context, cluster_dir, not_ready_file):
        self.context = context
        self.cluster_dir = cluster_dir
        self.not_ready_file = not_ready_file
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.address_family = family
        super().__init__(address, Handler)

    def get_request(self):
        sock, addr = self.socket.accept()
        sock.settimeout(10)
        # The handshake runs in the handler's thread: a silent client cannot block the others.
        return self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr


# --------------------------------------------------------------------------- process


def _entered_netns():
    """True when this process runs in another network namespace than a process that started it (a lab
    host entered with nsenter or ip netns exec). /proc/1 may not be readable; the ancestors are."""
    try:
        own = os.readlink("/proc/self/ns/net")
    except OSError:
        return False
    pid = os.getppid()
    for _depth in range(64):
        if pid <= 1:
            return False
        try:
            if os.readlink("/proc/%d/ns/net" % pid) != own:
                return True
            with open("/proc/%d/stat" % pid, encoding="utf-8") as handle:
                pid = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def check_listen(host):
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise StandInError("--listen: expected an IP address, got %r" % host) from None
    if not address.is_loopback and not _entered_netns():
        raise StandInError("--listen: %s is not a loopback address; outside a lab host's network namespace the "
                           "STAND-IN listens on loopback only" % host)


def split_listen(value):
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise StandInError("--listen: expected HOST:PORT, got %r" % value)
    return host.strip("[]"), int(port)


def serve(args):
    host, port = split_listen(args.listen)
    check_listen(host)
    if not os.path.isfile(os.path.join(args.cluster, "pki", "ca.key")):
        raise StandInError("--cluster: %s/pki/ca.key missing (run the kubeadm test double's init there)" % args.cluster)
    tmp = tempfile.mkdtemp(prefix="kube-apiserver-standin-")
    try:
        cert_path, key_path = server_certificate(args.cluster, [host] + list(args.san), tmp)
        server = StandInServer((host, port), tls_context(args.cluster, cert_path, key_path), args.cluster,
                               args.not_ready_file)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *args: stop.set())
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
        thread.start()
        bound = server.server_address
        shown = "[%s]" % bound[0] if ":" in bound[0] else bound[0]
        sys.stdout.write("listening https://%s:%d\n" % (shown, bound[1]))
        sys.stdout.flush()
        stop.wait(args.lifetime)
        server.shutdown()
        server.server_close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _running(pid_file):
    """The PID of a live stand-in recorded in ``pid_file``, or None."""
    try:
        with open(pid_file, encoding="utf-8") as handle:
            pid = int(handle.read().split()[0])
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            if MARKER.encode() in handle.read():
                return pid
    except (OSError, ValueError, IndexError):
        pass
    return None


def start_background(args, argv):
    pid = _running(args.pid_file)
    if pid:
        print("already running (pid %d)" % pid)
        return 0
    child_argv = [sys.executable, os.path.abspath(__file__)] + [a for a in argv if a != "--background"]
    log = open(args.log or os.devnull, "ab")  # pylint: disable=consider-using-with
    with log:
        proc = subprocess.Popen(child_argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                start_new_session=True, close_fds=True)
    ready = select.select([proc.stdout], [], [], 30)[0]
    line = proc.stdout.readline().decode().strip() if ready else ""
    proc.stdout.close()
    if not line.startswith("listening "):
        proc.kill()
        proc.wait()
        raise StandInError("the STAND-IN did not start (see %s)" % (args.log or "its stderr"))
    with open(args.pid_file, "w", encoding="utf-8") as handle:
        handle.write("%d\n" % proc.pid)
    print("started (pid %d), %s" % (proc.pid, line))
    return 0


def stop_background(pid_file):
    pid = _running(pid_file)
    if pid is None:
        print("not running")
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _running(pid_file):
        time.sleep(0.1)
    os.unlink(pid_file)
    print("stopped (pid %d)" % pid)
    return 0


def parse_args(argv):
    p = argparse.ArgumentParser(prog="kube_apiserver.py", description="STAND-IN for the Kubernetes API server -- "
                                "not Kubernetes (tests only).")
    p.add_argument("--cluster", help="the kubeadm test double's control-plane kubernetes directory")
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (port 0: any free port)")
    p.add_argument("--san", action="append", default=[], help="another name or IP for the server certificate")
    p.add_argument("--not-ready-file", help="nodes named here (one a line) report Ready=False")
    p.add_argument("--lifetime", type=float, default=300, help="exit after this many seconds (at most %d)" % MAX_LIFETIME)
    p.add_argument("--background", action="store_true", help="detach; needs --pid-file")
    p.add_argument("--stop", action="store_true", help="stop the stand-in recorded in --pid-file")
    p.add_argument("--pid-file")
    p.add_argument("--log", help="stderr of a background stand-in")
    args = p.parse_args(argv)
    if (args.background or args.stop) and not args.pid_file:
        p.error("--background and --stop need --pid-file")
    if not args.stop and not args.cluster:
        p.error("--cluster is required")
    if not 0 < args.lifetime <= MAX_LIFETIME:
        p.error("--lifetime: expected 0 < seconds <= %d, got %s" % (MAX_LIFETIME, args.lifetime))
    return args


def main(argv):
    args = parse_args(argv)
    try:
        if args.stop:
            return stop_background(args.pid_file)
        if args.background:
            return start_background(args, argv)
        serve(args)
    except (StandInError, OSError) as err:
        sys.stderr.write("kube-apiserver STAND-IN: %s\n" % err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
