#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: kubernetes_node_drain
short_description: Drain a Kubernetes node before maintenance, or make it schedulable again
version_added: "0.3.0"
author: constellation.cluster contributors (@constellation-cluster)
deprecated:
  removed_in: 2.0.0
  why: kubernetes.core's k8s_drain cordons, evicts through the Eviction API and uncordons as this module does.
  alternative: >-
    Use M(kubernetes.core.k8s_drain) with O(kubernetes.core.k8s_drain#module:state=drain) and
    C(delete_options.ignore_daemonsets=true), or O(kubernetes.core.k8s_drain#module:state=uncordon).
description:
  - V(drained) cordons the Node (C(spec.unschedulable)) and evicts its pods through the Eviction API, as
    C(kubectl drain --ignore-daemonsets) does - static (mirror) pods, DaemonSet pods and finished pods stay - and
    waits until they are gone. An eviction a PodDisruptionBudget refuses is asked again until O(timeout); then the
    module fails naming the pods still there.
  - V(uncordoned) makes the Node schedulable again.
  - Talks to the API server with the C(kubernetes) Python client and the credentials of O(kubeconfig) (its CA pinned).
options:
  node_name:
    description: The Kubernetes node name.
    type: str
    required: true
  state:
    description: V(drained) (cordoned and empty) or V(uncordoned) (schedulable).
    type: str
    choices: [drained, uncordoned]
    default: drained
  kubeconfig:
    description: Credentials allowed to patch nodes and evict pods; the admin kubeconfig by default.
    type: path
    default: /etc/kubernetes/admin.conf
  timeout:
    description: V(drained) gives up after this many seconds (at most 3600).
    type: float
    default: 300
requirements:
  - kubernetes Python client on the host
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: Reads the Node and its pods and reports what would be cordoned and evicted; changes nothing.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
  idempotent:
    description: When run twice in a row outside check mode, with the same arguments, the second invocation indicates no change.
    support: full
seealso:
  - module: constellation.cluster.kubeadm_upgrade
"""

EXAMPLES = r"""
- name: Drain worker-0 before its upgrade (asked on the first control plane)
  constellation.cluster.kubernetes_node_drain:
    node_name: worker-0
  delegate_to: cp-0

- name: Make it schedulable again
  constellation.cluster.kubernetes_node_drain:
    node_name: worker-0
    state: uncordoned
  delegate_to: cp-0
"""

RETURN = r"""
node:
  description: The node's name.
  returned: success
  type: str
  sample: worker-0
unschedulable:
  description: Whether the node is cordoned now (would be, in check mode).
  returned: success
  type: bool
evicted:
  description: The pods (C(namespace/name)) evicted (to be evicted, in check mode).
  returned: success
  type: list
  elements: str
  sample: [default/web-6d4cf56db6-x2b9q]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.roll import drain_node, set_schedulable


def main():
    module = AnsibleModule(
        argument_spec=dict(
            node_name=dict(type="str", required=True),
            state=dict(type="str", choices=["drained", "uncordoned"], default="drained"),
            kubeconfig=dict(type="path", default="/etc/kubernetes/admin.conf"),
            timeout=dict(type="float", default=300),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        if params["state"] == "drained":
            result = drain_node(params["kubeconfig"], params["node_name"], timeout=params["timeout"],
                                check_mode=module.check_mode)
        else:
            result = set_schedulable(params["kubeconfig"], params["node_name"], True, check_mode=module.check_mode)
    except ConstellationError as err:
        module.fail_json(msg="node %s: %s" % (params["node_name"], err))
    module.exit_json(**result.as_dict())


if __name__ == "__main__":
    main()
