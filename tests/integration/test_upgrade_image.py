# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A rolling image upgrade without downtime: playbooks/upgrade_image.yml on real agents
(swtpm, wireguard-go, namespaces), lab ``timg``: 4 hosts, 1 Coordinator, file store, signed policies with the
lab's pinned key; the cluster is activated directly (no site.yml: the budget), the lab writes the inventory.

Retiring the running image's set early is refused, naming the peers. ``--check`` predicts and changes nothing.
The playbook accepts both sets (every agent seals its storage key ahead to both), reboots every host into the next
image in turn (`lab reimage` as the environment's reboot command) with continuous pings over the mesh: nobody is
evicted, the pairs that do not involve the rebooting host keep answering, each rebooted peer keeps its VPN IP,
WireGuard key and disk key and is re-attested under the new set; then it retires the old set, whose sealed blobs
go. A second run changes nothing. A host booted into a third, unlisted image is refused and evicted."""

from __future__ import annotations

import base64
import json

import pytest
from lab.agent import agent_dir, start_agent
from lab.image import LAB_IMAGE, lab_measurements
from lab import tpms
from tests.support import ROOT, VENV_BIN
from tests.support.cluster import LabCluster, lab_cluster
from tests.support.pings import pinged, silent_pairs, windows
from tests.support.playbook import run_playbook
from tests.support.wait import until
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.admin_key import load_priv_key
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import parse_policy
from ansible_collections.constellation.cluster.plugins.module_utils.agent.pubapi import coordinator_policy
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import RemoteError

pytestmark = pytest.mark.lab

NEXT_IMAGE = "constellation-lab-image-v2"
UNLISTED_IMAGE = "constellation-lab-image-v3"
INTERVAL = 1.0
HOSTS = ("h1", "h2", "h3", "h4")


class Upgrade(LabCluster):
    """The admin's side; its client accepts both images (a peer rebooted into the next one included)."""

    policy = parse_policy({"accepted": {"v1": lab_measurements(LAB_IMAGE), "v2": lab_measurements(NEXT_IMAGE)}})

    def start(self, name: str, **config):
        config.setdefault("reattest_interval", INTERVAL)
        # A reboot takes a few rounds here; a rebooting Node is unreachable, not refused.
        config.setdefault("reattest_unreachable_limit", 60)
        self.procs[name] = start_agent(self.lab, self.hosts[name], trust=True, **config)
        return self.procs[name]

    def client(self, name: str):
        h = self.hosts[name]
        validator = choose.validator("qemu-vtpm", coordinator_policy(self.policy), insecure_trust_any_ak=True)
        return AgentClient.connect(h.public_endpoint, [validator], sock=self.admin.connect((h.public_ip, 9000)))

    def document(self, name: str, document: dict) -> str:
        """A signed policy document in the inventory's folder (``name``.json and its .sig)."""
        path = self.inv / ("%s.json" % name)
        path.write_text(json.dumps(document, indent=2) + "\n")
        self.lab.sign_measurements(path)
        return str(path)

    def set_measurements(self, document: dict, check: bool = False) -> dict:
        path = self.document("direct", document)
        with open(path + ".sig") as handle:
            signature = handle.read().strip()
        with self.client("h1") as c:
            c.admin_auth(self.admin_key)
            with open(path, "rb") as handle:
                return c.invoke("SetMeasurements", document=handle.read(), signature=signature, check=check)

    def play(self, *args: str):
        reboot = "env PYTHONPATH=%s:%s %s -m lab --name timg reimage {{ inventory_hostname }} --image %s" % (
            ROOT, ROOT / "collections", VENV_BIN / "python", NEXT_IMAGE)
        return run_playbook(ROOT / "playbooks" / "upgrade_image.yml", str(self.inv / "hosts.yml"),
                            self.inv.parent / "timg-runs",
                            ["-e", "ansible_python_interpreter=%s" % (VENV_BIN / "python"),
                             "-e", "constellation_upgrade_measurements_file=%s" % self.document("upgrade", _doc(1, "v1", "v2")),
                             "-e", "constellation_retire_measurements_file=%s" % self.document("retire", _doc(2, "v2")),
                             "-e", "constellation_upgrade_set=v2", "-e", "constellation_upgrade_wait_timeout=60",
                             "-e", "constellation_upgrade_reboot_command='%s'" % reboot] + list(args))

    def sealed_sets(self, name: str) -> list:
        return self.state(name)["secrets_at_rest"]["sets"]


def _doc(version, *names):
    images = {"v1": LAB_IMAGE, "v2": NEXT_IMAGE}
    return {"version": version, "accepted": {n: lab_measurements(images[n]) for n in names}}


@pytest.fixture(scope="module")
def upgrade(tmp_path_factory):
    with lab_cluster("timg", 4, Upgrade, variant="qemu-vtpm") as cluster:
        cluster.inv = tmp_path_factory.mktemp("timg") / "inventory"
        cluster.lab.inventory_dir = str(cluster.inv)
        cluster.lab.write_inventory()
        # The inventory's admin key (the playbook's) is the one the Coordinator pins; recover.yml's secrets.
        cluster.admin_key = load_priv_key((cluster.inv / "admin_key").read_bytes())
        cluster.admin_pem = (cluster.inv / "admin_key.pub").read_text()
        (cluster.inv / "constellation-mastersecret.json").write_text(cluster.secret.to_json())
        (cluster.inv / "constellation-measurement-salt.json").write_text(
            json.dumps({"measurementSalt": base64.b64encode(cluster.salt).decode()}))
        for name in HOSTS:
            cluster.start(name)
        with cluster.client("h1") as c:
            c.activate_as_coordinator(cluster.secret.to_uri(), cluster.salt, cluster.admin_pem,
                                      init_secret=base64.b64decode(cluster.lab.init_secret()))
        rows = cluster.activate("h1", nodes=("h2", "h3", "h4"))["nodes"]
        assert [r["ok"] for r in rows] == [True] * 3, rows
        yield cluster


def test_the_playbook_rolls_every_host_onto_the_next_image_without_downtime(upgrade):
    before = upgrade.snapshot(*HOSTS)
    vpn_ips = {name: before[name][0] for name in HOSTS}
    # Retiring the running image early: refused, naming every peer (none was re-attested under the new set).
    with pytest.raises(RemoteError) as err:
        upgrade.set_measurements(_doc(1, "v2"))
    assert "cannot retire default" in str(err.value) and all(vpn_ips[n] in str(err.value) for n in HOSTS), str(err.value)

    # --check (the roll's play left out: the CI budget; its prediction is the same query the real run makes).
    check = upgrade.play("--check", "--skip-tags", "roll")
    assert check.ok, check.stdout[-3000:]
    assert check.results("h1")["Give the Coordinator the accepted sets (SetMeasurements)"]["changed"] is True
    assert "refused now" in check.stdout
    # Nothing was set, nothing sealed ahead: the key is sealed only to the values it was made in (the policy file
    # found on disk at start never decides what it is sealed to).
    assert all(upgrade.sealed_sets(n) == ["booted"] for n in HOSTS)
    assert _images(upgrade) == [LAB_IMAGE] * 4  # nothing rebooted

    run, replies = pinged(upgrade, vpn_ips, upgrade.play)
    assert run.ok, run.stdout[-5000:]
    # When each host's reboot command ran, from the run's events.
    reboots = windows(run, "Reboot with the environment's command (on the controller)")
    assert sorted(reboots) == sorted(HOSTS), reboots

    assert upgrade.state("h1")["evicted"] == []  # nobody was evicted during the roll
    assert upgrade.snapshot(*HOSTS) == before  # VPN IPs, WireGuard keys and disk keys kept
    assert silent_pairs(replies, reboots) == []  # pairs that do not involve the rebooting host kept answering
    assert _images(upgrade) == [NEXT_IMAGE] * 4
    # The old set is retired: every agent holds the new document and dropped the key blob sealed to v1.
    for name in HOSTS:
        until(lambda n=name: upgrade.sealed_sets(n) == ["v2"], timeout=20, what="%s sealed to v2 only" % name)
        policy = json.loads((agent_dir(upgrade.hosts[name]) / "measurements.json").read_text())
        assert list(policy["accepted"]) == ["v2"] and policy["version"] == 2

    again = upgrade.play()
    assert again.ok and again.changed() == 0, again.stdout[-3000:]
    with pytest.raises(RemoteError, match="a version of at least 2"):  # the old document replayed
        upgrade.set_measurements(_doc(1, "v1", "v2"))

    # A host booted into a third image that no set lists is refused at re-attestation and evicted.
    tpms.reboot(upgrade.hosts["h4"], UNLISTED_IMAGE, upgrade.lab.trust, upgrade.lab.host_python())
    evicted = until(lambda: upgrade.state("h1")["evicted"], timeout=20, what="h4 evicted")
    assert evicted[0]["public_ip"] == upgrade.hosts["h4"].public_ip
    assert "no accepted set matches" in json.dumps(evicted) or "measurements mismatch" in json.dumps(evicted), evicted
    until(lambda: before["h4"][1] not in upgrade.wg_peers("h2"), timeout=20, what="h4 out of h2's mesh")


def _images(upgrade: Upgrade) -> list:
    """The image each host booted last (the lab's record, written by `lab reimage`)."""
    from lab.state import LabState

    state = LabState.load(upgrade.lab.state_dir)
    return [state.image_of(n) for n in HOSTS]
