# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter verify_problems: a thin adapter over module_utils/verify_problems.py.
Its documentation is in verify_problems.yml next to this file."""

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


def verify_problems(peer_name, peer=None, attested=False, pending=False, coordinator=False, cluster_id="",
                    cluster_id_missing="", eviction=None, unverified=None, mesh_self=None, mesh_result=None, mesh_others=(),
                    interface="wg0", handshake_max_age=_verify.DEFAULT_HANDSHAKE_MAX_AGE):
    """inventory_hostname | verify_problems(peer=..., ...) -> ["<peer>: <what is wrong>", ...]."""
    if isinstance(mesh_others, (str, bytes)) or not isinstance(mesh_others, Sequence):
        raise AnsibleFilterError("verify_problems: mesh_others: expected a list of {name, key, ip}")
    others = [_mapping(other, "mesh_others[%d]" % index, empty_ok=False) for index, other in enumerate(mesh_others)]
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
        iface=str(interface), handshake_max_age=max_age)


class FilterModule:
    def filters(self):
        return {"verify_problems": verify_problems}
