#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: coordinator_member
short_description: Remove a dead Coordinator's etcd member and peer entry from the cluster
version_added: "0.3.0"
description:
  - Runs on a live Coordinator (one whose node agent runs an etcd member, agent config C(etcd_member)) and
    takes a dead Coordinator out of the cluster's shared state, from that Coordinator's own etcd member.
  - Removes the etcd member whose peer URL is on O(vpn_ip) first (a dead member still counts in etcd's majority),
    then the registry's peer entry with the role coordinator at O(vpn_ip), in one transaction; that releases the
    VPN IP, so the next Coordinator activated with C(playbooks/add_nodes.yml) gets it again. The agents follow the
    registry's version, so the other Coordinators drop its WireGuard peer, the Nodes learn the removal with their
    next update and stop polling it.
  - Refuses the Coordinator it runs on, the etcd cluster's last member, a peer that is not a Coordinator, and a
    member that still takes connections on its client URL unless O(force) is set.
  - Needs a majority of the etcd members running; a cluster that lost its majority cannot change its members
    (docs/store.md).
author:
  - constellation.cluster contributors (@constellation-cluster)
requirements:
  - The Python package etcd3gw on the Coordinator (Debian C(python3-etcd3gw); the node_agent role installs it
    with C(node_agent_etcd_member) or an etcd store)
options:
  vpn_ip:
    description: The dead Coordinator's VPN IP, such as C(10.118.0.2).
    type: str
    required: true
  state:
    description:
      - V(absent) removes the member and the peer entry.
      - V(query) only reports what is there, whether the member answers, and what V(absent) would remove.
    type: str
    choices: [absent, query]
    default: absent
  force:
    description:
      - Remove the member even though something takes connections on its client URL (it may still run).
        A running Coordinator that is removed loses its share of the cluster's state; reset it before it is added
        again.
    type: bool
    default: false
  agent_state_dir:
    description:
      - The node agent's state directory (agent config C(state_dir)). This Coordinator's VPN IP is read from its etcd
        member's certificate (the agent's store is sealed to the TPM).
    type: path
    default: /var/lib/constellation-agent
  etcd_data_dir:
    description:
      - The member's directory (agent config C(etcd_member.data_dir)); its TLS files are in C(tls/).
      - Default C(<agent_state_dir>/etcd).
    type: path
  etcd_client_port:
    description: The members' client port (agent config C(etcd_member.client_port)).
    type: int
    default: 2379
  timeout:
    description: Seconds to wait for the dead member's client URL to take a connection.
    type: float
    default: 2
attributes:
  check_mode:
    support: full
    description: Reports what would be removed and changes nothing.
  diff_mode:
    support: full
    description: Shows the etcd members and the Coordinator peer entry before and after (names, URLs, public keys).
  idempotent:
    support: full
    description: A second run finds nothing to remove and reports no change.
notes:
  - Run it on a live Coordinator (C(coordinators) group) through the cluster's connection (C(playbooks/remove_coordinator.yml));
    C(playbooks/add_nodes.yml) then adds the replacement (docs/store.md, "Replacing a dead Coordinator").
"""

EXAMPLES = r"""
- name: Remove the dead Coordinator 10.118.0.2
  constellation.cluster.coordinator_member:
    vpn_ip: 10.118.0.2
    state: absent

- name: Only report whether its member still answers
  constellation.cluster.coordinator_member:
    vpn_ip: 10.118.0.2
    state: query
  register: dead
"""

RETURN = r"""
vpn_ip:
  description: The VPN IP given, normalised.
  returned: always
  type: str
  sample: 10.118.0.2
member:
  description: The etcd member removed (or that would be); null when there is none.
  returned: success
  type: dict
  sample: {id: 8e9e05c52164694d, name: coordinator-10-118-0-2, peer_urls: ["https://10.118.0.2:2380"],
           client_urls: ["https://10.118.0.2:2379"]}
peer:
  description: The registry's Coordinator entry removed (or that would be); null when there is none.
  returned: success
  type: dict
  sample: {vpn_ip: 10.118.0.2, vpn_pub_key: hT3kaGYGmU5Jc6Pvfb4fS3xLF8U1TTm9lqsy/c0mW3c=, public_ip: 192.0.2.12,
           role: coordinator}
health:
  description: Whether the member took a connection on its client URL (V(reachable)) and what it answered; null
    when there is no member.
  returned: success
  type: dict
  sample: {reachable: false, detail: "https://10.118.0.2:2379: Connection refused"}
members:
  description: The etcd members that remain (or would).
  returned: success
  type: list
  elements: dict
peer_version:
  description: The registry's version after the removal.
  returned: when a peer entry was removed
  type: int
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils.core.coordinator_removal import remove_coordinator
from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd_members import check_vpn_ip, open_local_member


def _render(members, peer):
    lines = ["etcd member %s %s %s" % (m["id"], m["name"] or "(never started)", ",".join(m["peer_urls"]))
             for m in members]
    if peer is not None:
        lines.append("peer %s coordinator %s %s" % (peer["vpn_ip"], peer["vpn_pub_key"], peer["public_ip"] or ""))
    return "\n".join(lines) + "\n"


def run(module):
    params = module.params
    query = params["state"] == "query"
    check_vpn_ip(params["vpn_ip"])
    local = open_local_member(params["agent_state_dir"], params["etcd_data_dir"], params["etcd_client_port"])
    try:
        result = remove_coordinator(local.store, params["vpn_ip"], check=module.check_mode or query,
                                    force=params["force"], tls=local.tls, timeout=params["timeout"])
    finally:
        local.close()
    if query:
        result["changed"] = False
    elif module._diff:
        before = result["members"] + ([result["member"]] if result["member"] else [])
        result["diff"] = {"before_header": "etcd members and peer %s" % result["vpn_ip"],
                          "after_header": "etcd members and peer %s" % result["vpn_ip"],
                          "before": _render(sorted(before, key=lambda m: m["id"]), result["peer"]),
                          "after": _render(sorted(result["members"], key=lambda m: m["id"]), None)}
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            vpn_ip=dict(type="str", required=True),
            state=dict(type="str", choices=["absent", "query"], default="absent"),
            force=dict(type="bool", default=False),
            agent_state_dir=dict(type="path", default="/var/lib/constellation-agent"),
            etcd_data_dir=dict(type="path"),
            etcd_client_port=dict(type="int", default=2379),
            timeout=dict(type="float", default=2),
        ),
        supports_check_mode=True,
    )
    try:
        result = run(module)
    except ConstellationError as err:
        module.fail_json(msg=str(err), vpn_ip=module.params["vpn_ip"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
