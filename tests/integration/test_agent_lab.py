# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Real agents in a lab (swtpm, wireguard-go, namespaces): one cluster's life, in order.

h1 Coordinator; h2-h4 activated through the pubapi; h5 added later (ActivateAdditionalNodes);
h6 joins with IssueJoinTicket; h7 is a fresh node for the concurrency attack; h8 is tampered.
The tests share the lab and run in file order (each builds on the cluster the previous left).
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from lab.agent import agent_dir, tail_log
from lab.image import lab_measurements
from lab.netns import NetNS
from tests.support.cluster import LabCluster, lab_cluster
from tests.support.wait import until
from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    Measurements, expected_pcr15)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import VTPMValidator
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.tpm import open_tpm
from ansible_collections.constellation.cluster.plugins.module_utils.core.at_rest import SealedStorage
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import RemoteError
from ansible_collections.constellation.cluster.plugins.module_utils.agent.pubapi import coordinator_policy, fresh_node_policy

pytestmark = pytest.mark.lab

HOSTS = 8
POLICY = Measurements.from_dict(lab_measurements())


class Cluster(LabCluster):
    def client(self, name, fresh=True) -> AgentClient:
        h = self.hosts[name]
        sock = self.admin.connect((h.public_ip, 9000))
        policy = fresh_node_policy(POLICY) if fresh else coordinator_policy(POLICY)
        return AgentClient.connect(h.public_endpoint, [VTPMValidator(policy)], sock=sock)

    def admin_client(self) -> AgentClient:
        c = self.client("h1", fresh=False)
        c.admin_auth(self.admin_key)
        return c

    def pcr15_bytes(self, name) -> bytes:
        h = self.hosts[name]
        res = h.run(["tpm2_pcrread", "-T", h.tcti, "sha256:15"], env=dict(os.environ, TSS2_LOG="all+none"))
        hexval = res.stdout.strip().split("0x")[-1].strip()
        return bytes.fromhex(hexval)

    def wg_pub_key(self, name):
        return self.hosts[name].run(["wg", "show", "wg0", "public-key"]).stdout.strip()

    def vpn_ip(self, name):
        out = self.hosts[name].run(["ip", "-4", "-o", "addr", "show", "dev", "wg0"], check=False).stdout
        return out.split()[3].split("/")[0] if out.strip() else None

    def ping(self, src, ip) -> bool:
        return self.hosts[src].run(["ping", "-c1", "-W2", ip], check=False).returncode == 0

    def disk_key_ok(self, name) -> bool:
        return self.disk_key(name) == self.expected_disk_key(name)


@pytest.fixture(scope="module")
def cluster():
    with lab_cluster("agt", HOSTS, Cluster, variant="qemu-vtpm") as c:  # this file validates with VTPMValidator itself
        for name in ("h1", "h2", "h3", "h4", "h5", "h7"):
            c.start(name)
        yield c


def test_coordinator_and_three_nodes_form_a_mesh(cluster):
    with cluster.client("h1") as c:
        assert c.get_state()["state"] == "AcceptingInit"
        result = c.activate_as_coordinator(cluster.secret.to_uri(), cluster.salt, cluster.admin_pem)
    assert result["coordinator_vpn_ip"] == "10.118.0.1"
    with cluster.admin_client() as c:
        result = c.activate_additional_nodes([cluster.hosts[n].public_endpoint for n in ("h2", "h3", "h4")])
    assert [row["ok"] for row in result["nodes"]] == [True, True, True], result
    names = ("h1", "h2", "h3", "h4")
    ips = {n: cluster.vpn_ip(n) for n in names}
    until(lambda: all(len(cluster.wg_peers(n)) == 3 for n in names), what="every peer has 3 peers")
    for src in names:
        for dst in names:
            if src != dst:  # a tunnel's first handshake may take a moment on a loaded machine: a few tries
                until(lambda s=src, d=dst: cluster.ping(s, ips[d]), timeout=20,
                      what="%s pings %s over the VPN" % (src, dst))
    for name in names:
        assert cluster.pcr15_bytes(name) == expected_pcr15(cluster.cluster_id), name
        assert cluster.disk_key_ok(name), name


def test_refusals(cluster):
    # A second activation of the Coordinator.
    with cluster.client("h1", fresh=False) as c:
        with pytest.raises(RemoteError, match="AcceptingInit") as info:
            c.activate_as_coordinator(cluster.secret.to_uri(), cluster.salt, cluster.admin_pem)
        assert info.value.kind == "StateError"
        # ActivateAdditionalNodes without proving the admin key.
        with pytest.raises(RemoteError) as info:
            c.activate_additional_nodes([cluster.hosts["h5"].public_endpoint])
        assert info.value.kind == "AccessDenied"
    # ActivateAsNode from a client when the node is not AcceptingInit (h2 IsNode).
    with cluster.client("h2", fresh=False) as c:
        with pytest.raises(RemoteError, match="AcceptingInit"):
            c.activate_as_node({"node_vpn_ip": "10.118.0.99"}, lambda uuid, pub_key: b"\0" * 32)
    # A client that is not attested against a fresh-node policy cannot even talk to h2 as fresh.
    with pytest.raises(Exception, match="15"):
        cluster.client("h2", fresh=True)
    # Two concurrent activations of a fresh node: exactly one wins.
    outcomes = []
    barrier = threading.Barrier(2)

    def activate():
        try:
            with cluster.client("h7") as c:
                barrier.wait(10)
                outcomes.append(c.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32),
                                                          cluster.admin_pem))
        except RemoteError as err:
            outcomes.append(err)

    threads = [threading.Thread(target=activate) for _attempt in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sum(isinstance(o, dict) for o in outcomes) == 1, outcomes
    assert sum(isinstance(o, RemoteError) and o.kind == "StateError" for o in outcomes) == 1, outcomes
    # GetUpdate from outside the VPN: the vpnapi does not listen on the public address ...
    with pytest.raises(Exception):
        AgentClient.connect_plain("x:1", sock=cluster.admin.connect((cluster.hosts["h1"].public_ip, 9027))).get_update(0)
    # ... and a packet routed to the VPN address from the public network is refused by source.
    cluster.lab.admin_run(["ip", "route", "replace", "10.118.0.0/16", "via", cluster.hosts["h1"].public_ip])
    try:
        with AgentClient.connect_plain("x:1", sock=cluster.admin.connect(("10.118.0.1", 9027))) as c:
            with pytest.raises(RemoteError, match="not a VPN peer") as info:
                c.get_update(0)
            assert info.value.kind == "AccessDenied"
    finally:
        cluster.lab.admin_run(["ip", "route", "del", "10.118.0.0/16"], check=False)


def test_coordinator_restart_with_file_store_then_add_node(cluster):
    assert cluster.stop("h1") == 0  # SIGTERM: clean shutdown
    cluster.start("h1")
    with cluster.client("h1", fresh=False) as c:
        state = c.get_state()
        assert {k: state[k] for k in ("state", "state_code", "role")} == {
            "state": "ActivatingNodes", "state_code": 2, "role": "coordinator"}
        # After AdminAuth, GetState also reports the VPN identity (the controller reads it there, not from wg/ip
        # output); before it, anyone gets state and role only (least disclosure).
        assert "vpn_pub_key" not in state or state["vpn_pub_key"] is None
        c.admin_auth(cluster.admin_key)
        state = c.get_state()
        assert state["vpn_ip"] == "10.118.0.1" and state["vpn_pub_key"] == cluster.wg_pub_key("h1")
    with cluster.admin_client() as c:
        result = c.activate_additional_nodes([cluster.hosts["h5"].public_endpoint])
    assert result["nodes"][0]["ok"], result
    h5_key = cluster.wg_pub_key("h5")
    for name in ("h2", "h3", "h4"):
        until(lambda n=name: h5_key in cluster.wg_peers(n), what="%s picks up h5" % name)
    assert cluster.ping("h2", cluster.vpn_ip("h5"))
    assert cluster.disk_key_ok("h5")


def test_coordinator_restart_with_etcd_store_then_join(cluster):
    from lab.etcd import Etcd
    from ansible_collections.constellation.cluster.plugins.module_utils.store import FileStore, open_store, transfer

    h1 = cluster.hosts["h1"]
    assert cluster.stop("h1") == 0
    etcd = Etcd(str(h1.dir / "etcd"), 2379, 2380)
    os.makedirs(etcd.data_dir, mode=0o700, exist_ok=True)
    etcd_proc = h1.popen(etcd.argv(), stdout=open(str(h1.dir / "etcd.log"), "ab"), stderr=open(str(h1.dir / "etcd.log"), "ab"))
    spec = {"type": "etcd", "endpoints": ["127.0.0.1:2379"]}
    try:
        h1ns = NetNS(h1.netns)
        try:
            def migrate():
                # The agent's file store is sealed to h1's TPM (core/at_rest.py): unsealed there, in h1's state.
                sealed = SealedStorage.open(str(agent_dir(h1) / "state"), lambda: open_tpm(h1.tcti), [])
                for _attempt in range(100):
                    try:
                        return transfer(FileStore(str(agent_dir(h1) / "state" / "store.json"), cipher=sealed), open_store(spec))
                    except Exception:  # pylint: disable=broad-except  # etcd still starting
                        time.sleep(0.1)
                return transfer(FileStore(str(agent_dir(h1) / "state" / "store.json"), cipher=sealed), open_store(spec))

            assert h1ns.run(migrate) > 0
        finally:
            h1ns.close()
        os.rename(agent_dir(h1) / "state" / "store.json", agent_dir(h1) / "state" / "store.json.migrated")
        # This lab runs qemu-vtpm, which names no EK: h6's join below needs the Coordinator's explicit
        # insecure_join_without_admission (docs/security.md, "Consent to a join").
        cluster.start("h1", store=spec, insecure_join_without_admission=True)
        with cluster.client("h1", fresh=False) as c:
            assert c.get_state()["state"] == "ActivatingNodes"
        # While h3's agent is down, h6 joins through the join service (node = attested party).
        cluster.stop("h3", sig=signal.SIGKILL)
        cluster.start("h6", coordinator_public_endpoint=h1.public_endpoint)
        until(lambda: cluster.vpn_ip("h6"), what="h6 joins")
        h6_key = cluster.wg_pub_key("h6")
        for name in ("h1", "h2", "h4", "h5"):
            until(lambda n=name: h6_key in cluster.wg_peers(n), what="%s picks up h6" % name)
        assert cluster.pcr15_bytes("h6") == expected_pcr15(cluster.cluster_id)
        assert cluster.disk_key_ok("h6")
        until(lambda: cluster.ping("h6", "10.118.0.1") and cluster.ping("h6", cluster.vpn_ip("h2")), what="h6 pings")
        # h3 catches up after its restart.
        assert h6_key not in cluster.wg_peers("h3")
        cluster.start("h3")
        until(lambda: h6_key in cluster.wg_peers("h3"), what="h3 catches up")
        until(lambda: cluster.ping("h3", cluster.vpn_ip("h6")), what="h3 pings h6")
        # A node whose boot chain differs from the policy is refused by the join service.
        cluster.lab.tamper("h8")
        cluster.start("h8", coordinator_public_endpoint=h1.public_endpoint)
        refusal = until(lambda: [line for line in tail_log(h1, 200).splitlines() if "join_refused" in line],
                        what="the Coordinator refuses h8")
        assert "PCR 9: expected" in refusal[0]
        # h8 logs the refusal once its answer arrived (the Coordinator logged it first).
        until(lambda: "PCR 9" in tail_log(cluster.hosts["h8"], 50), what="h8 logs why it was refused")
        assert cluster.pcr15_bytes("h8") == bytes(32)
        assert cluster.vpn_ip("h8") is None
    finally:
        if "h1" in cluster.procs:
            cluster.stop("h1")
        etcd_proc.terminate()
        etcd_proc.wait(10)
