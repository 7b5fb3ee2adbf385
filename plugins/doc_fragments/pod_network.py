# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """Options and requirements shared by the pod_network* modules."""

    DOCUMENTATION = r"""
options:
  conf_dir:
    description: Where the container runtime reads CNI configuration lists (the node's conflist is there).
    type: path
    default: /etc/cni/net.d
  cni_path:
    description: The folder(s) holding the CNI plugins (C(:)-separated, as C(CNI_PATH)).
    type: str
    default: /usr/lib/cni
requirements:
  - The Debian packages C(containernetworking-plugins) (C(bridge), C(host-local), C(portmap), C(loopback)) and
    C(nftables) on the node, and root there.
"""
