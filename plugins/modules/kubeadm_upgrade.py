#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: kubeadm_upgrade
short_description: Check the version skew of a Kubernetes upgrade and run kubeadm upgrade plan, apply or node
version_added: "0.3.0"
author: constellation.cluster contributors (@constellation-cluster)
description:
  - One step of a rolling Kubernetes upgrade with C(kubeadm) (playbooks/upgrade_kubernetes.yml rolls a cluster with it).
  - V(plan) reads the versions the cluster reports (each Node's kubelet; each control plane's kube-apiserver
    static pod) and checks the version-skew rules before anything changes. It fails naming every node that
    breaks a rule, with the version found, the version wanted and the rule - V(downgrade), V(one-minor),
    V(kubelet-skew), and for O(node_name) V(control-planes-first) (a worker's kubelet only once every API
    server is at the version) and V(apply-first) (a further control plane only after the first one). While
    the first control plane still needs C(kubeadm upgrade apply), it also runs C(kubeadm upgrade plan vX -o json)
    there and returns kubeadm's plan. Read-only, never changed.
  - V(apply) runs C(kubeadm upgrade apply vX --yes) on the first control plane, unless its kube-apiserver is at
    the version already.
  - V(node) runs C(kubeadm upgrade node) on a further control plane (unless its kube-apiserver is at the version)
    or on a worker (unless the API server reports its kubelet at the version).
  - V(apply) and V(node) refuse when the host's kubeadm is older than the version (V(kubeadm-version)).
  - The kubelet itself is the environment's (a package, an image); the playbook upgrades it with a command the
    operator sets, after this module.
options:
  kubernetes_version:
    description: The version to upgrade to, C(vMAJOR.MINOR.PATCH).
    type: str
    required: true
  step:
    description: Which step; see the description.
    type: str
    choices: [plan, apply, node]
    required: true
  node_name:
    description:
      - V(plan) the node whose order rules to check now (returned as RV(node)); V(node) this host's Kubernetes node
        name (a worker looks its kubelet up by it). Its C(nodeRegistration.name).
    type: str
  first_control_plane:
    description:
      - The Node name of the control plane where C(kubeadm upgrade apply) runs (V(plan)); the roll starts there.
    type: str
  kubeconfig:
    description:
      - The credentials to read the cluster with. Default C(<kubernetes_dir>/admin.conf); for V(node) on a worker
        C(<kubernetes_dir>/kubelet.conf) (a node may read its own Node).
    type: path
  kubeadm_path:
    description:
      - Path of the C(kubeadm) executable. When not set, C(kubeadm) is looked up on E(PATH).
    type: path
  kubernetes_dir:
    description: The directory kubeadm writes to (C(admin.conf), C(kubelet.conf), C(manifests/)).
    type: path
    default: /etc/kubernetes
requirements:
  - kubeadm on the managed host (V(apply), V(node), and V(plan) while apply is pending)
  - kubernetes Python client on the host
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: Reads the cluster and the host and reports what would run; runs no kubeadm command that changes anything.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
  idempotent:
    description: When run twice in a row outside check mode, with the same arguments, the second invocation indicates no change.
    support: full
seealso:
  - module: constellation.cluster.kubernetes_node_drain
  - module: constellation.cluster.kubernetes_nodes_ready
"""

EXAMPLES = r"""
- name: Check the skew and predict the roll (on the first control plane)
  constellation.cluster.kubeadm_upgrade:
    kubernetes_version: v1.32.0
    step: plan
    first_control_plane: cp-0
  register: k8s_plan

- name: Upgrade the first control plane
  constellation.cluster.kubeadm_upgrade:
    kubernetes_version: v1.32.0
    step: apply

- name: Upgrade a worker's kubeadm part (its kubelet configuration)
  constellation.cluster.kubeadm_upgrade:
    kubernetes_version: v1.32.0
    step: node
    node_name: worker-0
"""

RETURN = r"""
cluster_version:
  description: V(plan) the oldest API server's version.
  returned: step is plan
  type: str
  sample: v1.31.1
nodes:
  description: V(plan) every Node with its versions and what of it is not at the version yet (C(upgrade)).
  returned: step is plan
  type: list
  elements: dict
  sample: [{name: cp-0, control_plane: true, control_plane_version: v1.31.1, kubelet_version: v1.31.1,
            unschedulable: false, upgrade: [control-plane, kubelet]}]
order:
  description: V(plan) the roll order, control planes first (the first one at the head), then workers.
  returned: step is plan
  type: list
  elements: str
pending:
  description: V(plan) the nodes still to upgrade, in roll order.
  returned: step is plan
  type: list
  elements: str
upgrades:
  description: V(plan) one line per pending node - C(node), C(role), C(parts), C(from), C(kubelet_from), C(to).
  returned: step is plan
  type: list
  elements: dict
node:
  description: V(plan) the record of O(node_name) (null when not given).
  returned: step is plan
  type: dict
kubeadm_plan:
  description: V(plan) the components of C(kubeadm upgrade plan -o json) (empty when it did not run).
  returned: step is plan
  type: list
  elements: dict
control_plane:
  description: V(apply)/V(node) whether this host is a control plane (it has a kube-apiserver static pod).
  returned: step is apply or node
  type: bool
from_version:
  description: V(apply)/V(node) this host's version before (its kube-apiserver's, or a worker's kubelet's).
  returned: step is apply or node
  type: str
to_version:
  description: V(apply)/V(node) the version asked for.
  returned: step is apply or node
  type: str
command:
  description: V(apply)/V(node) the kubeadm command that ran (or would run in check mode); null when none.
  returned: step is apply or node
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.upgrade_steps import run_step


def main():
    module = AnsibleModule(
        argument_spec=dict(
            kubernetes_version=dict(type="str", required=True),
            step=dict(type="str", choices=["plan", "apply", "node"], required=True),
            node_name=dict(type="str"),
            first_control_plane=dict(type="str"),
            kubeconfig=dict(type="path"),
            kubeadm_path=dict(type="path"),
            kubernetes_dir=dict(type="path", default="/etc/kubernetes"),
        ),
        required_if=[("step", "node", ("node_name",))],
        supports_check_mode=True,
    )
    params = module.params
    try:
        result = run_step(params["step"], params["kubernetes_version"], kubernetes_dir=params["kubernetes_dir"],
                          kubeadm_path=params["kubeadm_path"], kubeconfig=params["kubeconfig"],
                          node_name=params["node_name"], first_control_plane=params["first_control_plane"],
                          check_mode=module.check_mode)
    except ConstellationError as err:
        refusals = [r.as_dict() for r in getattr(err, "refusals", [])]
        module.fail_json(msg=str(err), refusals=refusals)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
