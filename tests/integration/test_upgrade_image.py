# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A rolling image upgrade without downtime (issue 28, part 1) on real agents (swtpm, wireguard-go, namespaces),
lab ``timg``: 4 hosts, 1 Coordinator, file store, signed policies with the lab's pinned key.

The admin sets two accepted sets (the running image's and the next one's, SetMeasurements); every agent seals its
storage key ahead to both. Then every host reboots into the next image in turn (`lab reimage`), with continuous
pings over the mesh: nobody is evicted, the pairs that do not involve the rebooting host keep answering, each
rebooted peer keeps its VPN IP, WireGuard key and disk key and is re-attested under the new set. Retiring the old
set while a peer still runs it is refused, naming the peers; a host booted into a third, unlisted image is refused
and evicted; once no peer runs the old set it is retired, and its sealed blobs go."""

from __future__ import annotations

import base64
import itertools
import json
import re
import subprocess
import time

import pytest
from lab.agent import agent_dir, start_agent, tail_log
from lab.image import LAB_IMAGE, lab_measurements
from lab import tpms
from tests.support.cluster import LabCluster, lab_cluster
from tests.support.wait import until
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

    def set_measurements(self, document: dict, check: bool = False) -> dict:
        path = self.lab.state_dir / "upgrade-measurements.json"
        path.write_text(json.dumps(document, indent=2))
        signature = self.lab.sign_measurements(path).read_text().strip()
        with self.client("h1") as c:
            c.admin_auth(self.admin_key)
            return c.set_measurements(path.read_bytes(), signature, check=check)

    def sealed_sets(self, name: str) -> list:
        return self.state(name)["secrets_at_rest"]["sets"]

    def reboot_into(self, name: str, image: str) -> None:
        """A reboot into ``image``: the agent stops, the machine boots ``image``, the agent starts."""
        self.stop(name)
        self.lab.reimage(name, image)
        self.start(name)


def _doc(version, *names):
    images = {"v1": LAB_IMAGE, "v2": NEXT_IMAGE}
    return {"version": version, "accepted": {n: lab_measurements(images[n]) for n in names}}


class Pings:
    """One `ping` per pair of hosts over the VPN (from the lower to the higher), kept running; replies are read
    from their output afterwards (-D: a timestamp per reply)."""

    def __init__(self, cluster: Upgrade, vpn_ips: dict):
        self.procs = {}
        self.files = {}
        for a, b in itertools.combinations(HOSTS, 2):
            out = cluster.lab.state_dir / ("ping-%s-%s.log" % (a, b))
            self.files[(a, b)] = out
            with open(out, "wb") as handle:
                self.procs[(a, b)] = cluster.hosts[a].popen(["ping", "-D", "-n", "-i", "0.2", vpn_ips[b]],
                                                            stdout=handle, stderr=subprocess.STDOUT)

    def stop(self) -> dict:
        for proc in self.procs.values():
            proc.terminate()
            proc.wait(timeout=5)
        replies = {}
        for pair, path in self.files.items():
            replies[pair] = [float(m) for m in re.findall(r"^\[(\d+\.\d+)\] \d+ bytes from", path.read_text(), re.M)]
        return replies


@pytest.fixture(scope="module")
def upgrade():
    with lab_cluster("timg", 4, Upgrade, variant="qemu-vtpm") as cluster:
        for name in HOSTS:
            cluster.start(name)
        with cluster.client("h1") as c:
            c.activate_as_coordinator(cluster.secret.to_uri(), cluster.salt, cluster.admin_pem,
                                      init_secret=base64.b64decode(cluster.lab.init_secret()))
        rows = cluster.activate("h1", nodes=("h2", "h3", "h4"))["nodes"]
        assert [r["ok"] for r in rows] == [True] * 3, rows
        yield cluster


def test_a_rolling_image_upgrade_keeps_the_mesh_and_retires_the_old_set(upgrade):
    before = upgrade.snapshot(*HOSTS)
    vpn_ips = {name: before[name][0] for name in HOSTS}
    # The plain policy the agents started with is the one set "default"; the admin names both images' sets.
    # ("default" has v1's measurements: renamed, not retired, so no peer is left behind by it.)
    answer = upgrade.set_measurements(_doc(1, "v1", "v2"), check=True)
    assert answer["changed"] and answer["added"] == ["v1", "v2"] and answer["removed"] == ["default"], answer
    assert upgrade.set_measurements(_doc(1, "v1", "v2"))["changed"] is True
    assert upgrade.set_measurements(_doc(1, "v1", "v2"))["changed"] is False  # idempotent
    for name in HOSTS:  # every agent fetched it (GetUpdate's version), checked it and sealed its key ahead
        until(lambda n=name: upgrade.sealed_sets(n) == ["v1", "v2"], timeout=20, what="%s sealed to v1, v2" % name,
              why=lambda n=name: tail_log(upgrade.hosts[n]))
    until(lambda: set(_peers(upgrade).values()) == {"v1"}, timeout=20, what="every peer re-attested under v1")

    pings = Pings(upgrade, vpn_ips)
    windows = {}
    try:
        for name in ("h2", "h3", "h4", "h1"):
            if name == "h3":  # retiring v1 early: refused, naming the peers that still run it
                with pytest.raises(RemoteError) as err:
                    upgrade.set_measurements(_doc(2, "v2"))
                assert "cannot retire v1" in str(err.value)
                for other in ("h1", "h3", "h4"):
                    assert "%s (v1)" % vpn_ips[other] in str(err.value), str(err.value)
                assert vpn_ips["h2"] not in str(err.value)
            start = time.time()
            upgrade.reboot_into(name, NEXT_IMAGE)
            if name == "h1":  # a rebooted Coordinator gets the KMS URI again (recover.yml)
                with upgrade.client("h1") as c:
                    c.recover(upgrade.secret.to_uri())
            until(lambda n=name: upgrade.state(n)["state"] in ("IsNode", "ActivatingNodes"), timeout=40,
                  what="%s back" % name, why=lambda n=name: tail_log(upgrade.hosts[n]))
            until(lambda n=name: _peers(upgrade).get(vpn_ips[n]) == "v2", timeout=30,
                  what="%s re-attested under v2" % name, why=lambda: tail_log(upgrade.hosts["h1"]))
            until(lambda n=name: all(before[n][1] in upgrade.wg_peers(o) for o in HOSTS if o != n), timeout=20,
                  what="%s back in every peer's mesh" % name)
            windows[name] = (start, time.time())
        time.sleep(1.0)
    finally:
        replies = pings.stop()

    assert upgrade.state("h1")["evicted"] == []  # nobody was evicted during the roll
    assert upgrade.snapshot(*HOSTS) == before  # VPN IPs, WireGuard keys and disk keys kept
    for (a, b), times in replies.items():
        assert times, "no reply at all between %s and %s" % (a, b)
        for name, (start, end) in windows.items():
            if name in (a, b):
                continue
            # Pairs that do not involve the rebooting host kept answering while it rebooted.
            assert any(start <= t <= end for t in times), "%s-%s did not answer while %s rebooted" % (a, b, name)
    for name in HOSTS:
        assert upgrade.lab.state.image_of(name) == NEXT_IMAGE

    # A host booted into a third image that no set lists is refused at re-attestation and evicted.
    tpms.reboot(upgrade.hosts["h4"], UNLISTED_IMAGE, upgrade.lab.trust, upgrade.lab.host_python())
    evicted = until(lambda: upgrade.state("h1")["evicted"], timeout=20, what="h4 evicted")
    assert evicted[0]["public_ip"] == upgrade.hosts["h4"].public_ip
    assert "no accepted set matches (v1, v2)" in json.dumps(evicted), evicted
    until(lambda: before["h4"][1] not in upgrade.wg_peers("h2"), timeout=20, what="h4 out of h2's mesh")

    # No peer runs v1 any more: it is retired, and every agent drops the key blob sealed to it.
    answer = upgrade.set_measurements(_doc(2, "v2"))
    assert answer["changed"] and answer["removed"] == ["v1"]
    for name in ("h1", "h2", "h3"):
        until(lambda n=name: upgrade.sealed_sets(n) == ["v2"], timeout=20, what="%s sealed to v2 only" % name)
        policy = json.loads((agent_dir(upgrade.hosts[name]) / "measurements.json").read_text())
        assert list(policy["accepted"]) == ["v2"] and policy["version"] == 2
    with pytest.raises(RemoteError, match="a version of at least 2"):  # the old document replayed
        upgrade.set_measurements(_doc(1, "v1", "v2"))


def _peers(upgrade: Upgrade) -> dict:
    """Which set each peer matched at its last re-attestation, as the Coordinator records it."""
    return upgrade.set_measurements(_doc(1, "v1", "v2"), check=True)["peers"]
