# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Kubernetes API, through the ``kubernetes`` Python client: waiting until nodes report Ready
(module kubernetes_nodes_ready). Kept apart from the kubeadm operations: it talks to the API server,
not to the kubeadm program."""

from __future__ import annotations

import json
import os
import ssl
import time
from dataclasses import dataclass
from typing import Optional, Sequence

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.validate import validate_node_name

# The longest wait anyone can ask for: a run that never ends reports nothing.
MAX_WAIT_TIMEOUT = 3600.0
# The longest single request to the API server; the loop retries within the deadline.
_REQUEST_TIMEOUT = 10.0


@dataclass
class NodeStatus:
    """One node as the API server reports it: its Ready condition and the kubelet's version."""

    name: str
    ready: bool
    reason: Optional[str] = None
    message: Optional[str] = None
    kubelet_version: Optional[str] = None

    def as_dict(self) -> dict:
        return {"name": self.name, "ready": self.ready, "reason": self.reason, "message": self.message,
                "kubelet_version": self.kubelet_version}

    def why(self) -> str:
        """Why the node is not Ready, for an error message."""
        detail = ": ".join(part for part in (self.reason, self.message) if part)
        return detail or "no Ready condition reported yet"


def _node_status(node) -> NodeStatus:
    ready = next((c for c in (node.status.conditions or []) if c.type == "Ready"), None) if node.status else None
    info = node.status.node_info if node.status else None
    return NodeStatus(name=node.metadata.name, ready=bool(ready and ready.status == "True"),
                      reason=ready.reason if ready else None, message=ready.message if ready else None,
                      kubelet_version=info.kubelet_version if info else None)


def _validate_wait(kubeconfig_path: object, expected_nodes: object, nodes: object, timeout: object,
                   interval: object) -> tuple:
    if not isinstance(kubeconfig_path, str) or not kubeconfig_path:
        raise InputError("kubeconfig", "the path of a kubeconfig file", kubeconfig_path)
    if not os.path.isfile(kubeconfig_path):
        raise InputError("kubeconfig", "an existing kubeconfig file (admin.conf of a control plane)", kubeconfig_path)
    if nodes is not None and expected_nodes is not None:
        raise InputError("nodes", "either nodes (names) or expected_nodes (a count), not both", nodes)
    if nodes is not None:
        if isinstance(nodes, str) or not isinstance(nodes, (list, tuple)) or not nodes:
            raise InputError("nodes", "a non-empty list of node names", nodes)
        names = [validate_node_name(name, "nodes") for name in nodes]
        if len(set(names)) != len(names):
            raise InputError("nodes", "node names without duplicates", nodes)
    else:
        names = None
        if expected_nodes is None:
            expected_nodes = 1
        if isinstance(expected_nodes, bool) or not isinstance(expected_nodes, int) or expected_nodes < 1:
            raise InputError("expected_nodes", "a whole number of nodes, at least 1", expected_nodes)
    for field_name, value, low in (("timeout", timeout, 0.0), ("interval", interval, 0.0)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value <= MAX_WAIT_TIMEOUT:
            raise InputError(field_name, "seconds, more than 0 and at most %d" % MAX_WAIT_TIMEOUT, value)
    if interval > timeout:
        raise InputError("interval", "at most the timeout (%ss)" % timeout, interval)
    return names, expected_nodes


def _refused(err) -> Optional[str]:
    """Why a request can never succeed by waiting (wrong credentials, an untrusted server), or None."""
    status = getattr(err, "status", None)
    if status in (401, 403):
        return "the API server refused the request (%s %s): %s" % (status, getattr(err, "reason", ""),
                                                                   _api_message(err))
    cause = err
    for _depth in range(5):  # urllib3 wraps the ssl error in MaxRetryError(reason=SSLError(...))
        if isinstance(cause, ssl.SSLCertVerificationError):
            return "the API server's certificate was not accepted: %s" % (cause.verify_message or cause)
        wrapped = [getattr(cause, "reason", None), cause.__cause__, cause.__context__]
        wrapped += [arg for arg in getattr(cause, "args", ()) if isinstance(arg, BaseException)]
        cause = next((c for c in wrapped if isinstance(c, BaseException)), None)
        if cause is None:
            break
    return None


def _api_message(err) -> str:
    try:
        return json.loads(err.body).get("message") or str(err.body)
    except (TypeError, ValueError, AttributeError):
        return str(getattr(err, "body", "") or "")


def wait_for_nodes_ready(kubeconfig_path: str, expected_nodes: Optional[int] = None, timeout: float = 120.0,
                         interval: float = 2.0, nodes: Optional[Sequence[str]] = None) -> list:
    """Wait (bounded by ``timeout``) until the API server reports the nodes Ready.

    ``nodes``: these names must all be registered and Ready; ``expected_nodes``: at least that many nodes
    Ready (the default, 1, when neither is given). Returns the NodeStatus records: of ``nodes`` in the order
    given, or of every node the API server lists (by name). On timeout raises StateError naming every node
    still not Ready and why (the reason and message of its Ready condition, or that it is not registered).
    Refused credentials and an API server certificate that the kubeconfig's CA does not vouch for fail at
    once: waiting cannot change them.
    """
    names, expected_nodes = _validate_wait(kubeconfig_path, expected_nodes, nodes, timeout, interval)
    try:
        from kubernetes import client, config
        from kubernetes.client.rest import ApiException
        from kubernetes.config.config_exception import ConfigException
        from urllib3.exceptions import HTTPError
    except ImportError:
        raise StateError("the kubernetes Python client is not installed on this host (pip install kubernetes)") from None
    configuration = client.Configuration()
    try:
        config.load_kube_config(config_file=kubeconfig_path, client_configuration=configuration)
    except (ConfigException, ValueError, TypeError, AttributeError, OSError) as err:
        raise InputError("kubeconfig", "a usable kubeconfig file", "%s (%s)" % (kubeconfig_path, err)) from None
    configuration.retries = 0  # this loop retries, within the deadline
    api_client = client.ApiClient(configuration)
    core = client.CoreV1Api(api_client)
    deadline = time.monotonic() + timeout
    last = "no answer from the API server"
    try:
        while True:
            try:
                remaining = max(deadline - time.monotonic(), 0.5)
                listed = {n.metadata.name: _node_status(n)
                          for n in core.list_node(_request_timeout=min(_REQUEST_TIMEOUT, remaining)).items}
                if names is not None:
                    records = [listed.get(name) or NodeStatus(name, False, "NotRegistered",
                                                              "no Node of this name in the cluster")
                               for name in names]
                    if all(r.ready for r in records):
                        return records
                    waiting = [r for r in records if not r.ready]
                    last = "%d of %d nodes Ready; not Ready: %s" % (len(records) - len(waiting), len(records),
                                                                    "; ".join("%s (%s)" % (r.name, r.why())
                                                                              for r in waiting))
                else:
                    records = [listed[name] for name in sorted(listed)]
                    ready = [r.name for r in records if r.ready]
                    if len(ready) >= expected_nodes:
                        return records
                    waiting = [r for r in records if not r.ready]
                    last = "%d of %d nodes Ready (%s)%s" % (
                        len(ready), expected_nodes, ", ".join(ready) or "none",
                        "; not Ready: " + "; ".join("%s (%s)" % (r.name, r.why()) for r in waiting) if waiting else "")
            except (ApiException, HTTPError, OSError, ValueError) as err:
                refused = _refused(err)
                if refused:
                    raise StateError(refused) from None
                if isinstance(err, ValueError) and not isinstance(err, OSError):
                    raise StateError("the API server's node list could not be read: %s" % err) from None
                if isinstance(err, ApiException):
                    last = "API server answered %s %s: %s" % (err.status, err.reason, _api_message(err))
                else:
                    last = "API server not answering: %s" % (getattr(err, "reason", None) or err)
            if time.monotonic() + interval > deadline:
                raise StateError("nodes not Ready after %ss: %s" % (timeout, last))
            time.sleep(interval)
    finally:
        api_client.close()
