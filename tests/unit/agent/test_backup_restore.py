# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Backup and restore (core/backup.py): the Coordinator's state exported over the admin channel (``ExportState``)
and restored onto a fresh peer (``ActivateAsCoordinator`` with ``restore_state``). Real Cores behind the real
pubapi and admin channel servers on loopback (dummy attestation), attacked as a stranger would: no admin key, a
Node, the wrong state, no init secret, another cluster's backup, a Node's state. A refused restore leaves the
fresh peer fresh (AcceptingInit, PCR 15 zeros, nothing stored)."""

from __future__ import annotations

import base64
import os

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import DummyValidator
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import expected_pcr15
from ansible_collections.constellation.cluster.plugins.module_utils.core.records import state_store
from ansible_collections.constellation.cluster.plugins.module_utils.kms.init_secret import init_secret_hash
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import RemoteError
from ansible_collections.constellation.cluster.plugins.module_utils.store import MemoryStore
from ansible_collections.constellation.cluster.tests.support.core_fakes import MemoryTPM, activate_node, pubapi_server

PUBLIC_IP = "127.0.0.1"  # the servers listen here; the init secret proof is bound to the public IP
INIT_SECRET = os.urandom(32)


def pem(key) -> str:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def connect(server):
    return AgentClient.connect("127.0.0.1:%d" % server.address[1], [DummyValidator()])


@pytest.fixture
def cluster(make_core):
    """An activated Coordinator with one Node, the admin key, the master secret and salt."""
    admin_key = ed25519.Ed25519PrivateKey.generate()
    secret, salt = kms.MasterSecret.generate(), os.urandom(32)
    coordinator, _vpn = make_core(MemoryTPM(), public_ip=PUBLIC_IP)
    coordinator.recovery.load()
    coordinator.coordinator.activate_as_coordinator(secret.to_uri(), salt, pem(admin_key), init_secret=None)
    node, _node_vpn = make_core(MemoryTPM(), public_ip="10.42.0.12")
    activate_node(coordinator, node, "10.42.0.12")
    return {"coordinator": coordinator, "node": node, "admin_key": admin_key, "secret": secret, "salt": salt}


@pytest.fixture
def fresh(make_core):
    """A fresh peer provisioned with the cluster's init secret hash (as the node_agent role does)."""
    def make():
        core, vpn = make_core(MemoryTPM(), public_ip=PUBLIC_IP)
        core.context.init_secret_hash = init_secret_hash(INIT_SECRET, PUBLIC_IP)
        core.recovery.load()
        return core, vpn
    return make


def export(server, admin_key):
    with connect(server) as client:
        client.admin_auth(admin_key)
        return client.export_state()


def assert_still_fresh(core):
    assert core.context.state.wire_name == "AcceptingInit"
    assert core.context.tpm.pcr15() == bytes(32)
    assert core.context.local_store.items("") == []


def test_export_needs_the_admin_key_and_tells_a_stranger_nothing(cluster):
    coordinator = cluster["coordinator"]
    with pubapi_server(coordinator) as server:
        with connect(server) as client:  # no AdminAuth
            with pytest.raises(RemoteError) as refused:
                client.export_state()
        assert refused.value.kind == "AccessDenied" and "AdminAuth first" in str(refused.value)
        with connect(server) as client:  # another key: AdminAuth refused, the export too
            with pytest.raises(RemoteError):
                client.admin_auth(ed25519.Ed25519PrivateKey.generate())
        with connect(server) as client:
            with pytest.raises(RemoteError) as refused:
                client.export_state()
        assert refused.value.kind == "AccessDenied"
        answer = export(server, cluster["admin_key"])
    assert answer["format"] == "constellation.cluster/coordinator-state/v1"
    assert base64.b64decode(answer["cluster_id"]) == coordinator.context.cluster_id
    assert answer["vpn_ip"] == coordinator.context.vpn_ip
    items = {k: base64.b64decode(v) for k, v in answer["items"].items()}
    assert items == dict(coordinator.context.local_store.items(""))
    assert "cluster_items" not in answer


def test_export_is_refused_on_a_node_and_on_a_fresh_peer(cluster, fresh):
    with pubapi_server(cluster["node"]) as server:
        with connect(server) as client:
            client.admin_auth(cluster["admin_key"])  # the Node pinned the admin key: the channel opens
            with pytest.raises(RemoteError) as refused:
                client.export_state()
    assert refused.value.kind == "StateError" and "ExportState" in str(refused.value)
    assert "ActivatingNodes" in str(refused.value) and "IsNode" in str(refused.value)
    core, _vpn = fresh()
    with pubapi_server(core) as server:
        with connect(server) as client:
            with pytest.raises(RemoteError) as refused:
                client.export_state()
    assert refused.value.kind == "StateError" and "only after activation" in str(refused.value)


def restore_over_the_wire(server, cluster, exported, init_secret=INIT_SECRET, kms_uri=None, admin_key=None):
    with connect(server) as client:
        return client.activate_as_coordinator(kms_uri or cluster["secret"].to_uri(), cluster["salt"],
                                              pem(admin_key or cluster["admin_key"]), init_secret=init_secret,
                                              restore_state=exported)


def test_restore_onto_a_fresh_peer_brings_back_the_vpn_ip_keys_and_registry(cluster, fresh):
    coordinator = cluster["coordinator"]
    with pubapi_server(coordinator) as server:
        exported = export(server, cluster["admin_key"])
    registry = coordinator.context.peer_registry.current()
    core, vpn = fresh()
    with pubapi_server(core) as server:
        answer = restore_over_the_wire(server, cluster, exported)
    ctx = core.context
    assert answer["state"] == "ActivatingNodes" and answer["coordinator_vpn_ip"] == coordinator.context.vpn_ip
    assert answer["coordinator_vpn_pub_key"] == coordinator.context.vpn_pub_key
    assert base64.b64decode(answer["cluster_id"]) == coordinator.context.cluster_id
    # Node lock first: PCR 15 holds the cluster ID; WireGuard with the same key and address, the Node as peer.
    assert ctx.tpm.pcr15() == expected_pcr15(coordinator.context.cluster_id)
    assert (vpn.address, vpn.priv_key) == (coordinator.context.vpn_ip, coordinator.context.node.vpn_priv_key)
    node = cluster["node"]
    assert [p.vpn_pub_key for p in vpn.peers] == [node.context.vpn_pub_key]
    restored = ctx.peer_registry.current()
    assert restored.peers.version == registry.peers.version  # same host address: the registry is unchanged
    assert {ip: p.vpn_pub_key for ip, p in restored.peers.peers.items()} == \
        {ip: p.vpn_pub_key for ip, p in registry.peers.peers.items()}
    # Its own disk UUID and key, the KMS URI kept, and the Node's disk key derives as before.
    assert ctx.node.disk_uuid == ctx.disk_uuid != coordinator.context.disk_uuid
    assert ctx.read_disk_key() == kms.ClusterKMS(cluster["secret"]).state_disk_key(ctx.disk_uuid)
    assert state_store.load_kms_data(ctx.local_store)["kms_uri"] == cluster["secret"].to_uri()
    assert core.coordinator.state_disk_key(node.context.disk_uuid) == node.context.read_disk_key()
    # The Node's next poll gets the same peers from the restored Coordinator (signed with the same key).
    update = core.coordinator.get_update(-1)
    assert update["resource_version"] == registry.peers.version and update.get("signature")
    assert update == coordinator.coordinator.get_update(-1)
    # A second restore is refused: it is activated.
    with pubapi_server(core) as server:
        with pytest.raises(RemoteError) as refused:
            restore_over_the_wire(server, cluster, exported)
    assert refused.value.kind == "StateError" and "AcceptingInit" in str(refused.value)


def test_restore_onto_another_address_updates_the_coordinators_entry(cluster, make_core):
    coordinator = cluster["coordinator"]
    exported = coordinator.backup.export_state()
    version = coordinator.context.peer_registry.current().peers.version
    core, _vpn = make_core(MemoryTPM(), public_ip="10.42.0.99")
    core.recovery.load()
    core.backup.restore(cluster["secret"].to_uri(), pem(cluster["admin_key"]), exported)
    registry = core.context.peer_registry.current()
    assert registry.peers.get(coordinator.context.vpn_ip).public_ip == "10.42.0.99"
    assert registry.peers.version == version + 1  # Nodes learn the new endpoint with their next update


def test_restore_attacks_are_refused_before_the_node_lock(cluster, fresh, make_core):
    coordinator = cluster["coordinator"]
    exported = coordinator.backup.export_state()
    core, _vpn = fresh()
    with pubapi_server(core) as server:
        # No init secret, or another: a stranger cannot make a fresh peer anybody's Coordinator.
        for secret in (None, os.urandom(32)):
            with pytest.raises(RemoteError) as refused:
                restore_over_the_wire(server, cluster, exported, init_secret=secret)
            assert refused.value.kind == "AccessDenied", refused.value
            assert_still_fresh(core)
        # Another cluster's KMS URI: the backup's cluster ID does not derive from it.
        with pytest.raises(RemoteError) as refused:
            restore_over_the_wire(server, cluster, exported, kms_uri=kms.MasterSecret.generate().to_uri())
        assert "does not derive the backup's cluster ID" in str(refused.value)
        assert_still_fresh(core)
        # Another admin key than the one the backup pinned.
        with pytest.raises(RemoteError) as refused:
            restore_over_the_wire(server, cluster, exported, admin_key=ed25519.Ed25519PrivateKey.generate())
        assert "admin_pub_key" in str(refused.value)
        assert_still_fresh(core)
        # A Node's state, a changed format, a cut registry, values that are not base64.
        node_items = {k: base64.b64encode(v).decode() for k, v in cluster["node"].context.local_store.items("")}
        broken = [dict(exported, items=node_items), dict(exported, format="v0"),
                  dict(exported, items={k: v for k, v in exported["items"].items() if not k.startswith("peer")}),
                  dict(exported, items=dict(exported["items"], nodeState="%%%")),
                  dict(exported, cluster_items={"x": "eA=="})]
        for bad in broken:
            with pytest.raises(RemoteError) as refused:
                restore_over_the_wire(server, cluster, bad)
            assert refused.value.kind == "InputError", refused.value
            assert "restore_state" in str(refused.value)
            assert coordinator.context.node.vpn_priv_key not in str(refused.value)  # never echoed
            assert_still_fresh(core)
    # An activated Node is no fresh peer: refused, and it stays the Node it was.
    node = cluster["node"]
    with pubapi_server(node) as server:
        with pytest.raises(RemoteError) as refused:
            restore_over_the_wire(server, cluster, exported)
    assert refused.value.kind == "StateError" and "AcceptingInit" in str(refused.value)
    assert node.context.state.wire_name == "IsNode" and node.context.vpn_ip != coordinator.context.vpn_ip
    # A peer that holds a cluster's state and waits for Recover is not restored over (recover.yml instead).
    store = MemoryStore()
    waiting, _vpn = make_core(MemoryTPM(), store=store)
    waiting.recovery.load()
    waiting.coordinator.activate_as_coordinator(cluster["secret"].to_uri(), cluster["salt"], pem(cluster["admin_key"]))
    rebooted, _vpn = make_core(MemoryTPM(), store=store)
    rebooted.recovery.load()
    assert rebooted.context.recovery_pending
    with pytest.raises(Exception) as refused:
        rebooted.backup.restore(cluster["secret"].to_uri(), pem(cluster["admin_key"]), exported)
    assert "waits for Recover" in str(refused.value)
