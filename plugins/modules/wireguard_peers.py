#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: wireguard_peers
short_description: Converge the peers of a WireGuard interface to an explicit list without dropping tunnels
version_added: "0.1.0"
description:
  - Compares an explicit, complete peer list with the live interface (C(wg show <if> dump)) and applies only
    the difference with one C(wg set). New peers are added, changed peers are updated in place (their sessions
    survive), peers marked absent (or, with O(exclusive), not listed) are removed. Peers that did not change
    are not touched, so their tunnels are never torn down by an unrelated change.
  - The list is never derived from the hosts of the current play, so C(--limit) cannot drop peers.
  - The whole list is validated before anything is touched (key format, VPN IP inside O(vpn_cidr), no
    duplicate VPN IP or key, not the interface's own key); an invalid list, or an empty list with
    O(exclusive), fails and leaves the interface as it was.
  - A VPN IP given to a new key replaces the peer that held it before (Constellation diffs by AllowedIPs).
author: Constellation cluster contributors (@constellation-cluster)
extends_documentation_fragment:
  - constellation.cluster.wireguard
options:
  interface:
    description: The WireGuard interface, created before with M(constellation.cluster.wireguard_interface).
    type: str
    default: wg0
  peers:
    description: The peers. Every entry is checked; the error names the entry's index and field.
    type: list
    elements: dict
    required: true
    suboptions:
      pub_key:
        description: The peer's public key (base64, 44 characters).
        type: str
        required: true
      vpn_ip:
        description:
          - The peer's VPN IP, as an address or C(<address>/32); becomes the peer's AllowedIPs entry (with
            O(peers[].pod_cidr) its second one).
          - Required for present peers.
        type: str
      pod_cidr:
        description:
          - The peer's pod CIDR (a network such as C(10.244.1.0/24)); added to its AllowedIPs, so pod traffic to and
            from it rides the tunnel (docs/wireguard.md). Omit for a peer without pods (an admin).
          - It must overlap neither O(vpn_cidr) nor another entry's pod CIDR; AllowedIPs are compared as a set.
        type: str
        version_added: "0.5.0"
      endpoint:
        description:
          - The peer's public endpoint C(IP:port) (C([IPv6]:port)). Omit for peers without a fixed address
            (an admin); WireGuard then keeps the endpoint it learns.
        type: str
      persistent_keepalive:
        description: Seconds between keepalives; V(0) turns them off.
        type: int
        default: 10
      state:
        description: V(absent) removes the peer with this key.
        type: str
        choices: [present, absent]
        default: present
  exclusive:
    description: Remove every live peer that is not listed. An empty list is then refused.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Computes the same difference and changes nothing.
  diff_mode:
    support: full
    description: Shows the peer configuration before and after (public keys, VPN IPs, endpoints); never a private key.
  idempotent:
    support: full
    description: A second run with the same list reports no change.
"""

EXAMPLES = r"""
- name: WireGuard interface of a node
  constellation.cluster.wireguard_interface:
    name: wg0
    address: "{{ wireguard_vpn_ip }}/16"
  register: wg

- name: Full mesh of the cluster (the list from the inventory, not from the play's hosts), without this host
  constellation.cluster.wireguard_peers:
    interface: wg0
    exclusive: true
    peers: "{{ wireguard_peers | rejectattr('pub_key', 'equalto', wg.vpn_pub_key) }}"

- name: Remove a retired node
  constellation.cluster.wireguard_peers:
    interface: wg0
    peers:
      - pub_key: hT3kaGYGmU5Jc6Pvfb4fS3xLF8U1TTm9lqsy/c0mW3c=
        state: absent
"""

RETURN = r"""
peers_added:
  description: Peers added (or that would be).
  returned: always
  type: list
  elements: dict
  sample: [{pub_key: hT3kaGYGmU5Jc6Pvfb4fS3xLF8U1TTm9lqsy/c0mW3c=, vpn_ip: 10.118.0.12, endpoint: "10.42.0.12:51820",
            persistent_keepalive: 10}]
peers_changed:
  description: Peers updated in place, with their new settings.
  returned: always
  type: list
  elements: dict
peers_removed:
  description: Peers removed.
  returned: always
  type: list
  elements: dict
vpn_pub_key:
  description: The interface's own public key.
  returned: when the interface exists
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import (
    InterfaceState,
    WireGuard,
    apply_to_peers,
    diff_peers,
    parse_peer_list,
    render_peers,
    validate_interface_name,
)


def run(module, wg):
    params = module.params
    name = validate_interface_name(params["interface"])
    live = wg.show(name)
    if live is None:
        if not module.check_mode:
            module.fail_json(msg="interface: %s is not a WireGuard interface on this host "
                                 "(create it with constellation.cluster.wireguard_interface first)" % name)
        module.warn("%s does not exist yet; the difference is computed against an empty interface" % name)
        live = InterfaceState(name, None, 0, 0, {})
    # Everything is validated before anything is touched.
    requests = parse_peer_list(params["peers"], params["vpn_cidr"], live.pub_key, params["exclusive"])
    diff = diff_peers(requests, live, params["exclusive"])
    if diff and not module.check_mode:
        wg.apply_peer_diff(name, diff)
    result = {
        "changed": bool(diff),
        "peers_added": [p.to_dict() for p in diff.added],
        "peers_changed": [p.to_dict() for p in diff.changed],
        "peers_removed": [p.to_dict() for p in diff.removed],
    }
    if live.pub_key:
        result["vpn_pub_key"] = live.pub_key
    if module._diff:
        before = live.peer_list()
        result["diff"] = {
            "before_header": "%s peers" % name,
            "after_header": "%s peers" % name,
            "before": render_peers(before),
            "after": render_peers(apply_to_peers(before, diff)),
        }
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            interface=dict(type="str", default="wg0"),
            peers=dict(
                type="list",
                elements="dict",
                required=True,
                options=dict(
                    pub_key=dict(type="str", required=True, no_log=False),
                    vpn_ip=dict(type="str"),
                    pod_cidr=dict(type="str"),
                    endpoint=dict(type="str"),
                    persistent_keepalive=dict(type="int", default=10),
                    state=dict(type="str", choices=["present", "absent"], default="present"),
                ),
            ),
            exclusive=dict(type="bool", default=False),
            vpn_cidr=dict(type="str", default="10.118.0.0/16"),
        ),
        supports_check_mode=True,
    )
    try:
        result = run(module, WireGuard())
    except ConstellationError as err:
        module.fail_json(msg=str(err))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
