#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: reset_agent
short_description: Reset a peer's agent so that the host can be activated again (ResetAgent)
version_added: "0.3.0"
description:
  - Attests the peer, proves the admin key and sends the ADMIN-channel method C(ResetAgent); the agent answers,
    stops, deletes its WireGuard interface, wipes its state folder (the sealed store, the sealed storage key, the
    disk key, its disk UUID, the warm interpreters) and starts again in the same process; this waits until it
    answers without a cluster state.
  - PCR 15 keeps the old cluster ID until the host reboots, so the agent comes back C(Failed) ("PCR 15 is set but
    no node state is stored") and the host can be activated again only after a reboot (then it is
    C(AcceptingInit)). RV(reboot_needed) says so.
  - A peer without a cluster state (fresh, or reset and not rebooted yet) is left alone. A Coordinator is refused
    unless O(force). An agent that keeps its state on a state disk or in etcd refuses (wipe those by hand).
  - Runs on the controller (an action plugin); the module file only documents it.
author:
  - constellation.cluster contributors (@constellation-cluster)
requirements:
  - The Python package cryptography on the controller (attested TLS and the signatures it checks)
extends_documentation_fragment:
  - constellation.cluster.attestation
  - constellation.cluster.admin_key
options:
  endpoint:
    description: The peer's public endpoint (host:port).
    type: str
    required: true
  public_ip:
    description: The peer's public IP; the agent refuses a reset that names another (a request sent to the wrong host).
    type: str
    required: true
  cluster_id:
    description: The cluster ID (standard base64); a peer locked to another cluster is refused.
    type: str
  force:
    description: Reset a Coordinator too (its cluster state goes with it).
    type: bool
    default: false
  unreachable_ok:
    description: A peer that does not answer is reported (RV(reachable) false, not changed) instead of failing.
    type: bool
    default: false
  wait_timeout:
    description: Seconds to wait until the reset agent answers again.
    type: float
    default: 60.0
attributes:
  check_mode:
    support: full
    description: Attests and reports whether the peer would be reset; nothing is sent.
  diff_mode:
    support: none
    description: No file changes on the controller.
  idempotent:
    support: full
    description: A reset peer holds no cluster state and is left alone.
"""

EXAMPLES = r"""
- name: Reset the host h4 (then reboot it before it is activated again)
  constellation.cluster.reset_agent:
    endpoint: 192.0.2.14:9000
    public_ip: 192.0.2.14
    admin_priv_key_file: inventories/prod/admin_key
    measurements_file: measurements.json
    ek_ca_path: inventories/prod/ek_ca.pem
"""

RETURN = r"""
state_before:
  description: The peer's state before.
  returned: success
  type: str
state:
  description: The peer's state after (C(Failed) until a reboot resets PCR 15, C(AcceptingInit) after).
  returned: success
  type: str
wiped:
  description: The paths the agent wiped.
  returned: success
  type: list
  elements: str
reboot_needed:
  description: PCR 15 still holds a cluster ID; the host can be activated again only after a reboot.
  returned: success
  type: bool
reachable:
  description: False when the peer did not answer and O(unreachable_ok) was set.
  returned: when unreachable
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import attested_options
from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import RESET_AGENT_ARGS, stub_main


def main():
    stub_main(AnsibleModule, "reset_agent", **attested_options(RESET_AGENT_ARGS))


if __name__ == "__main__":
    main()
