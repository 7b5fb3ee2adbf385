# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Control-plane material goes only to nodes the ADMIN designated control planes.
The designation comes with ActivateAdditionalNodes (control_plane_endpoints) and the Coordinator records
it with the node's WireGuard key; a joining node asking is_control_plane is refused."""

from __future__ import annotations

import os

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils import core, kms
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import DummyIssuer, DummyValidator
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AccessDenied, InputError
from ansible_collections.constellation.cluster.tests.support.core_fakes import (
    FakeJoinChannel,
    FakeNodeClient,
    MemoryTPM,
    coordinator,
)


@pytest.fixture
def secret():
    return kms.MasterSecret.generate()


def test_the_admin_designates_control_planes_at_activation(make_core, secret):
    coord, _vpn = coordinator(make_core, secret)
    nodes = {}
    for endpoint in ("10.42.0.50:9000", "10.42.0.51:9000"):
        nodes[endpoint], _node_vpn = make_core(MemoryTPM())
        nodes[endpoint].recovery.load()
    rows = coord.activation.activate_nodes(list(nodes), lambda e: FakeNodeClient(nodes[e]),
                                           control_plane_endpoints=["10.42.0.51:9000"])
    assert all(row["ok"] for row in rows)
    worker, plane = nodes["10.42.0.50:9000"], nodes["10.42.0.51:9000"]
    assert not coord.peer_access.is_designated_control_plane(worker.context.vpn_ip, worker.context.vpn_pub_key)
    assert coord.peer_access.is_designated_control_plane(plane.context.vpn_ip, plane.context.vpn_pub_key)
    assert not coord.peer_access.is_designated_control_plane(plane.context.vpn_ip, worker.context.vpn_pub_key)  # bound to the key
    assert coord.peer_access.is_designated_control_plane(coord.context.vpn_ip, coord.context.vpn_pub_key)  # a Coordinator is one
    with pytest.raises(InputError, match="control_plane_endpoints"):
        coord.activation.activate_nodes(["10.42.0.52:9000"], lambda e: FakeNodeClient(plane),
                                        control_plane_endpoints=["10.42.0.53:9000"])


def test_a_joining_node_cannot_make_itself_a_control_plane(make_core, secret):
    coord, _vpn = coordinator(make_core, secret)
    received = []
    channel = FakeJoinChannel(DummyIssuer(), received.append)
    channel.node_vpn_pub_key, channel.disk_uuid = os.urandom(32), core.new_disk_uuid()
    with pytest.raises(AccessDenied, match="is_control_plane: a node cannot designate itself a control plane"):
        coord.join_service.serve_join(channel.disk_uuid, channel.node_vpn_pub_key, channel, DummyValidator(),
                                      is_control_plane=True)
    assert received == [] and coord.coordinator.reserve_node_ip() == "10.118.0.11"  # nothing issued, no IP kept
