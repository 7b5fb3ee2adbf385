# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters verify_problems, verify_podnet and pod_gateway: thin adapters over module_utils/verify_problems.py.
Their documentation is in verify_problems.yml, verify_podnet.yml and pod_gateway.yml next to this file."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ansible.errors import AnsibleFilterError

from ansible_collections.constellation.cluster.plugins.module_utils import verify_problems as _verify


def _mapping(value, name, empty_ok=True):
    if value is None and empty_ok:
        return {}
    if not isinstance(value, Mapping):
        raise AnsibleFilterError("verify_problems: %s: expected a mapping, got %s" % (name, type(value).__name__))
    return value


def _others(mesh_others, name="verify_problems"):
    if isinstance(mesh_others, (str, bytes)) or not isinstance(mesh_others, Sequence):
        raise AnsibleFilterError("%s: mesh_others: expected a list of {name, key, ip}" % name)
    return [_mapping(other, "mesh_others[%d]" % index, empty_ok=False) for index, other in enumerate(mesh_others)]


def verify_problems(peer_name, peer=None, attested=False, pending=False, coordinator=False, cluster_id="",
                    cluster_id_missing="", eviction=None, unverified=None, mesh_self=None, mesh_result=None, mesh_others=(),
                    interface="wg0", handshake_max_age=_verify.DEFAULT_HANDSHAKE_MAX_AGE, pod_probe=None):
    """inventory_hostname | verify_problems(peer=..., ...) -> ["<peer>: <what is wrong>", ...]."""
    others = _others(mesh_others)
    try:
        max_age = int(handshake_max_age)
    except (TypeError, ValueError):
        raise AnsibleFilterError("verify_problems: handshake_max_age: expected a number of seconds, got %r"
                                 % (handshake_max_age,)) from None
    return _verify.verify_problems(
        str(peer_name), peer=_mapping(peer, "peer"), attested=bool(attested), pending=bool(pending),
        coordinator=bool(coordinator), cluster_id_known=bool(cluster_id), cluster_id_missing=str(cluster_id_missing or ""),
        eviction=_mapping(eviction, "eviction"), unverified=_mapping(unverified, "unverified"), mesh_self=_mapping(mesh_self, "mesh_self"),
        mesh_result=None if mesh_result is None else _mapping(mesh_result, "mesh_result"), mesh_others=others,
        iface=str(interface), handshake_max_age=max_age,
        pod_probe=None if pod_probe is None else _mapping(pod_probe, "pod_probe"))


def verify_podnet(mesh_others, mesh_result=None, pod_probe=None):
    """mesh_others | verify_podnet(mesh_result=..., pod_probe=...) -> {other peer: ok | not routed | no answer | ...}."""
    return _verify.podnet_view(None if mesh_result is None else _mapping(mesh_result, "mesh_result"),
                               _others(mesh_others, "verify_podnet"),
                               None if pod_probe is None else _mapping(pod_probe, "pod_probe"))


def pod_gateway(pod_cidr):
    """'10.244.1.0/24' | pod_gateway -> '10.244.1.1'."""
    gateway = _verify.pod_gateway(pod_cidr)
    if not gateway:
        raise AnsibleFilterError("pod_gateway: expected a pod CIDR (a network with room for a gateway, such as "
                                 "10.244.1.0/24), got %r" % (pod_cidr,))
    return gateway


class FilterModule:
    def filters(self):
        return {"verify_problems": verify_problems, "verify_podnet": verify_podnet, "pod_gateway": pod_gateway}
