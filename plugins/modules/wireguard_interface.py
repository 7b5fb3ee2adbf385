#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: wireguard_interface
short_description: Create a WireGuard interface with a private key generated on the host
version_added: "0.1.0"
description:
  - Creates (or removes) a WireGuard interface, with kernel WireGuard where the kernel has it, else C(wireguard-go).
  - Generates the interface's X25519 private key on the managed host if O(priv_key_file) does not exist
    (mode 0600, written atomically). The key never leaves the host; the module returns the public key.
  - Sets the private key, listen port, address and MTU and brings the interface up, each only if it differs.
    Peers are left untouched; manage them with M(constellation.cluster.wireguard_peers).
author: Constellation cluster contributors (@constellation-cluster)
extends_documentation_fragment:
  - constellation.cluster.wireguard
options:
  name:
    description: The interface name.
    type: str
    default: wg0
  priv_key_file:
    description:
      - File holding the interface's private key (base64, as C(wg genkey) writes it).
      - Created with a new key if absent; its mode is forced to 0600. An existing key is never replaced.
      - Defaults to C(/etc/wireguard/<name>.key).
      - The old name C(private_key_file) is deprecated and will be removed in 2.0.0.
    type: path
    aliases: [private_key_file]
  address:
    description:
      - The interface address with prefix, for example C(10.118.0.11/16) (the VPN IP with the VPN prefix).
      - Required when O(state=present). Must lie inside O(vpn_cidr). Other addresses on the interface are removed.
    type: str
  listen_port:
    description: UDP port WireGuard listens on.
    type: int
    default: 51820
  mtu:
    description: Interface MTU.
    type: int
    default: 1420
  state:
    description:
      - V(present) creates and configures the interface; V(absent) deletes it (the key file is kept, so the
        host keeps its identity when the interface is recreated).
    type: str
    choices: [present, absent]
    default: present
attributes:
  check_mode:
    support: full
    description: Reports what would change; creates neither the key file nor the interface.
  diff_mode:
    support: full
    description: Shows interface metadata (address, port, MTU, public key), never the private key.
  idempotent:
    support: full
    description: A second run with the same arguments reports no change.
"""

EXAMPLES = r"""
- name: WireGuard interface of a node
  constellation.cluster.wireguard_interface:
    name: wg0
    address: "{{ wireguard_vpn_ip }}/16"
  register: wg

- name: Remember the node's VPN public key
  ansible.builtin.set_fact:
    node_vpn_pub_key: "{{ wg.vpn_pub_key }}"
"""

RETURN = r"""
vpn_pub_key:
  description: The interface's public key (base64). Absent in check mode when the key file does not exist yet.
  returned: when state is present
  type: str
  sample: hT3kaGYGmU5Jc6Pvfb4fS3xLF8U1TTm9lqsy/c0mW3c=
interface:
  description: The interface name.
  returned: always
  type: str
  sample: wg0
actions:
  description: The steps taken (or, in check mode, that would be taken).
  returned: always
  type: list
  elements: str
  sample: [create, private_key, listen_port, address, mtu, up]
"""

import os

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.constellation.cluster.plugins.module_utils.constants import deprecated_alias
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import (
    HAS_CRYPTOGRAPHY,
    KEY_FILE_MODE,
    WireGuard,
    ensure_key_file,
    read_key_file,
    interface_changes,
    parse_interface_spec,
    validate_interface_name,
)


def _metadata(link, live, key_state):
    if not link.exists:
        return {"state": "absent"}
    return {
        "state": "present",
        "up": link.up,
        "addresses": list(link.addresses),
        "mtu": link.mtu,
        "listen_port": live.listen_port if live else None,
        "vpn_pub_key": live.pub_key if live else None,
        "private_key_file_mode": "%04o" % key_state.mode if key_state and key_state.exists else None,
    }


def run(module, wg):
    params = module.params
    name = validate_interface_name(params["name"])
    link = wg.link(name)
    live = wg.show(name) if link.exists else None
    key_file = params["priv_key_file"] or os.path.join("/etc/wireguard", "%s.key" % name)

    if params["state"] == "absent":
        result = {"changed": link.exists, "interface": name, "actions": ["delete"] if link.exists else []}
        if module._diff:
            result["diff"] = {"before": _metadata(link, live, None), "after": {"state": "absent"}}
        if link.exists and not module.check_mode:
            wg.delete(name)
        return result

    spec = parse_interface_spec(name, params["address"], params["listen_port"], params["mtu"], params["vpn_cidr"])
    if link.exists and live is None:
        module.fail_json(msg="name: %s exists but is not a WireGuard interface" % name)

    key_before = read_key_file(key_file)
    if not module.check_mode:
        directory = os.path.dirname(os.path.abspath(key_file))
        if not os.path.isdir(directory):
            os.makedirs(directory, mode=0o700)
    key_state, key_changed = ensure_key_file(key_file, check_mode=module.check_mode)
    actions = ["private_key_file"] if key_changed else []

    if module.check_mode:
        actions += interface_changes(spec, link, live, key_state.pub_key)
    else:
        actions += wg.ensure_interface(spec, key_file, key_state.pub_key)

    result = {"changed": bool(actions), "interface": name, "actions": actions}
    if key_state.pub_key:
        result["vpn_pub_key"] = key_state.pub_key
    if module._diff:
        after = {
            "state": "present",
            "up": True,
            "addresses": [spec.address],
            "mtu": spec.mtu,
            "listen_port": spec.listen_port,
            "vpn_pub_key": key_state.pub_key,
            "private_key_file_mode": "%04o" % KEY_FILE_MODE,
        }
        result["diff"] = {"before": _metadata(link, live, key_before), "after": after}
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", default="wg0"),
            # Renamed (docs/names.md: priv_key); the old name works until 2.0.0.
            priv_key_file=dict(type="path", no_log=False, aliases=["private_key_file"],
                               deprecated_aliases=[deprecated_alias("private_key_file")]),
            address=dict(type="str"),
            listen_port=dict(type="int", default=51820),
            mtu=dict(type="int", default=1420),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            vpn_cidr=dict(type="str", default="10.118.0.0/16"),
        ),
        required_if=[("state", "present", ["address"])],
        supports_check_mode=True,
    )
    if not HAS_CRYPTOGRAPHY:
        module.fail_json(msg=missing_required_lib("cryptography"))
    try:
        result = run(module, WireGuard())
    except (ConstellationError, OSError) as err:
        module.fail_json(msg=str(err))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
