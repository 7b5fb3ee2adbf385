# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""restore.yml does not roll back an eviction by taking an older backup unasked (plugins/plugin_utils/backup.py,
the controller's side of coordinator_restore).

Real backups of a real Coordinator Core (ExportState, sealed and written by the backup code): one while a peer
was still in the cluster, one after its eviction. The attacker deletes the newer backup from the folder. The
controller asks the surviving Node (its real pubapi on loopback, attested with its real swtpm, GetState's details
after AdminAuth) for the peer set version it applied, and refuses the newest backup left, naming both
versions and how to override; a backup the admin names is taken."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.module_utils.agent.peer_view import CorePeerView
from ansible_collections.constellation.cluster.plugins.module_utils.agent.remote_exec import RemoteExec
from ansible_collections.constellation.cluster.plugins.module_utils.agent.wiring import admin_handlers, pubapi_handlers
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import DummyValidator
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import Measurement, Measurements
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.tpm import read_pcrs
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import VTPMIssuer, VTPMValidator
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_record import PeerRecord
from ansible_collections.constellation.cluster.plugins.plugin_utils import backup
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import AgentServerContext, FrameServer
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import generate_priv_key, pub_key_from_priv_key
from ansible_collections.constellation.cluster.tests.support.core_fakes import MemoryTPM, activate_node

SALT = os.urandom(32)


@dataclass
class Settings:
    """The controller's attestation settings (plugin_utils/controller.py reads these): the policy of the Node's
    swtpm as it booted (PCR 15 is read from the quote, as restore.yml does)."""

    validator: object
    timeout: float = 10.0
    attestation_timeout: float = 10.0
    netns: str = ""

    def validators(self):
        return [self.validator]


@contextlib.contextmanager
def node_pubapi(node, tpm):
    """The Node's pubapi and admin channel on loopback as the agent builds them, attesting with its swtpm."""
    admin = admin_handlers(node)
    handlers = dict(pubapi_handlers(node, DummyValidator()).handlers())
    handlers.update(admin.handlers(), **RemoteExec(node.context.state_dir).handlers())
    with VTPMIssuer(tpm.tcti, event_log_path=None) as issuer:
        tls = AgentServerContext(issuer, key_pool_size=0)
        server = FrameServer("pubapi", ("127.0.0.1", 0), handlers, tls=tls, peer_view=CorePeerView(node)).start()
        try:
            yield "127.0.0.1:%d" % server.address[1]
        finally:
            server.stop()
            tls.close()


@pytest.fixture
def cluster(make_core, tmp_path, swtpm):
    secret, admin_key = kms.MasterSecret.generate(), ed25519.Ed25519PrivateKey.generate()
    admin_pem = admin_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                    serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    coordinator, _vpn = make_core(MemoryTPM(), public_ip="10.42.0.11")
    coordinator.recovery.load()
    coordinator.coordinator.activate_as_coordinator(secret.to_uri(), SALT, admin_pem)
    pcrs = read_pcrs(swtpm.tcti)
    settings = Settings(VTPMValidator(Measurements({i: Measurement(pcrs[i]) for i in (0, 4)})))
    node, _node_vpn = make_core(swtpm, public_ip="127.0.0.1")  # a real TPM: its PCR 15 takes the cluster ID
    activate_node(coordinator, node, "127.0.0.1")
    evictee = PeerRecord.parse(coordinator.coordinator.reserve_node_ip(), pub_key_from_priv_key(generate_priv_key()),
                               "10.42.0.13", "node")
    coordinator.coordinator.add_node_peer(evictee.vpn_ip, evictee.vpn_pub_key, evictee.public_ip)
    node.node.apply_update(coordinator.coordinator.get_update(node.context.resource_version))
    folder = str(tmp_path / "backups")

    def back_up():
        manifest, data, name = backup.seal(kms.ClusterKMS(secret), coordinator.backup.export_state(), "10.42.0.11:9000")
        return backup.write(folder, manifest, data, name)

    return {"coordinator": coordinator, "node": node, "secret": secret, "admin_key": admin_key, "folder": folder,
            "back_up": back_up, "evictee": evictee, "settings": settings, "tpm": swtpm,
            "cluster_id": kms.ClusterKMS(secret).cluster_id(SALT)}


def test_the_newest_backup_left_is_refused_when_the_nodes_applied_a_newer_peer_set(cluster):
    coordinator, node, cluster_id = cluster["coordinator"], cluster["node"], cluster["cluster_id"]
    older = cluster["back_up"]()  # the evictee still a peer
    coordinator.coordinator.remove_peer(cluster["evictee"].vpn_ip)  # the eviction
    node.node.apply_update(coordinator.coordinator.get_update(node.context.resource_version))
    newer = cluster["back_up"]()
    old_version = backup.open_backup(older, kms.ClusterKMS(cluster["secret"]), cluster_id)[0]["peer_resource_version"]
    applied = node.context.resource_version
    assert old_version < applied
    # The attacker deletes the newer backup: the older one is the newest left.
    for path in (newer, os.path.join(cluster["folder"], backup.read_manifest(newer)["data_file"])):
        os.remove(path)
    path, named = backup.choose(None, cluster["folder"], cluster_id)
    assert (path, named) == (older, False)
    _manifest, exported = backup.open_backup(path, kms.ClusterKMS(cluster["secret"]), cluster_id)
    version = backup.peer_resource_version(exported)
    assert version == old_version
    # The surviving Node answers the version it applied (GetState's details, after AdminAuth, attested).
    with node_pubapi(node, cluster["tpm"]) as endpoint:
        reached = backup.reached_versions([endpoint, "127.0.0.1:1"], cluster["settings"], cluster["admin_key"], cluster_id)
    assert reached == {endpoint: applied, "127.0.0.1:1": None}  # the second does not answer
    with pytest.raises(backup.BackupRefused) as refused:
        backup.check_not_older(path, version, reached)
    message = str(refused.value)
    assert "holds the peer set at version %d, older than version %d, which %s applied" % (version, applied, endpoint) \
        in message
    assert "an evicted peer would come back" in message and "name it: -e constellation_backup=%s" % path in message
    # None of the Nodes answering: the newest backup cannot be checked, and is refused too.
    with pytest.raises(backup.BackupRefused, match="none of the Nodes .* answered"):
        backup.check_not_older(path, version, {"127.0.0.1:1": None})


def test_a_named_backup_is_taken_and_the_newest_passes_when_it_is_not_older(cluster):
    coordinator, node, cluster_id = cluster["coordinator"], cluster["node"], cluster["cluster_id"]
    older = cluster["back_up"]()
    coordinator.coordinator.remove_peer(cluster["evictee"].vpn_ip)
    node.node.apply_update(coordinator.coordinator.get_update(node.context.resource_version))
    newest = cluster["back_up"]()
    applied = node.context.resource_version
    with node_pubapi(node, cluster["tpm"]) as endpoint:
        reached = backup.reached_versions([endpoint], cluster["settings"], cluster["admin_key"], cluster_id)
    assert reached == {endpoint: applied}
    path, named = backup.choose(None, cluster["folder"], cluster_id)
    assert (path, named) == (newest, False)
    manifest, exported = backup.open_backup(path, kms.ClusterKMS(cluster["secret"]), cluster_id)
    assert backup.peer_resource_version(exported) == manifest["peer_resource_version"] == applied
    backup.check_not_older(path, applied, reached)  # not older: taken
    # The admin names the older one (its path, or its name in the folder): taken as named, no check.
    name = os.path.basename(older)[:-len(backup.MANIFEST_SUFFIX)]
    for given in (older, name, name + backup.MANIFEST_SUFFIX):
        assert backup.choose(given, cluster["folder"], cluster_id) == (older, True)
    # A Node of another cluster, or a stranger without the admin key, tells nothing: no version.
    with node_pubapi(node, cluster["tpm"]) as endpoint:
        assert backup.reached_versions([endpoint], cluster["settings"], ed25519.Ed25519PrivateKey.generate(),
                                       cluster_id) == {endpoint: None}
        assert backup.reached_versions([endpoint], cluster["settings"], cluster["admin_key"],
                                       os.urandom(32)) == {endpoint: None}
