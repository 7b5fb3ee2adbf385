# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""backup.yml and restore.yml end to end on one lab (real agents, swtpm, wireguard-go).

h1 is the Coordinator (file store), h2 and h3 Nodes; the cluster is built with site.yml. backup.yml writes an
encrypted backup (a second run writes none); then the Coordinator is destroyed - agent stopped, its state folder
wiped, its TPM rebooted - and a fresh agent starts there. A tampered backup (one byte of the data flipped; the
manifest's digest changed) is refused, naming the file and the reason, and nothing
reaches h1. restore.yml brings h1 back with its VPN IP and WireGuard key; the Nodes keep theirs and their disk keys,
and verify.yml (the last play of restore.yml) pings every peer over the mesh. The tests share the lab, in file order.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
from pathlib import Path

import pytest
from ansible.parsing.vault import VaultLib, VaultSecret

from lab.agent import agent_dir, agent_vpn_priv_key, read_sealed, start_agent
from lab.lab import Lab
from tests.support.playbook import LabPlaybooks
from tests.support.wait import until
from ansible_collections.constellation.cluster.plugins.module_utils.kms import ClusterKMS, MasterSecret
from ansible_collections.constellation.cluster.plugins.plugin_utils.controller import peer_report

pytestmark = pytest.mark.lab

NODES = ("h2", "h3")


class Cluster(LabPlaybooks):
    def __init__(self, lab: Lab, inv: Path):
        super().__init__(lab, inv)
        self.backups = inv / "backups"

    def status(self, name: str):
        return peer_report(self.lab.host(name).public_endpoint, self.attestation_settings(), self.cluster_id(),
                           self.admin_key())

    def master(self) -> MasterSecret:
        vault = VaultLib([("default", VaultSecret((self.inv / "vault_pass").read_text().strip().encode()))])
        return MasterSecret.from_json(vault.decrypt((self.inv / "constellation-mastersecret.json").read_bytes()))

    def cluster_id(self) -> bytes:
        import base64
        vault = VaultLib([("default", VaultSecret((self.inv / "vault_pass").read_text().strip().encode()))])
        salt = json.loads(vault.decrypt((self.inv / "constellation-measurement-salt.json").read_bytes()))
        return ClusterKMS(self.master()).cluster_id(base64.b64decode(salt["measurementSalt"]))

    def manifests(self):
        return sorted(self.backups.glob("*.manifest.json"))

    def ping(self, src: str, vpn_ip: str) -> bool:
        return self.lab.host(src).run(["ping", "-c1", "-W2", vpn_ip], check=False).returncode == 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    inv = tmp_path_factory.mktemp("backup-inventory")
    lab = Lab("tbkup", inventory_dir=inv)
    lab.up(hosts=3, tpm=True, agents=True)
    try:
        c = Cluster(lab, inv)
        built = c.play("site.yml")
        assert built.returncode == 0, (built.stdout + built.stderr)[-4000:]
        yield c
    finally:
        lab.down()


def test_backup_check_mode_writes_nothing(cluster):
    proc = cluster.play("playbooks/backup.yml", "--check")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "h1: a new backup would be written (check mode: nothing written)" in proc.stdout
    assert proc.recap()["h1"]["changed"] == 1
    assert not cluster.backups.exists() or not list(cluster.backups.iterdir())


def test_backup_writes_an_encrypted_backup_and_a_second_run_changes_nothing(cluster):
    proc = cluster.play("playbooks/backup.yml", "-v")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert proc.recap()["h1"]["changed"] == 1
    (manifest_path,) = cluster.manifests()
    assert "h1: backed up to %s" % manifest_path in proc.stdout
    manifest = json.loads(manifest_path.read_text())
    data_path = cluster.backups / manifest["data_file"]
    assert stat.S_IMODE(cluster.backups.stat().st_mode) == 0o700
    assert stat.S_IMODE(manifest_path.stat().st_mode) == stat.S_IMODE(data_path.stat().st_mode) == 0o600
    import base64
    import hashlib
    assert manifest["format"] == "constellation.cluster/backup/v1"
    assert manifest["cluster_id"] == base64.b64encode(cluster.cluster_id()).decode()
    assert manifest["coordinator"]["vpn_ip"] == cluster.status("h1").vpn_ip
    assert manifest["contents"][0]["name"] == "coordinator_state" and manifest["contents"][0]["keys"] > 5
    assert manifest["data_sha256"] == hashlib.sha256(data_path.read_bytes()).hexdigest()
    assert manifest["cipher"]["algorithm"] == "AES-256-GCM" and "HKDF" in manifest["cipher"]["key"]
    # Nothing secret in plain form: not the master secret, not the Coordinator's WireGuard key, not in the output.
    master = cluster.master()
    wg_key = agent_vpn_priv_key(cluster.lab, cluster.lab.host("h1"))
    blob = manifest_path.read_bytes() + data_path.read_bytes()
    for secret in (master.key, master.salt):
        for spelling in (secret, base64.b64encode(secret), base64.urlsafe_b64encode(secret)):
            assert spelling not in blob and spelling.decode("latin-1") not in out
    assert wg_key.encode() not in blob and wg_key not in out

    again = cluster.play("playbooks/backup.yml")
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert again.recap()["h1"]["changed"] == 0, again.stdout[-2000:]
    assert "h1: unchanged since %s: no new backup" % manifest_path in again.stdout
    assert cluster.manifests() == [manifest_path]


def _destroy_the_coordinator(cluster):
    """Every Coordinator lost: h1's agent stops, its state folder is wiped, its TPM reboots; a fresh agent starts."""
    lab, host = cluster.lab, cluster.lab.host("h1")
    for pid in lab._agent_pids(host):  # pylint: disable=protected-access
        os.kill(pid, signal.SIGTERM)
    until(lambda: not lab._agent_pids(host), timeout=20, what="h1's agent stops")  # pylint: disable=protected-access
    shutil.rmtree(agent_dir(host) / "state")
    lab.reboot_tpm("h1")
    start_agent(lab, host)


def _tampered(cluster, tmp_path, how: str) -> Path:
    (manifest_path,) = cluster.manifests()
    folder = tmp_path / how
    folder.mkdir()
    manifest = json.loads(manifest_path.read_text())
    data = bytearray((cluster.backups / manifest["data_file"]).read_bytes())
    if how == "byte":
        data[len(data) // 2] ^= 0x01
    elif how == "digest":
        manifest["data_sha256"] = "0" * 64
    (folder / manifest["data_file"]).write_bytes(bytes(data))
    path = folder / manifest_path.name
    path.write_text(json.dumps(manifest))
    return path


def test_restore_refuses_a_tampered_backup_and_check_mode_sends_nothing(cluster, tmp_path):
    before = {name: cluster.status(name) for name in ("h1",) + NODES}
    cluster.before = before
    cluster.disk_keys = {name: read_sealed(cluster.lab, cluster.lab.host(name), "state_disk.key") for name in NODES}
    _destroy_the_coordinator(cluster)
    fresh = cluster.status("h1")
    assert (fresh.state, fresh.membership, fresh.role) == ("AcceptingInit", "fresh", "unknown")
    # A changed manifest field whose digest still matches (the AEAD refuses it): tests/unit/kms/test_backup_archive.py.
    reasons = {"byte": "its SHA-256 does not match the manifest's data_sha256",
               "digest": "its SHA-256 does not match the manifest's data_sha256"}
    for how, reason in reasons.items():
        path = _tampered(cluster, tmp_path, how)
        proc = cluster.play("playbooks/restore.yml", "-e", "constellation_backup=%s" % path, "--tags", "restore")
        assert proc.returncode != 0, how
        assert re.search(r"h1: backup refused, nothing was sent: %s.*%s" % (re.escape(str(path.parent)), re.escape(reason)),
                         proc.stdout), (how, proc.stdout[-2000:])
        status = cluster.status("h1")
        assert (status.state, status.membership) == ("AcceptingInit", "fresh"), how

    proc = cluster.play("playbooks/restore.yml", "--check")  # verify.yml too: h1 is reported as pending
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "h1: would be restored (check mode: nothing sent)" in proc.stdout
    assert proc.recap()["h1"]["changed"] == 1 and proc.recap()["h2"]["changed"] == 0
    status = cluster.status("h1")
    assert (status.state, status.membership) == ("AcceptingInit", "fresh")


def test_restore_brings_back_the_coordinator_and_the_mesh(cluster):
    before = cluster.before
    proc = cluster.play("playbooks/restore.yml")  # its last play is verify.yml: attestation and pings over the mesh
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    assert "h1: restored, VPN IP %s" % before["h1"].vpn_ip in proc.stdout
    after = {name: cluster.status(name) for name in ("h1",) + NODES}
    assert (after["h1"].state, after["h1"].membership) == ("ActivatingNodes", "ours")
    for name in ("h1",) + NODES:  # same VPN IPs and WireGuard keys
        assert (after[name].vpn_ip, after[name].vpn_pub_key) == (before[name].vpn_ip, before[name].vpn_pub_key), name
    for name in NODES:
        assert after[name].state == "IsNode"
        assert read_sealed(cluster.lab, cluster.lab.host(name), "state_disk.key") == cluster.disk_keys[name]
        assert until(lambda n=name: cluster.ping(n, before["h1"].vpn_ip), timeout=20, what="%s pings h1" % name)
        assert cluster.ping("h1", before[name].vpn_ip)
    assert cluster.ping("h2", before["h3"].vpn_ip)

    again = cluster.play("playbooks/restore.yml", "--tags", "restore")
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert again.recap()["h1"]["changed"] == 0
    assert "already a Coordinator of this cluster: nothing to restore" in again.stdout
