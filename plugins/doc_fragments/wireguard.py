# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """Options and notes shared by the wireguard_* modules."""

    DOCUMENTATION = r"""
options:
  vpn_cidr:
    description:
      - The cluster's VPN network. VPN addresses outside it are refused before anything is changed.
    type: str
    default: 10.118.0.0/16
requirements:
  - The C(wg) program (wireguard-tools) and either a kernel with WireGuard or C(wireguard-go).
  - The Python library C(cryptography) on the managed host (X25519 keys).
notes:
  - Private keys are generated on the managed host, stored in a file with mode C(0600) and handed to C(wg) as a
    file path. They never appear in arguments, results, diffs or logs.
  - Without a kernel module the interface is run by C(wireguard-go), started with
    C(WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD=1).
"""
