# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""kubeadm, by concern: ``validate.py`` (constants, argument specs, validation, tokens, the CA hash),
``config.py`` (the documents), ``pki.py`` (the kubelet serving certificate signed with the cluster CA,
kubeconfig identities), ``command.py`` (running kubeadm through ``module_utils/command.py``)
and ``operations.py`` (conditions and operations). This module re-exports their public names; private
helpers (``_name``) stay in their own module and are imported from there.

kubeadm: the configuration documents Constellation generates, the pinned CA hash, bootstrap tokens,
certificate keys, and the one place that runs ``kubeadm``.

Three layers, lowest first (the community.crypto ``luks_device`` pattern):

* command seam: ``run_command`` is the only function that starts a program; ``Kubeadm`` builds the
  command lines and parses kubeadm's structured outputs (``token list -o json``, the token that
  ``token create`` prints) and the files kubeadm writes (``admin.conf``, ``pki/ca.crt``); never
  free-text scraping.
* conditions: ``is_initialised`` / ``is_joined`` look at what kubeadm left on disk and decide whether
  anything must change.
* operations: ``init_control_plane``, ``join_node``, ``ensure_token``, ``remove_token``: decide with the
  conditions, render the configuration, run kubeadm, read the results back.

Secrets (bootstrap token, certificate key) travel only inside a 0600 configuration file in a private
temporary directory, never on a command line (other users can read ``/proc/*/cmdline``), and every
configuration that is reported is redacted first. Joining always pins the cluster CA by its
SubjectPublicKeyInfo hash: there is deliberately no way to express ``unsafeSkipCAVerification``.
"""

from __future__ import annotations

# pylint: disable=unused-import
from ansible_collections.constellation.cluster.plugins.module_utils.command import CommandResult, run_command  # noqa: F401
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (  # noqa: F401
    ConstellationError,
    ExternalCommandError,
    InputError,
    StateError,
)
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.validate import (  # noqa: F401
    API_VERSIONS,
    AUDIT_API_VERSION,
    AUDIT_LOG_DIR,
    AUDIT_POLICY_FILE,
    CONSTELLATION_SKIP_PHASES,
    CONTROL_PLANE_PKI_FILES,
    CRI_SOCKET,
    DEFAULT_API_VERSION,
    DEFAULT_CLUSTER_NAME,
    DEFAULT_SERVICE_CIDR,
    DEFAULT_TOKEN_TTL,
    DOWNLOAD_CERTS_PHASE,
    FLEX_VOLUME_PLUGIN_DIR,
    INIT_PHASE_NAMES,
    INIT_PHASES,
    KUBE_PROXY_PHASE,
    KUBEADM_GROUP,
    KUBELET_API_VERSION,
    KUBELET_LOCAL_MODE_MIN_VERSION,
    KUBELET_TLS_CERT_FILE,
    KUBELET_TLS_CIPHER_SUITES,
    KUBELET_TLS_KEY_FILE,
    KUBERNETES_DIR,
    KUBERNETES_PORT,
    PATCHES_DIR,
    REDACTED,
    REGISTER_WITH_TAINTS,
    TOKEN_DESCRIPTION,
    TOKEN_GROUP,
    TOKEN_USAGES,
    V1BETA4_MIN_VERSION,
    ca_cert_hash,
    common_argument_spec,
    generate_certificate_key,
    generate_token,
    kubeconfig_ca_pems,
    node_argument_spec,
    token_id,
    ttl_seconds,
    validate_api_version,
    validate_ca_cert_hash,
    validate_certificate_key,
    validate_cidr,
    validate_endpoint,
    validate_host,
    validate_ip,
    validate_kubernetes_version,
    validate_node_name,
    validate_skip_phases,
    validate_token,
    validate_token_id,
    validate_ttl,
)
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.pki import (  # noqa: F401
    MASTERS_GROUP,
    NODES_GROUP,
    KubeletKeyPair,
    issued_by,
    kubeconfig_client_identity,
    kubelet_cert_current,
    kubelet_csr,
    sign_kubelet_csr,
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
    KubeadmMissing,
    TokenInfo,
    find_kubeadm,
    parse_token_list,
)
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.operations import (  # noqa: F401
    INIT_STEPS,
    InitPhase,
    InitResult,
    JoinResult,
    TokenResult,
    admin_kubeconfig_current,
    ensure_token,
    init_commands,
    init_control_plane,
    is_initialised,
    is_joined,
    join_node,
    list_tokens,
    missing_control_plane_pki,
    read_admin_kubeconfig,
    read_ca_cert_hash,
    remove_token,
    write_audit_policy,
    write_kubelet_serving_cert,
)
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.nodes import (  # noqa: F401
    MAX_WAIT_TIMEOUT,
    NodeStatus,
    wait_for_nodes_ready,
)
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.validate import HAS_CRYPTOGRAPHY  # noqa: F401
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.config import HAS_YAML  # noqa: F401
