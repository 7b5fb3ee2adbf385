# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The options of the controller-side actions (agent_state, activate_coordinator, activate_nodes,
recover_peer, ..., and the write-once secret files), beyond the shared attestation options
(attestation/policy.py). The action plugins validate with these dicts and the documentation stubs in
plugins/modules declare the same ones (``stub_main``), so the two cannot drift. The orchestration
itself is controller-only: plugins/plugin_utils/controller.py."""

from __future__ import annotations

from typing import Any, Dict

from ansible_collections.constellation.cluster.plugins.module_utils.constants import (
    CLUSTER_POD_CIDR,
    NODE_POD_CIDR_MASK_SIZE,
    deprecated_alias,
)


# The options of the controller-side actions beyond the shared attestation options
# (attestation/policy.py ATTESTATION_ARGUMENT_SPEC). The action plugins validate with these and
# their documentation stubs in plugins/modules declare the same dicts, so the two cannot drift.
ACTIVATE_COORDINATOR_ARGS: Dict[str, Dict[str, Any]] = dict(
    endpoint=dict(type="str", required=True),
    # The cluster's secrets: given (kms_uri, measurement_salt), or the two files, read or, where neither exists
    # yet, made in memory and written only once the Coordinator accepted them (a failed activation writes none).
    kms_uri=dict(type="str", no_log=True),
    measurement_salt=dict(type="str", no_log=True),
    master_secret_file=dict(type="path"),
    measurement_salt_file=dict(type="path"),
    vault=dict(type="bool", default=False),
    vault_id=dict(type="str"),
    storage_uri=dict(type="str", no_log=True),
    admin_pub_key=dict(type="str"),
    admin_priv_key_file=dict(type="path"),
    cluster_name=dict(type="str", default=""),
    vpn_cidr=dict(type="str", default="10.118.0.0/16"),
    # The pod network (docs/wireguard.md, "Pod CIDRs"): the Coordinator hands every Coordinator and Node a block of
    # cluster_pod_cidr; empty: no pod CIDRs (bring your own CNI).
    cluster_pod_cidr=dict(type="str", default=CLUSTER_POD_CIDR),
    node_pod_cidr_mask_size=dict(type="int", default=NODE_POD_CIDR_MASK_SIZE),
    init_secret=dict(type="str", no_log=True),
    # Unused since GetState reports the VPN IP and key; accepted with a deprecation until 2.0.0.
    vpn_interface=dict(type="str", removed_in_version="2.0.0", removed_from_collection="constellation.cluster"),
)
ACTIVATE_NODES_ARGS: Dict[str, Dict[str, Any]] = dict(
    # Renamed in 0.2.0 (docs/names.md: entity, interface, kind); the old names work until 2.0.0.
    coordinator_public_endpoint=dict(type="str", required=True, aliases=["coordinator_endpoint"],
                                     deprecated_aliases=[deprecated_alias("coordinator_endpoint")]),
    node_public_endpoints=dict(type="list", elements="str", required=True,
                               aliases=["node_endpoints"], deprecated_aliases=[deprecated_alias("node_endpoints")]),
    admin_priv_key_file=dict(type="path", required=True),
    cluster_id=dict(type="str"),
    # Further Coordinators (docs/store.md): activated first, in the same ActivateAdditionalNodes.
    coordinator_public_endpoints=dict(type="list", elements="str", default=[]),
    # Those of node_public_endpoints the admin designates control planes (recorded at activation).
    control_plane_public_endpoints=dict(type="list", elements="str", default=[]),
    # endpoint -> the node's name (its inventory name): its only kubelet node name (recorded at activation).
    node_names=dict(type="dict", default={}),
)
ADMIT_NODES_ARGS: Dict[str, Dict[str, Any]] = dict(
    coordinator_public_endpoint=dict(type="str", required=True),
    nodes=dict(type="list", elements="dict", required=True, options=dict(
        name=dict(type="str", required=True),
        ek_pub_sha256=dict(type="str"),
        ek_cert_file=dict(type="path"),
        endpoint=dict(type="str"),
        state=dict(type="str", default="present", choices=["present", "absent"]),
    )),
    admin_priv_key_file=dict(type="path", required=True),
    cluster_id=dict(type="str"),
)
AGENT_STATE_ARGS: Dict[str, Dict[str, Any]] = dict(
    endpoint=dict(type="str", required=True),
    cluster_id=dict(type="str"),
    # GetState tells anyone only state and role: with the admin key an activated peer's details are read.
    admin_priv_key_file=dict(type="path"),
)
RECOVER_PEER_ARGS: Dict[str, Dict[str, Any]] = dict(
    endpoint=dict(type="str", required=True),
    kms_uri=dict(type="str", required=True, no_log=True),
    measurement_salt=dict(type="str", required=True, no_log=True),
)
# Backup and restore of the Coordinator's state (backup.yml, restore.yml; plugins/plugin_utils/backup.py): the
# Coordinator, the KMS and the salt (as recover_peer) and the admin key.
_COORDINATOR_ADMIN_ARGS: Dict[str, Dict[str, Any]] = dict(
    RECOVER_PEER_ARGS,
    admin_priv_key_file=dict(type="path", required=True),
)
COORDINATOR_BACKUP_ARGS: Dict[str, Dict[str, Any]] = dict(
    _COORDINATOR_ADMIN_ARGS,
    backup_dir=dict(type="path", required=True),
    kubernetes=dict(type="bool", default=False),
    kubernetes_etcd_snapshot=dict(type="str", no_log=True),
    kubernetes_etcd_source=dict(type="dict"),
)
COORDINATOR_RESTORE_ARGS: Dict[str, Dict[str, Any]] = dict(
    _COORDINATOR_ADMIN_ARGS,
    init_secret=dict(type="str", no_log=True),
    backup=dict(type="path"),
    backup_dir=dict(type="path"),
    node_endpoints=dict(type="list", elements="str", default=[]),
    kubernetes_etcd_snapshot=dict(type="bool", default=False),
)
# Day-2: the admin removes a Node through the Coordinator; resets a peer's agent.
REMOVE_PEER_ARGS: Dict[str, Dict[str, Any]] = dict(
    coordinator_public_endpoint=dict(type="str", required=True),
    node_public_ip=dict(type="str"),
    node_vpn_ip=dict(type="str"),
    admin_priv_key_file=dict(type="path", required=True),
    cluster_id=dict(type="str"),
)
RESET_AGENT_ARGS: Dict[str, Dict[str, Any]] = dict(
    endpoint=dict(type="str", required=True),
    public_ip=dict(type="str", required=True),
    admin_priv_key_file=dict(type="path", required=True),
    cluster_id=dict(type="str"),
    force=dict(type="bool", default=False),
    unreachable_ok=dict(type="bool", default=False),
    wait_timeout=dict(type="float", default=60.0),
)
# A rolling image upgrade: SetMeasurements on the Coordinator (upgrade_image.yml).
ACCEPTED_MEASUREMENTS_ARGS: Dict[str, Dict[str, Any]] = dict(
    endpoint=dict(type="str", required=True),
    admin_priv_key_file=dict(type="path", required=True),
    accepted_measurements_file=dict(type="path"),
)
# An agent's PCR 13 computed on the controller and kept in the measurements document (agent_measurement): it
# takes the attestation options for the trust configuration (variant, ek_ca_path) and the document
# (measurements_file, measurements_pub_key_file) the validators use, from the same module_defaults.
AGENT_MEASUREMENT_ARGS: Dict[str, Dict[str, Any]] = dict(
    archive=dict(type="path"),
    src=dict(type="path"),
    name=dict(type="str"),
    state=dict(type="str", choices=["present", "absent"], default="present"),
    # As measurements_signature's signing key.
    priv_key_file=dict(type="path"),
    priv_key_passphrase=dict(type="str", no_log=True),
)
# image_measurements (attestation/image_prediction.py): the firmware choices are its FIRMWARE_PROFILES.
IMAGE_MEASUREMENTS_ARGS: Dict[str, Dict[str, Any]] = dict(
    uki=dict(type="path", required=True),
    name=dict(type="str", required=True),
    dest=dict(type="path", required=True),
    base_file=dict(type="path"),
    version=dict(type="int"),
    firmware=dict(type="str", choices=["ovmf-2022.11"], default="ovmf-2022.11"),
    # As measurements_signature's.
    priv_key_file=dict(type="path"),
    priv_key_passphrase=dict(type="str", no_log=True),
    pub_key_file=dict(type="path"),
)
VERIFY_ATTESTATION_ARGS: Dict[str, Dict[str, Any]] = dict(
    endpoint=dict(type="str", required=True),
)
# The write-once secret files on the controller (action/master_secret.py's WriteOnceSecretAction; their options
# are documented once, in doc_fragments/controller_secret_file.py).
SECRET_FILE_ARGS: Dict[str, Dict[str, Any]] = dict(
    path=dict(type="path", required=True),
    vault=dict(type="bool", default=False),
    vault_id=dict(type="str"),
)
KUBEADM_ADMIN_KUBECONFIG_ARGS: Dict[str, Dict[str, Any]] = dict(
    SECRET_FILE_ARGS,
    content=dict(type="str", required=True, no_log=True),
)


def stub_main(module_class, name: str, **module_args: Any) -> None:
    """The main() of a module whose work is done by its action plugin on the controller: the module declares the
    action's options (``module_args``: argument_spec, mutually_exclusive) for ansible-doc and validate-modules,
    and fails when it is run as a module on a host. ``module_class``: Ansible's AnsibleModule (this file imports
    no Ansible)."""
    module = module_class(supports_check_mode=True, **module_args)
    module.fail_json(msg="%s runs on the controller through its action plugin; it cannot run as a module on a host"
                     % name)
