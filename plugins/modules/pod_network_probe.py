#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: pod_network_probe
short_description: Ping addresses from a short-lived probe pod on the node's pod network
version_added: "0.5.0"
description:
  - Makes a probe pod as the kubelet's container runtime would - a network namespace C(cprobe-<random>)
    attached through the node's conflist (made by M(constellation.cluster.pod_network)) with the real CNI
    plugins (C(CNI_COMMAND=ADD)) - pings each of O(addresses) from inside it, then removes it (C(DEL), the
    namespace deleted) whatever happened. Nothing is left behind.
  - The probe's address comes from the node's pod CIDR, so a ping to another node's gateway (the first address
    of its pod CIDR) or pod travels pod to pod over C(wg0).
  - An address that does not answer is reported, not a failure; the caller decides (verify.yml).
author: Constellation cluster contributors (@constellation-cluster)
extends_documentation_fragment:
  - constellation.cluster.pod_network
options:
  addresses:
    description: The IP addresses to ping from the probe pod.
    type: list
    elements: str
    required: true
  count:
    description: Pings sent to each address (1-60); one answer makes it reachable.
    type: int
    default: 3
  wait:
    description: Seconds to wait for each answer (1-60).
    type: int
    default: 2
attributes:
  check_mode:
    support: full
    description: Probes in check mode too; the probe leaves nothing behind.
  diff_mode:
    support: none
    description: Changes nothing, so there is nothing to show.
  idempotent:
    support: full
    description: Never reports a change.
seealso:
  - module: constellation.cluster.pod_network
"""

EXAMPLES = r"""
- name: Pod-to-pod pings to the other nodes' gateways
  constellation.cluster.pod_network_probe:
    addresses: [10.244.2.1, 10.244.3.1]
  register: probe

- name: Every gateway answered
  ansible.builtin.assert:
    that: probe.results | rejectattr('reachable') | list | length == 0
"""

RETURN = r"""
probe_address:
  description: The probe pod's address (from the node's pod CIDR).
  returned: always
  type: str
  sample: 10.244.1.7
results:
  description: Per address, in the order given.
  returned: always
  type: list
  elements: dict
  contains:
    address:
      description: The address pinged.
      type: str
      sample: 10.244.2.1
    reachable:
      description: Whether at least one ping was answered.
      type: bool
      sample: true
    transmitted:
      description: Pings sent.
      type: int
      sample: 3
    received:
      description: Answers received.
      type: int
      sample: 3
unanswered:
  description: The addresses that did not answer.
  returned: always
  type: list
  elements: str
  sample: []
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils.pod_network import PodNetwork


def main():
    module = AnsibleModule(
        argument_spec=dict(
            addresses=dict(type="list", elements="str", required=True),
            count=dict(type="int", default=3),
            wait=dict(type="int", default=2),
            conf_dir=dict(type="path", default="/etc/cni/net.d"),
            cni_path=dict(type="str", default="/usr/lib/cni"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        net = PodNetwork(conf_dir=params["conf_dir"], cni_path=params["cni_path"])
        found = net.probe(params["addresses"], params["count"], params["wait"])
    except (ConstellationError, OSError) as err:
        module.fail_json(msg=str(err))
    module.exit_json(changed=False, unanswered=[r["address"] for r in found["results"] if not r["reachable"]],
                     **found)


if __name__ == "__main__":
    main()
