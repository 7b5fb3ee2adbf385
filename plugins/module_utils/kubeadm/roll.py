# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Kubernetes API side of a rolling upgrade, through the ``kubernetes`` Python client: the versions the
cluster reports (each Node's kubelet, each control plane's kube-apiserver static pod), cordon, drain
(evictions, so PodDisruptionBudgets hold) and uncordon. The rules live in ``upgrade.py``; this file only
reads and writes the API. Credentials and TLS as ``nodes.py``: the kubeconfig's CA is pinned; refused
credentials fail at once."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import List, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.nodes import MAX_WAIT_TIMEOUT, _api_message, _refused
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.upgrade import NodeVersions, Version
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.validate import validate_node_name

CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"
APISERVER_SELECTOR = "component=kube-apiserver"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
_REQUEST_TIMEOUT = 10.0


class _Api:
    """A CoreV1Api for one kubeconfig; ``call`` turns the client's errors into ours."""

    def __init__(self, kubeconfig_path: str):
        if not isinstance(kubeconfig_path, str) or not os.path.isfile(kubeconfig_path):
            raise InputError("kubeconfig", "an existing kubeconfig file", kubeconfig_path)
        try:
            from kubernetes import client, config
            from kubernetes.config.config_exception import ConfigException
        except ImportError:
            raise StateError("the kubernetes Python client is not installed on this host (pip install kubernetes)") from None
        self.client = client
        configuration = client.Configuration()
        try:
            config.load_kube_config(config_file=kubeconfig_path, client_configuration=configuration)
        except (ConfigException, ValueError, TypeError, AttributeError, OSError) as err:
            raise InputError("kubeconfig", "a usable kubeconfig file", "%s (%s)" % (kubeconfig_path, err)) from None
        configuration.retries = 0
        self._api_client = client.ApiClient(configuration)
        self.core = client.CoreV1Api(self._api_client)

    def call(self, what: str, method, *args, **kwargs):
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError
        kwargs.setdefault("_request_timeout", _REQUEST_TIMEOUT)
        try:
            return method(*args, **kwargs)
        except (ApiException, HTTPError, OSError) as err:
            refused = _refused(err)
            if refused:
                raise StateError("%s: %s" % (what, refused)) from None
            if isinstance(err, ApiException):
                raise ApiError(err.status, "%s: the API server answered %s %s: %s"
                               % (what, err.status, err.reason, _api_message(err))) from None
            raise StateError("%s: the API server is not answering: %s" % (what, getattr(err, "reason", None) or err)) from None

    def close(self) -> None:
        self._api_client.close()

    def __enter__(self) -> "_Api":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ApiError(StateError):
    """The API server answered with an error status (``status``)."""

    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(message)


def _node_versions(node, apiserver_versions: dict) -> NodeVersions:
    labels = node.metadata.labels or {}
    info = node.status.node_info if node.status else None
    kubelet = None
    if info and info.kubelet_version:
        try:
            kubelet = Version.parse(info.kubelet_version, "kubeletVersion")
        except InputError:
            kubelet = None
    control_plane = CONTROL_PLANE_LABEL in labels
    return NodeVersions(name=node.metadata.name, kubelet_version=kubelet, control_plane=control_plane,
                        control_plane_version=apiserver_versions.get(node.metadata.name) if control_plane else None,
                        unschedulable=bool(node.spec and node.spec.unschedulable))


def read_cluster_versions(kubeconfig_path: str) -> List[NodeVersions]:
    """Every Node with its kubelet's version and, for a control plane, the version of the image of its
    kube-apiserver static pod (kube-system, ``component=kube-apiserver``), sorted by name."""
    with _Api(kubeconfig_path) as api:
        pods = api.call("listing the kube-apiserver pods", api.core.list_namespaced_pod, "kube-system",
                        label_selector=APISERVER_SELECTOR).items
        versions = {}
        for pod in pods:
            node = pod.spec.node_name if pod.spec else None
            image = next((c.image for c in (pod.spec.containers or []) if c.name == "kube-apiserver"), None) \
                if pod.spec else None
            version = Version.from_image(image) if image else None
            if node and version and (node not in versions or version < versions[node]):
                versions[node] = version
        nodes = api.call("listing the nodes", api.core.list_node).items
        return sorted((_node_versions(n, versions) for n in nodes), key=lambda n: n.name)


def read_node_versions(kubeconfig_path: str, node_name: str) -> Optional[NodeVersions]:
    """One Node (its kubelet's version; a node's own kubelet.conf may read it), or None when it is not there."""
    validate_node_name(node_name, "node_name")
    with _Api(kubeconfig_path) as api:
        try:
            node = api.call("reading node %s" % node_name, api.core.read_node, node_name)
        except ApiError as err:
            if err.status == 404:
                return None
            raise
        return _node_versions(node, {})


@dataclass
class DrainResult:
    """What cordon/drain/uncordon did (or would do in check mode)."""

    node: str
    changed: bool
    unschedulable: bool
    evicted: List[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"node": self.node, "changed": self.changed, "unschedulable": self.unschedulable,
                "evicted": list(self.evicted)}


def _evictable(pod) -> bool:
    """What ``kubectl drain --ignore-daemonsets`` evicts: not a mirror (static) pod, not a DaemonSet's,
    not finished."""
    annotations = (pod.metadata.annotations or {}) if pod.metadata else {}
    if MIRROR_ANNOTATION in annotations:
        return False
    if any(ref.kind == "DaemonSet" for ref in (pod.metadata.owner_references or [])):
        return False
    return not (pod.status and pod.status.phase in ("Succeeded", "Failed"))


def _pods_on(api: _Api, node_name: str) -> List[str]:
    pods = api.call("listing the pods on %s" % node_name, api.core.list_pod_for_all_namespaces,
                    field_selector="spec.nodeName=%s" % node_name).items
    return sorted("%s/%s" % (p.metadata.namespace, p.metadata.name) for p in pods if _evictable(p))


def set_schedulable(kubeconfig_path: str, node_name: str, schedulable: bool, check_mode: bool = False) -> DrainResult:
    """Uncordon (``schedulable``) or cordon a Node; unchanged when it already is."""
    validate_node_name(node_name, "node_name")
    with _Api(kubeconfig_path) as api:
        node = api.call("reading node %s" % node_name, api.core.read_node, node_name)
        unschedulable = bool(node.spec and node.spec.unschedulable)
        if unschedulable != schedulable:
            return DrainResult(node_name, False, unschedulable)
        if not check_mode:
            api.call("%s node %s" % ("uncordoning" if schedulable else "cordoning", node_name), api.core.patch_node,
                     node_name, {"spec": {"unschedulable": not schedulable}})
        return DrainResult(node_name, True, not schedulable)


def drain_node(kubeconfig_path: str, node_name: str, timeout: float = 300.0, interval: float = 2.0,
               check_mode: bool = False) -> DrainResult:
    """Cordon the Node, evict its pods (``_evictable``) through the Eviction API, and wait (at most ``timeout``
    seconds) until they are gone. A PodDisruptionBudget that refuses an eviction (429) is asked again until
    the deadline; then a StateError names the pods still there."""
    validate_node_name(node_name, "node_name")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_WAIT_TIMEOUT:
        raise InputError("timeout", "seconds, more than 0 and at most %d" % MAX_WAIT_TIMEOUT, timeout)
    cordon = set_schedulable(kubeconfig_path, node_name, False, check_mode)
    with _Api(kubeconfig_path) as api:
        pods = _pods_on(api, node_name)
        result = DrainResult(node_name, cordon.changed or bool(pods), True, pods)
        if check_mode or not pods:
            return result
        deadline = time.monotonic() + timeout
        remaining = pods
        while remaining:
            for ref in remaining:
                namespace, name = ref.split("/", 1)
                body = api.client.V1Eviction(metadata=api.client.V1ObjectMeta(name=name, namespace=namespace))
                try:
                    api.call("evicting %s" % ref, api.core.create_namespaced_pod_eviction, name, namespace, body)
                except ApiError as err:
                    if err.status not in (404, 429):  # gone already / a disruption budget says not now
                        raise
            remaining = _pods_on(api, node_name)
            if not remaining:
                break
            if time.monotonic() + interval > deadline:
                raise StateError("drain of %s: pods still there after %ss: %s" % (node_name, timeout, ", ".join(remaining)))
            time.sleep(interval)
        return result
