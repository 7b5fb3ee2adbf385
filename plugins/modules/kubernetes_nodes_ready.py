#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: kubernetes_nodes_ready
short_description: Wait until Kubernetes nodes report Ready and return their state
version_added: "0.2.0"
author: constellation.cluster contributors (@constellation-cluster)
deprecated:
  removed_in: 2.0.0
  why: kubernetes.core's k8s_info waits for a Node's Ready condition as this module does.
  alternative: >-
    Use M(kubernetes.core.k8s_info) with C(kind=Node), O(kubernetes.core.k8s_info#module:wait=true) and a
    C(wait_condition) of type C(Ready), or the kubeadm_control_plane role's C(nodes_ready) entry point.
description:
  - Asks the Kubernetes API server (with the C(kubernetes) Python client and the credentials of O(kubeconfig)) for
    its nodes until every node named in O(nodes) is registered and Ready, or until at least O(expected_nodes) nodes
    are Ready. Gives up after O(timeout) seconds, naming every node still not Ready and why (the reason and message
    of its C(Ready) condition, or that no such node registered).
  - The API server's certificate is verified against the kubeconfig's CA. Refused credentials (401, 403) and a
    certificate that CA does not vouch for fail at once, without waiting.
  - Read-only; never reports a change.
requirements:
  - kubernetes Python client on the host
options:
  kubeconfig:
    description: The kubeconfig to reach the API server with; the admin kubeconfig C(kubeadm init) wrote by default.
    type: path
    default: /etc/kubernetes/admin.conf
  nodes:
    description:
      - Names of the nodes that must all be Ready (the C(nodeRegistration.name) kubeadm gave them).
      - Mutually exclusive with O(expected_nodes). Without either, one Ready node is enough.
    type: list
    elements: str
  expected_nodes:
    description: How many nodes must be Ready, at least 1. Mutually exclusive with O(nodes).
    type: int
  timeout:
    description: Give up after this many seconds (at most 3600).
    type: float
    default: 300
  interval:
    description: Seconds between two requests to the API server (at most O(timeout)).
    type: float
    default: 5
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: Read-only; it runs in check mode as it does otherwise.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
  idempotent:
    description: When run twice in a row outside check mode, with the same arguments, the second invocation indicates no change.
    support: full
seealso:
  - module: constellation.cluster.kubeadm_init
  - module: constellation.cluster.kubeadm_join
"""

EXAMPLES = r"""
- name: Wait until the control plane and the workers are Ready
  constellation.cluster.kubernetes_nodes_ready:
    nodes: [coordinator-0, worker-0, worker-1]
    timeout: 600
  register: cluster_nodes

- name: Report them
  ansible.builtin.debug:
    msg: "{{ item.name }}: kubelet {{ item.kubelet_version }}"
  loop: "{{ cluster_nodes.nodes }}"

- name: At least three nodes Ready, whatever their names
  constellation.cluster.kubernetes_nodes_ready:
    kubeconfig: /root/.kube/config
    expected_nodes: 3
"""

RETURN = r"""
nodes:
  description:
    - The nodes named in O(nodes), in that order; with O(expected_nodes), every node the API server lists, by name.
  returned: success
  type: list
  elements: dict
  contains:
    name:
      description: The node's name.
      type: str
      sample: worker-0
    ready:
      description: Whether its C(Ready) condition is C(True).
      type: bool
      sample: true
    reason:
      description: The reason of its C(Ready) condition (null when it reported none).
      type: str
      sample: KubeletReady
    message:
      description: The message of its C(Ready) condition (null when it reported none).
      type: str
      sample: kubelet is posting ready status
    kubelet_version:
      description: The version of the node's kubelet (null when it reported none).
      type: str
      sample: v1.31.1
ready:
  description: Names of the Ready nodes among RV(nodes).
  returned: success
  type: list
  elements: str
  sample: [coordinator-0, worker-0, worker-1]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm import wait_for_nodes_ready


def main():
    module = AnsibleModule(
        argument_spec=dict(
            kubeconfig=dict(type="path", default="/etc/kubernetes/admin.conf"),
            nodes=dict(type="list", elements="str"),
            expected_nodes=dict(type="int"),
            timeout=dict(type="float", default=300),
            interval=dict(type="float", default=5),
        ),
        mutually_exclusive=[("nodes", "expected_nodes")],
        supports_check_mode=True,
    )
    params = module.params
    try:
        records = wait_for_nodes_ready(params["kubeconfig"], expected_nodes=params["expected_nodes"],
                                       timeout=params["timeout"], interval=params["interval"], nodes=params["nodes"])
    except ConstellationError as err:
        module.fail_json(msg=str(err))
    module.exit_json(changed=False, nodes=[r.as_dict() for r in records], ready=[r.name for r in records if r.ready])


if __name__ == "__main__":
    main()
