# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Conditions (what kubeadm left on disk) and operations (init, join, tokens, the Ready wait): decide
with the conditions, render the configuration, run kubeadm, read the results back."""

from __future__ import annotations

import hmac
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import write_if_changed
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ExternalCommandError, InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.validate import (  # noqa: F401
    CONTROL_PLANE_PKI_FILES,
    DEFAULT_API_VERSION,
    DEFAULT_TOKEN_TTL,
    KUBERNETES_DIR,
    REDACTED,
    TOKEN_DESCRIPTION,
    TOKEN_GROUP,
    TOKEN_USAGES,
    _validate_str_list,
    ca_cert_hash,
    generate_certificate_key,
    generate_token,
    token_id,
    validate_api_version,
    validate_token,
    validate_token_id,
    validate_ttl,
)
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.config import (  # noqa: F401
    InitParams,
    JoinParams,
    audit_policy,
    audit_policy_path,
    dump_documents,
    redact,
    render_init,
    render_join,
    render_token_config,
)
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.command import (  # noqa: F401
    Kubeadm,
)

# --------------------------------------------------------------------------- files (conditions layer)


def is_initialised(kubernetes_dir: str = KUBERNETES_DIR) -> bool:
    """A control plane was initialised here: admin.conf and the cluster CA exist."""
    return (os.path.isfile(os.path.join(kubernetes_dir, "admin.conf"))
            and os.path.isfile(os.path.join(kubernetes_dir, "pki", "ca.crt")))


def is_joined(kubernetes_dir: str = KUBERNETES_DIR) -> bool:
    """This node joined a cluster: the kubelet has its kubeconfig."""
    return os.path.isfile(os.path.join(kubernetes_dir, "kubelet.conf"))


def missing_control_plane_pki(kubernetes_dir: str) -> list:
    pki = os.path.join(kubernetes_dir, "pki")
    return [name for name in CONTROL_PLANE_PKI_FILES if not os.path.isfile(os.path.join(pki, name))]


def read_admin_kubeconfig(kubernetes_dir: str = KUBERNETES_DIR) -> str:
    with open(os.path.join(kubernetes_dir, "admin.conf"), encoding="utf-8") as handle:
        return handle.read()


def read_ca_cert_hash(kubernetes_dir: str = KUBERNETES_DIR) -> str:
    with open(os.path.join(kubernetes_dir, "pki", "ca.crt"), "rb") as handle:
        return ca_cert_hash(handle.read())


def _atomic_write(path: str, data: str, mode: int) -> bool:
    """Write ``data`` unless the file already holds it (fileutil). Returns changed."""
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    return write_if_changed(path, data.encode("utf-8"), mode)


def write_audit_policy(kubernetes_dir: str) -> bool:
    return _atomic_write(audit_policy_path(kubernetes_dir), dump_documents([audit_policy()]), 0o600)


def _scrubbed(err: ExternalCommandError, secret_values: Sequence[Optional[str]]) -> ExternalCommandError:
    """The same error with any secret kubeadm may have echoed (e.g. at -v=5) replaced."""
    text = err.stderr
    for value in secret_values:
        if value:
            text = text.replace(value, REDACTED)
    return ExternalCommandError(err.argv, err.rc, text)


class _PrivateConfig:
    """A kubeadm configuration in a 0600 file inside a fresh 0700 directory, removed afterwards."""

    def __init__(self, docs: Sequence[Mapping]):
        self._text = dump_documents(docs)
        self._dir = None
        self.path = None

    def __enter__(self) -> str:
        self._dir = tempfile.mkdtemp(prefix="constellation-kubeadm-")
        self.path = os.path.join(self._dir, "kubeadm.yaml")
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(self._text)
        return self.path

    def __exit__(self, *exc):
        shutil.rmtree(self._dir, ignore_errors=True)
        return False


# --------------------------------------------------------------------------- operations


@dataclass
class InitResult:
    changed: bool
    config: list
    ca_cert_hash: Optional[str] = None
    kubeconfig: Optional[str] = field(default=None, repr=False)
    token: Optional[str] = field(default=None, repr=False)
    certificate_key: Optional[str] = field(default=None, repr=False)


def init_control_plane(kubeadm: Kubeadm, params: InitParams, upload_certs: bool = False,
                       check_mode: bool = False) -> InitResult:
    """``kubeadm init`` unless this host already is a control plane. Never re-initialises."""
    if is_initialised(params.kubernetes_dir):
        return InitResult(changed=False, config=[], ca_cert_hash=read_ca_cert_hash(params.kubernetes_dir),
                          kubeconfig=read_admin_kubeconfig(params.kubernetes_dir))
    if params.token is None:
        params.token = generate_token()
    if upload_certs and params.certificate_key is None:
        params.certificate_key = generate_certificate_key()
    if not upload_certs:
        params.certificate_key = None
    docs = render_init(params)
    kubeadm.path  # no kubeadm: fail before anything is written (and in a dry run too)  # noqa: B018
    if check_mode:
        return InitResult(changed=True, config=redact(docs))
    if params.patches_dir:
        os.makedirs(params.patches_dir, mode=0o755, exist_ok=True)
    write_audit_policy(params.kubernetes_dir)
    with _PrivateConfig(docs) as config_path:
        try:
            kubeadm.init(config_path, upload_certs)
        except ExternalCommandError as err:
            raise _scrubbed(err, [params.token, params.certificate_key]) from None
    if not is_initialised(params.kubernetes_dir):
        raise StateError("kubeadm init succeeded but %s/admin.conf or pki/ca.crt is missing" % params.kubernetes_dir)
    return InitResult(changed=True, config=redact(docs), ca_cert_hash=read_ca_cert_hash(params.kubernetes_dir),
                      kubeconfig=read_admin_kubeconfig(params.kubernetes_dir), token=params.token,
                      certificate_key=params.certificate_key)


@dataclass
class JoinResult:
    changed: bool
    config: list


def join_node(kubeadm: Kubeadm, params: JoinParams, check_mode: bool = False) -> JoinResult:
    """``kubeadm join`` unless the kubelet already has a kubeconfig here."""
    if is_joined(params.kubernetes_dir):
        return JoinResult(changed=False, config=[])
    if params.control_plane and not params.certificate_key:
        missing = missing_control_plane_pki(params.kubernetes_dir)
        if missing:
            raise InputError("certificate_key", "a certificate key, or the cluster PKI already under %s/pki "
                             "(missing: %s)" % (params.kubernetes_dir, ", ".join(missing)))
    docs = render_join(params)
    kubeadm.path  # no kubeadm: fail before anything is written  # noqa: B018
    if check_mode:
        return JoinResult(changed=True, config=redact(docs))
    if params.patches_dir:
        os.makedirs(params.patches_dir, mode=0o755, exist_ok=True)
    if params.control_plane:
        write_audit_policy(params.kubernetes_dir)
    with _PrivateConfig(docs) as config_path:
        try:
            kubeadm.join(config_path)
        except ExternalCommandError as err:
            raise _scrubbed(err, [params.token, params.certificate_key]) from None
    if not is_joined(params.kubernetes_dir):
        raise StateError("kubeadm join succeeded but %s/kubelet.conf is missing" % params.kubernetes_dir)
    return JoinResult(changed=True, config=redact(docs))


@dataclass
class TokenResult:
    changed: bool
    token_id: Optional[str]
    tokens: list
    token: Optional[str] = field(default=None, repr=False)


def _require_control_plane(kubeadm: Kubeadm) -> None:
    if not os.path.isfile(kubeadm.admin_kubeconfig_path):
        raise StateError("no control plane here: %s does not exist (run kubeadm_init first)"
                         % kubeadm.admin_kubeconfig_path)


def ensure_token(kubeadm: Kubeadm, token: Optional[str] = None, ttl: str = DEFAULT_TOKEN_TTL,
                 description: str = TOKEN_DESCRIPTION, usages: Sequence[str] = TOKEN_USAGES,
                 groups: Sequence[str] = (TOKEN_GROUP,), check_mode: bool = False,
                 api_version: str = DEFAULT_API_VERSION) -> TokenResult:
    """Create ``token`` unless it exists with the same secret; without ``token`` always create a new one."""
    validate_ttl(ttl, "ttl")
    api_version = validate_api_version(api_version)
    usages = _validate_str_list(usages, "usages")
    groups = _validate_str_list(groups, "groups")
    for usage in usages:
        if usage not in ("signing", "authentication"):
            raise InputError("usages", "signing and/or authentication", usage)
    for group in groups:
        if not group.startswith("system:bootstrappers:"):
            raise InputError("groups", "groups starting with system:bootstrappers:", group)
    if token is not None:
        validate_token(token)
    _require_control_plane(kubeadm)
    if token is not None:
        live = kubeadm.token_secrets().get(token_id(token))
        if live is not None and hmac.compare_digest(live, token):
            return TokenResult(False, token_id(token), [t.as_dict() for t in kubeadm.token_list()], token)
    wanted = token or generate_token()
    if check_mode:
        return TokenResult(True, token_id(wanted) if token else None,
                           [t.as_dict() for t in kubeadm.token_list()], None)
    with _PrivateConfig(render_token_config(wanted, ttl, description, usages, groups, api_version)) as path:
        try:
            created = kubeadm.token_create(path)
        except ExternalCommandError as err:
            raise _scrubbed(err, [wanted]) from None
    if not hmac.compare_digest(created, wanted):
        raise StateError("kubeadm token create reported a different token than the one requested")
    return TokenResult(True, token_id(created), [t.as_dict() for t in kubeadm.token_list()], created)


def remove_token(kubeadm: Kubeadm, tid: str, check_mode: bool = False) -> TokenResult:
    validate_token_id(tid)
    _require_control_plane(kubeadm)
    before = kubeadm.token_list()
    if not any(t.token_id == tid for t in before):
        return TokenResult(False, tid, [t.as_dict() for t in before])
    if check_mode:
        return TokenResult(True, tid, [t.as_dict() for t in before if t.token_id != tid])
    kubeadm.token_delete(tid)
    return TokenResult(True, tid, [t.as_dict() for t in kubeadm.token_list()])


def list_tokens(kubeadm: Kubeadm) -> TokenResult:
    _require_control_plane(kubeadm)
    return TokenResult(False, None, [t.as_dict() for t in kubeadm.token_list()])


# --------------------------------------------------------------------------- Kubernetes API (python client)


def wait_for_nodes_ready(kubeconfig_path: str, expected_nodes: int = 1, timeout: float = 120.0,
                         interval: float = 2.0) -> list:
    """Wait (bounded) until the API server answers and ``expected_nodes`` nodes report Ready.

    Returns the names of the Ready nodes; raises StateError naming what was still missing on timeout.
    """
    try:
        from kubernetes import client, config
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError
    except ImportError:
        raise StateError("the kubernetes Python client is not installed") from None
    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig_path, client_configuration=configuration)
    configuration.retries = 0  # this loop retries, within the deadline
    api_client = client.ApiClient(configuration)
    core = client.CoreV1Api(api_client)
    deadline = time.monotonic() + timeout
    last = "no answer from the API server"
    try:
        while True:
            try:
                remaining = max(deadline - time.monotonic(), 0.5)
                nodes = core.list_node(_request_timeout=min(10.0, remaining)).items
                ready = sorted(n.metadata.name for n in nodes
                               if any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or [])))
                if len(ready) >= expected_nodes:
                    return ready
                last = "%d of %d nodes Ready (%s)" % (len(ready), expected_nodes, ", ".join(ready) or "none")
            except (ApiException, HTTPError, OSError) as err:
                last = "API server not answering: %s" % (getattr(err, "reason", None) or err)
            if time.monotonic() + interval > deadline:
                raise StateError("nodes not Ready after %ss: %s" % (timeout, last))
            time.sleep(interval)
    finally:
        api_client.close()
