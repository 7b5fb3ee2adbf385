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
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.pki import (  # noqa: F401
    MASTERS_GROUP,
    kubeconfig_client_identity,
    kubelet_cert_current,
    kubelet_csr,
    sign_kubelet_csr,
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


def read_admin_kubeconfig(path: str = os.path.join(KUBERNETES_DIR, "admin.conf")) -> str:
    """A kubeconfig file's text: a kubernetes directory means its admin.conf."""
    if os.path.isdir(path):
        path = os.path.join(path, "admin.conf")
    with open(path, encoding="utf-8") as handle:
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


# The steps of Constellation's init (its bootstrapper's InitCluster; docs/kubeadm.md), in order.
INIT_STEP_AUDIT_POLICY = "audit-policy"
INIT_STEP_PREFLIGHT = "preflight"
INIT_STEP_CERTS = "certs"
INIT_STEP_KUBELET_CERT = "kubelet-serving-cert"
INIT_STEP_MANIFESTS = "manifests-dir"
INIT_STEP_INIT = "init"
INIT_STEP_ADMIN_KUBECONFIG = "admin-kubeconfig"
INIT_STEPS = (INIT_STEP_AUDIT_POLICY, INIT_STEP_PREFLIGHT, INIT_STEP_CERTS, INIT_STEP_KUBELET_CERT,
              INIT_STEP_MANIFESTS, INIT_STEP_INIT, INIT_STEP_ADMIN_KUBECONFIG)


@dataclass
class InitPhase:
    """One step of the init as it is reported: what it is, whether it ran, and the kubeadm command it ran."""

    name: str
    status: str  # "ran", "done before" or "would run"
    command: Optional[str] = None

    def as_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "command": self.command}


@dataclass
class InitResult:
    changed: bool
    config: list
    ca_cert_hash: Optional[str] = None
    # The admin kubeconfig (<clusterName>-admin in system:masters), as Constellation returns it to the CLI.
    kubeconfig: Optional[str] = field(default=None, repr=False)
    token: Optional[str] = field(default=None, repr=False)
    certificate_key: Optional[str] = field(default=None, repr=False)
    phases: list = field(default_factory=list)


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def _audit_policy_target(docs: Sequence[Mapping], kubernetes_dir: str) -> str:
    """Where the rendered ClusterConfiguration tells the API server to read its audit policy."""
    for doc in docs:
        if doc.get("kind") == "ClusterConfiguration":
            args = (doc.get("apiServer") or {}).get("extraArgs") or {}
            pairs = args.items() if isinstance(args, dict) else ((a["name"], a["value"]) for a in args)
            for name, value in pairs:
                if name == "audit-policy-file":
                    return value
    return audit_policy_path(kubernetes_dir)


def admin_kubeconfig_current(params: InitParams) -> bool:
    """The node has the ``<clusterName>-admin`` kubeconfig, in system:masters, issued by this cluster's CA."""
    try:
        text = _read_bytes(params.admin_kubeconfig_path).decode("utf-8")
        ca_pem = _read_bytes(os.path.join(params.kubernetes_dir, "pki", "ca.crt"))
        who = kubeconfig_client_identity(text, ca_pem)
    except (OSError, UnicodeDecodeError, InputError):
        return False
    return (who["user"] == params.admin_client_name and who["common_name"] == params.admin_client_name
            and who["organizations"] == [MASTERS_GROUP])


def write_kubelet_serving_cert(params: InitParams) -> bool:
    """The first kubelet's serving key and certificate, signed locally with the new cluster CA, where the
    KubeletConfiguration's tlsCertFile/tlsPrivateKeyFile point. Returns changed (a current pair is kept)."""
    pki = os.path.join(params.kubernetes_dir, "pki")
    ca_pem = _read_bytes(os.path.join(pki, "ca.crt"))
    ips = [params.node_vpn_ip]
    try:
        if kubelet_cert_current(_read_bytes(params.kubelet_tls_cert_file), _read_bytes(params.kubelet_tls_key_file),
                                ca_pem, params.node_name, ips):
            return False
    except OSError:
        pass
    pair = kubelet_csr(params.node_name, ips)
    cert_pem = sign_kubelet_csr(pair.csr_pem, ca_pem, _read_bytes(os.path.join(pki, "ca.key")))
    os.makedirs(os.path.dirname(params.kubelet_tls_key_file), mode=0o700, exist_ok=True)
    os.makedirs(os.path.dirname(params.kubelet_tls_cert_file), mode=0o755, exist_ok=True)
    write_if_changed(params.kubelet_tls_key_file, pair.key_pem, 0o600)
    write_if_changed(params.kubelet_tls_cert_file, cert_pem, 0o644)
    return True


def _recreate_manifests_dir(kubernetes_dir: str) -> None:
    """Constellation empties the static pod directory before init: kubeadm writes every manifest anew."""
    manifests = os.path.join(kubernetes_dir, "manifests")
    shutil.rmtree(manifests, ignore_errors=True)
    os.makedirs(manifests, mode=0o755)


def _write_admin_kubeconfig(kubeadm: Kubeadm, params: InitParams, config_path: str) -> None:
    text = kubeadm.kubeconfig_user(config_path, params.admin_client_name, [MASTERS_GROUP])
    ca_pem = _read_bytes(os.path.join(params.kubernetes_dir, "pki", "ca.crt"))
    who = kubeconfig_client_identity(text, ca_pem)  # InputError: kubeadm printed something else
    if who["common_name"] != params.admin_client_name or who["organizations"] != [MASTERS_GROUP]:
        raise StateError("kubeadm kubeconfig user printed a kubeconfig for %s in %s, not %s in %s"
                         % (who["common_name"], who["organizations"], params.admin_client_name, MASTERS_GROUP))
    write_if_changed(params.admin_kubeconfig_path, text.encode("utf-8"), 0o600)


def _command(kubeadm_args: Sequence[str]) -> str:
    return "kubeadm " + " ".join(kubeadm_args)


def init_commands(params: InitParams, upload_certs: bool) -> dict:
    """The kubeadm command (without -v and --config) each step runs, for the report."""
    final = ["init", "--skip-phases=%s" % ",".join(params.init_skip_phases)]
    if upload_certs:
        final.append("--upload-certs")
    return {
        INIT_STEP_PREFLIGHT: _command(["init", "phase", "preflight"]),
        INIT_STEP_CERTS: _command(["init", "phase", "certs", "all"]),
        INIT_STEP_INIT: _command(final),
        INIT_STEP_ADMIN_KUBECONFIG: _command(["kubeconfig", "user", "--client-name", params.admin_client_name,
                                              "--org", MASTERS_GROUP]),
    }


def _run_init_step(step: str, kubeadm: Kubeadm, params: InitParams, docs: list, config_path: str,
                   upload_certs: bool) -> None:
    if step == INIT_STEP_AUDIT_POLICY:
        _atomic_write(_audit_policy_target(docs, params.kubernetes_dir), dump_documents([audit_policy()]), 0o600)
    elif step == INIT_STEP_PREFLIGHT:
        kubeadm.init_phase(["preflight"], config_path)
    elif step == INIT_STEP_CERTS:
        kubeadm.init_phase(["certs", "all"], config_path)
    elif step == INIT_STEP_KUBELET_CERT:
        write_kubelet_serving_cert(params)
    elif step == INIT_STEP_MANIFESTS:
        _recreate_manifests_dir(params.kubernetes_dir)
    elif step == INIT_STEP_INIT:
        kubeadm.init_skipping(config_path, params.init_skip_phases, upload_certs)
        if not is_initialised(params.kubernetes_dir):
            raise StateError("kubeadm init succeeded but %s/admin.conf or pki/ca.crt is missing" % params.kubernetes_dir)
    elif step == INIT_STEP_ADMIN_KUBECONFIG:
        _write_admin_kubeconfig(kubeadm, params, config_path)


def init_control_plane(kubeadm: Kubeadm, params: InitParams, upload_certs: bool = False,
                       check_mode: bool = False) -> InitResult:
    """Constellation's init, step by step, unless this host already is a control plane:

    audit policy (where the API server's ``audit-policy-file`` points) -> ``kubeadm init phase preflight``
    -> ``kubeadm init phase certs all`` -> the kubelet's serving certificate signed locally with the new CA
    -> empty manifests directory -> ``kubeadm init --skip-phases=preflight,certs,addon/coredns[,addon/kube-proxy]``
    -> ``kubeadm kubeconfig user --client-name <clusterName>-admin --org system:masters``, kept 0600 on the node.

    An initialised control plane (admin.conf and pki/ca.crt) is never initialised again; only a missing or
    foreign ``<clusterName>-admin`` kubeconfig is made anew. Every step is reported (``phases``).
    """
    commands = init_commands(params, upload_certs)
    if is_initialised(params.kubernetes_dir):
        todo = [] if admin_kubeconfig_current(params) else [INIT_STEP_ADMIN_KUBECONFIG]
    else:
        todo = list(INIT_STEPS)
        if params.token is None:
            params.token = generate_token()
        if upload_certs and params.certificate_key is None:
            params.certificate_key = generate_certificate_key()
        if not upload_certs:
            params.certificate_key = None
    docs = render_init(params)
    if todo:
        kubeadm.path  # no kubeadm: fail before anything is written (and in a dry run too)  # noqa: B018
    phases = [InitPhase(step, ("would run" if check_mode else "ran") if step in todo else "done before",
                        commands.get(step)) for step in INIT_STEPS]
    fresh = INIT_STEP_INIT in todo
    if check_mode or not todo:
        done = not todo
        return InitResult(changed=bool(todo), config=redact(docs) if fresh else [],
                          ca_cert_hash=read_ca_cert_hash(params.kubernetes_dir) if not fresh else None,
                          kubeconfig=read_admin_kubeconfig(params.admin_kubeconfig_path) if done else None,
                          phases=[p.as_dict() for p in phases])
    if fresh and params.patches_dir:
        os.makedirs(params.patches_dir, mode=0o755, exist_ok=True)
    with _PrivateConfig(docs) as config_path:
        for step in todo:
            try:
                _run_init_step(step, kubeadm, params, docs, config_path, upload_certs)
            except ExternalCommandError as err:
                raise _scrubbed(err, [params.token, params.certificate_key]) from None
    return InitResult(changed=True, config=redact(docs) if fresh else [],
                      ca_cert_hash=read_ca_cert_hash(params.kubernetes_dir),
                      kubeconfig=read_admin_kubeconfig(params.admin_kubeconfig_path),
                      token=params.token if fresh else None,
                      certificate_key=params.certificate_key if fresh else None,
                      phases=[p.as_dict() for p in phases])


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
