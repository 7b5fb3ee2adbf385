#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: pod_network
short_description: The node's pod network over the attested WireGuard mesh (CNI conflist, bridge, nftables)
version_added: "0.5.0"
description:
  - Makes a node's pod network from Debian's containernetworking-plugins. Writes the CNI configuration list
    C(<conf_dir>/10-constellation.conflist) (network C(constellation)) that the kubelet's container runtime
    reads - C(bridge) on C(cni0) as the pods' gateway with hairpin mode and no masquerading (pod addresses
    are kept across nodes), C(host-local) IPAM over the node's O(pod_cidr), C(portmap) with SNAT, and
    C(loopback), at the MTU of C(wg0).
  - Creates the bridge C(cni0) with the first address of O(pod_cidr), so the node's own pod CIDR is routed
    to its bridge and every other pod CIDR to C(wg0) (the route O(cluster_pod_cidr) dev C(wg0) that the agent
    keeps), and turns on IPv4 forwarding and, where C(br_netfilter) is loaded, C(net.bridge.bridge-nf-call-iptables)
    (kube-proxy's Service rules then see traffic bridged between two pods of the node, hairpin included).
  - Applies the nftables table C(inet constellation_pod_network) in one transaction - packets to
    O(cluster_pod_cidr) that would leave by an interface other than C(wg0), C(cni0) or C(lo) are dropped, so
    pod traffic never goes out unencrypted; with O(masquerade), pod traffic to addresses outside the pod range
    and the VPN CIDR is masqueraded.
  - Checks everything that can fail before the first change (the values, the four plugins in O(cni_path),
    C(nft --check) of the table). Pod-range drop rules come first, the conflist (which lets the kubelet start
    pods) last.
  - NetworkPolicy is not enforced (no policy engine). Bring your own CNI by not running this module
    (C(constellation_pod_network=false)).
author: Constellation cluster contributors (@constellation-cluster)
extends_documentation_fragment:
  - constellation.cluster.pod_network
options:
  state:
    description:
      - V(present) makes the pod network as described; V(absent) removes the conflist, the bridge C(cni0)
        (with it the host side of every pod) and the nftables table.
    type: str
    choices: [present, absent]
    default: present
  pod_cidr:
    description:
      - The node's own pod CIDR, as the Coordinator allocated it (C(node_pod_cidr) of
        M(constellation.cluster.agent_state)). Must lie inside O(cluster_pod_cidr).
      - Required when O(state=present).
    type: str
  cluster_pod_cidr:
    description: The cluster's pod range (kubeadm's C(podSubnet)); must not overlap O(vpn_cidr).
    type: str
    default: 10.244.0.0/16
  vpn_cidr:
    description: The VPN CIDR of the mesh.
    type: str
    default: 10.118.0.0/16
  mtu:
    description: The pods' MTU; that of C(wg0) (1420 - 1500 minus WireGuard's 80 bytes).
    type: int
    default: 1420
  masquerade:
    description: Masquerade pod traffic to destinations outside O(cluster_pod_cidr) and O(vpn_cidr) (pod egress).
    type: bool
    default: true
attributes:
  check_mode:
    support: full
    description: Reports the steps that would be taken; the checks (plugins, C(nft --check)) still run.
  diff_mode:
    support: full
    description: Shows the conflist and the nftables table before and after.
  idempotent:
    support: full
    description: A second run with the same arguments reports no change.
seealso:
  - module: constellation.cluster.pod_network_probe
"""

EXAMPLES = r"""
- name: Pod network over the mesh (pod_cidr as agent_state reports the node's node_pod_cidr)
  constellation.cluster.pod_network:
    pod_cidr: 10.244.1.0/24
    cluster_pod_cidr: 10.244.0.0/16

- name: Remove it (reset)
  constellation.cluster.pod_network:
    state: absent
"""

RETURN = r"""
steps:
  description: The steps taken (or, in check mode, that would be taken), in order.
  returned: always
  type: list
  elements: str
  sample: [ip_forward, bridge_nf_call_iptables, nftables, bridge, bridge_mtu, bridge_address, bridge_up, conflist]
conflist:
  description: The path of the conflist.
  returned: always
  type: str
  sample: /etc/cni/net.d/10-constellation.conflist
gateway:
  description: The node's address on C(cni0), the pods' default gateway.
  returned: when state is present
  type: str
  sample: 10.244.1.1
pod_network:
  description: The settings applied.
  returned: when state is present
  type: dict
  sample:
    cluster_pod_cidr: 10.244.0.0/16
    pod_cidr: 10.244.1.0/24
    vpn_cidr: 10.118.0.0/16
    mtu: 1420
    masquerade: true
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils.pod_network import (
    PodNetwork,
    dump_conflist,
    parse_pod_network_spec,
    render_conflist,
    render_table,
)


def _text(data):
    return data.decode("utf-8", "replace") if data is not None else ""


def run(module, net):
    params = module.params
    if params["state"] == "absent":
        state, steps = net.remove(check_mode=module.check_mode)
        result = {"changed": bool(steps), "steps": steps, "conflist": net.conflist_path}
        if module._diff:
            result["diff"] = [
                {"before_header": net.conflist_path, "after_header": net.conflist_path,
                 "before": _text(state.conflist), "after": ""},
                {"before_header": "nftables", "after_header": "nftables", "before": state.table or "", "after": ""},
            ]
        return result
    spec = parse_pod_network_spec(params["cluster_pod_cidr"], params["pod_cidr"], params["vpn_cidr"], params["mtu"],
                                  params["masquerade"])
    state, steps = net.apply(spec, check_mode=module.check_mode)
    for name in state.other_conflists:
        module.warn("%s/%s sorts before %s: a container runtime uses the first conflist of the folder, so it "
                    "uses that one" % (net.conf_dir, name, net.conflist_path))
    result = {"changed": bool(steps), "steps": steps, "conflist": net.conflist_path, "gateway": spec.gateway,
              "pod_network": spec.to_dict()}
    if module._diff:
        result["diff"] = [
            {"before_header": net.conflist_path, "after_header": net.conflist_path,
             "before": _text(state.conflist), "after": _text(dump_conflist(render_conflist(spec)))},
            {"before_header": "nftables", "after_header": "nftables", "before": state.table or "",
             "after": render_table(spec) if "nftables" in steps else state.table or ""},
        ]
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["present", "absent"], default="present"),
            pod_cidr=dict(type="str"),
            cluster_pod_cidr=dict(type="str", default="10.244.0.0/16"),
            vpn_cidr=dict(type="str", default="10.118.0.0/16"),
            mtu=dict(type="int", default=1420),
            masquerade=dict(type="bool", default=True),
            conf_dir=dict(type="path", default="/etc/cni/net.d"),
            cni_path=dict(type="str", default="/usr/lib/cni"),
        ),
        required_if=[("state", "present", ["pod_cidr"])],
        supports_check_mode=True,
    )
    try:
        result = run(module, PodNetwork(conf_dir=module.params["conf_dir"], cni_path=module.params["cni_path"]))
    except (ConstellationError, OSError) as err:
        module.fail_json(msg=str(err))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
