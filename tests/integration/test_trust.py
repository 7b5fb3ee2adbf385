# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Trust that stays true after activation, on real agents (swtpm,
wireguard-go, namespaces), lab ``ttrust``. Every attack here is refused, and no secret leaves:

* init secret (4): a fresh peer refuses ActivateAsCoordinator and ActivateAsNode without the proof of
  its init secret, or with another node's, before its node lock (PCR 15 stays zero); the real
  Coordinator, given the init secret, activates the nodes;
* re-attestation (1): a Node tampered after activation is evicted within two intervals: gone from every
  other peer's ``wg show``, refused by the vpnapi (no data key), listed in the Coordinator's GetState;
  a Node unreachable for one round is not evicted; one unreachable for ``reattest_unreachable_limit``
  rounds is unverified (GetState ``unverified``), not evicted, and verified again when it comes back; one
  unreachable for ``unverified_eviction_after`` is evicted, stays out when it comes back, and is re-admitted
  by ActivateAdditionalNodes (add_nodes.yml) with its VPN IP and key; the tampered one is not;
* rejoin (3): a rebooted Node (PCR 15 reset) rejoins by itself with a ticket from its Coordinator
  (disk key, measurement secret, peers); the KMS URI never reaches it; a caller that cannot attest
  gets nothing;
* signed measurements (5): an agent whose policy file was altered refuses to start, naming the file.
"""

from __future__ import annotations

import base64
import json
import os
import time

import pytest
from lab.agent import agent_dir, agent_vpn_priv_key, start_agent, tail_log
from lab.image import lab_measurements
from lab.netns import NetNS
from tests.support.cluster import LabCluster, lab_cluster
from tests.support.wait import until
from ansible_collections.constellation.cluster.plugins.module_utils.kms import init_secret as init_mod
from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import expected_pcr15
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import access, schema
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import RemoteError

pytestmark = pytest.mark.lab

INTERVAL = 1.0  # reattest_interval of this lab's Coordinator
UNREACHABLE_LIMIT = 3
# Seconds an unreachable Node stays unverified before it is evicted, here: longer than the limit's rounds take
# (an unreachable round waits for the connect timeout, 10 s), so that the unverified state can be seen.
UNVERIFIED_EVICTION_AFTER = 60.0


class Trust(LabCluster):
    def start(self, name: str, **config):
        self.hosts = {h.name: h for h in self.lab.hosts}
        config.setdefault("reattest_interval", INTERVAL)
        config.setdefault("reattest_unreachable_limit", UNREACHABLE_LIMIT)
        config.setdefault("unverified_eviction_after", UNVERIFIED_EVICTION_AFTER)
        self.procs[name] = start_agent(self.lab, self.hosts[name], trust=True, **config)
        return self.procs[name]

    def pcr15(self, name) -> bytes:
        with self.client(name) as c:
            return c.attested_pcrs()[15]

    def activate_nodes(self, *names) -> list:
        with self.client("h1") as c:
            c.admin_auth(self.admin_key)
            return c.activate_additional_nodes([self.hosts[n].public_endpoint for n in names])["nodes"]

    def link(self, name, up: bool):
        self.lab.admin_run(["ip", "link", "set", name, "up" if up else "down"])

    def log(self, name) -> str:
        return (agent_dir(self.hosts[name]) / "agent.log").read_text(errors="replace")

    def vpnapi(self, name, method, **fields):
        """A vpnapi request from inside host ``name`` (through its WireGuard tunnel), as its agent makes it:
        PeerAuth with the agent's WireGuard key first (docs/protocol.md)."""
        coordinator_vpn_ip = self.state("h1")["vpn_ip"]
        with NetNS(self.hosts[name].netns) as ns:
            sock = ns.connect((coordinator_vpn_ip, 9027), timeout=3)
        with AgentClient.connect_plain("%s:9027" % coordinator_vpn_ip, sock=sock, timeout=5) as c:
            c.peer_auth(agent_vpn_priv_key(self.lab, self.hosts[name]))
            return c.invoke(method, **fields)


@pytest.fixture(scope="module")
def trust():
    with lab_cluster("ttrust", 5, Trust, variant="qemu-vtpm") as t:
        for name in ("h1", "h2", "h3", "h4"):
            t.start(name)
        yield t


def _refused(err) -> str:
    return "%s %s" % (getattr(err, "kind", type(err).__name__), err)


def test_activation_without_the_init_secret_is_refused_before_the_node_lock(trust):
    lab_secret = trust.lab.init_secret()
    # An attacker that reaches the fresh Coordinator-to-be: no init secret, then a guessed one.
    for attempt in (None, os.urandom(32)):
        with trust.client("h1") as c, pytest.raises(RemoteError) as err:
            c.activate_as_coordinator(trust.secret.to_uri(), trust.salt, trust.admin_pem, init_secret=attempt)
        assert err.value.kind == "AccessDenied" and err.value.reason == "init_proof", _refused(err.value)
        assert lab_secret not in str(err.value)
    assert trust.pcr15("h1") == bytes(32) and trust.state("h1")["state"] == "AcceptingInit"
    # An attacker's ActivateAsNode on a fresh node: its own cluster, no proof; then a proof made for
    # another node (h3's: relayed); the node never answers step 1, so nothing is asked of it.
    attacker = kms.ClusterKMS(kms.MasterSecret.generate())
    salt = os.urandom(32)
    request = {"node_vpn_ip": "10.118.0.50", "peers": [], "cluster_id": base64.b64encode(attacker.cluster_id(salt)).decode(),
               "measurement_salt": base64.b64encode(salt).decode(), "admin_pub_key": trust.admin_pem,
               "coordinator_vpn_ip": "10.118.0.1"}
    relayed = init_mod.node_init_secret(base64.b64decode(lab_secret), trust.hosts["h3"].public_ip)
    for params in (request, dict(request, init_proof=base64.b64encode(relayed).decode())):
        with trust.client("h2") as c, pytest.raises(RemoteError) as err:
            c.activate_as_node(params, lambda uuid, key: pytest.fail("the node answered step 1"))
        assert err.value.kind == "AccessDenied" and err.value.reason == "init_proof", _refused(err.value)
    assert trust.pcr15("h2") == bytes(32) and trust.state("h2")["state"] == "AcceptingInit"
    # The admin, with the lab's init secret: the Coordinator, then the nodes it proves itself to.
    with trust.client("h1") as c:
        c.activate_as_coordinator(trust.secret.to_uri(), trust.salt, trust.admin_pem,
                                  init_secret=base64.b64decode(lab_secret))
    rows = trust.activate_nodes("h2", "h3", "h4")
    assert [(r["ok"], r["action"]) for r in rows] == [(True, "activated")] * 3, rows
    for name in ("h2", "h3", "h4"):
        assert trust.pcr15(name) == expected_pcr15(trust.cluster_id)
        assert trust.disk_key(name) == trust.expected_disk_key(name)
    # The init secret and its proofs never appear in a log.
    proofs = [base64.b64encode(init_mod.node_init_secret(base64.b64decode(lab_secret), trust.hosts[n].public_ip)).decode()
              for n in ("h1", "h2", "h3", "h4")]
    for name in ("h1", "h2", "h3", "h4"):
        text = trust.log(name)
        assert lab_secret not in text and not any(p in text for p in proofs), name


def test_a_node_unreachable_for_one_round_stays(trust):
    keys = {n: trust.state(n)["vpn_pub_key"] for n in ("h2", "h3", "h4")}
    until(lambda: all(set(keys.values()) - {keys[n]} <= trust.wg_peers(n) for n in keys), timeout=30,
          what="the mesh is complete")
    h2_ip = trust.state("h2")["vpn_ip"]
    trust.link("h2", up=False)
    try:
        until(lambda: any(json.loads(line).get("event") == "reattest_unreachable" and json.loads(line).get("vpn_ip") == h2_ip
                          for line in trust.log("h1").splitlines() if line.startswith("{")),
              timeout=15, what="a failed round for h2")
    finally:
        trust.link("h2", up=True)
    time.sleep(3 * INTERVAL)
    assert keys["h2"] in trust.wg_peers("h1")
    assert trust.state("h1")["evicted"] == []


def _unverified(trust, vpn_ip) -> bool:
    return vpn_ip in [u["vpn_ip"] for u in trust.state("h1").get("unverified") or ()]


def test_a_node_unreachable_for_a_few_rounds_is_unverified_then_verified_again(trust):
    """Unreachable for the limit's rounds (its link down: a flood or an on-path attacker look the same):
    unverified, not evicted, still a peer; back online, the next re-attestation clears it."""
    h2 = trust.state("h2")
    trust.link("h2", up=False)
    try:
        until(lambda: _unverified(trust, h2["vpn_ip"]), timeout=UNVERIFIED_EVICTION_AFTER - 15, interval=0.5,
              what="h2 unverified", why=lambda: tail_log(trust.hosts["h1"]))
    finally:
        trust.link("h2", up=True)
    assert trust.state("h1")["evicted"] == [] and h2["vpn_pub_key"] in trust.wg_peers("h1")
    until(lambda: not _unverified(trust, h2["vpn_ip"]), timeout=15, what="h2 verified again",
          why=lambda: tail_log(trust.hosts["h1"]))
    assert '"event": "peer_unverified"' in trust.log("h1") and '"event": "peer_verified"' in trust.log("h1")
    assert trust.state("h1")["evicted"] == []


def test_a_strangers_getstate_tells_state_and_role_only(trust):
    """Least disclosure: before AdminAuth, GetState names no VPN key, no disk UUID, no evicted peers; a wrong admin key
    or a forged Coordinator key unlocks nothing; the admin gets the details."""
    from cryptography.hazmat.primitives.asymmetric import ed25519

    details = ("vpn_ip", "vpn_pub_key", "state_disk_uuid", "evicted")
    for name, state in (("h1", "ActivatingNodes"), ("h2", "IsNode")):
        full = trust.state(name)  # the admin (AdminAuth first)
        assert full["vpn_pub_key"] and full["state_disk_uuid"]
        with trust.client(name) as c:
            answer = c.get_state()
            assert answer["state"] == state and not any(answer.get(k) for k in details), answer
            with pytest.raises(RemoteError) as err:
                c.admin_auth(ed25519.Ed25519PrivateKey.generate())
            assert err.value.kind == "AccessDenied"
            with pytest.raises(RemoteError) as err:
                c.coordinator_auth(lambda challenge, spki: ed25519.Ed25519PrivateKey.generate().sign(b"x" + challenge))
            assert err.value.kind == "AccessDenied"
            answer = c.get_state()
            assert not any(answer.get(k) for k in details), answer
            for secret_value in (full["vpn_pub_key"], full["state_disk_uuid"]):
                assert secret_value not in json.dumps(answer)


def test_a_tampered_node_is_evicted_within_two_intervals(trust):
    h3 = trust.state("h3")
    trust.lab.tamper("h3")
    start = time.monotonic()
    until(lambda: all(h3["vpn_pub_key"] not in trust.wg_peers(n) for n in ("h1", "h2", "h4")),
          timeout=2 * INTERVAL + 8, interval=0.1, what="h3 gone from every peer's wg show",
          why=lambda: tail_log(trust.hosts["h1"]))
    elapsed = time.monotonic() - start
    evicted = trust.state("h1")["evicted"]
    assert [e["vpn_ip"] for e in evicted] == [h3["vpn_ip"]], evicted
    assert "attestation failed" in evicted[0]["reason"] and "PCR 9" in evicted[0]["reason"], evicted
    assert '"event": "peer_evicted"' in trust.log("h1")
    # Within two intervals of the Coordinator plus one update poll of the Nodes (0.5 s) and the
    # handshakes themselves.
    assert elapsed <= 2 * INTERVAL + 4, elapsed
    # The evicted node gets no data key, no update, no disk key: the vpnapi refuses it.
    asks = {"GetDataKey": {"data_key_id": "app", "length": 32}, "GetUpdate": {"resource_version": 0}}
    for method, fields in ((m.name, asks.get(m.name, {})) for m in schema.methods_of(schema.VPNAPI)
                           if m.access.caller in access.PEER_CALLERS):  # every one that needs PeerAuth, from the schema
        with pytest.raises((RemoteError, ConstellationError, OSError)):
            trust.vpnapi("h3", method, **fields)
    # Re-admission is refused while it fails attestation: nothing changes.
    rows = trust.activate_nodes("h3")
    assert not rows[0]["ok"] and "PCR 9" in rows[0]["error"], rows
    assert [e["vpn_ip"] for e in trust.state("h1")["evicted"]] == [h3["vpn_ip"]]


def test_an_unreachable_node_is_evicted_after_the_period_then_readmitted_by_add_nodes(trust):
    before = trust.state("h4")
    trust.link("h4", up=False)
    try:
        until(lambda: _unverified(trust, before["vpn_ip"]), timeout=UNVERIFIED_EVICTION_AFTER - 15, interval=0.5,
              what="h4 unverified", why=lambda: tail_log(trust.hosts["h1"]))
        assert before["vpn_ip"] not in [e["vpn_ip"] for e in trust.state("h1")["evicted"]]
        until(lambda: before["vpn_ip"] in [e["vpn_ip"] for e in trust.state("h1")["evicted"]],
              timeout=UNVERIFIED_EVICTION_AFTER + 30, what="h4 evicted", why=lambda: tail_log(trust.hosts["h1"]))
    finally:
        trust.link("h4", up=True)
    eviction = [e for e in trust.state("h1")["evicted"] if e["vpn_ip"] == before["vpn_ip"]][0]
    assert "unverified_eviction_after" in eviction["reason"], eviction
    assert not _unverified(trust, before["vpn_ip"])
    until(lambda: before["vpn_pub_key"] not in trust.wg_peers("h2"), timeout=10, what="h2 dropped h4")
    # Back online, it stays out until the admin re-admits it.
    time.sleep(3 * INTERVAL)
    assert before["vpn_pub_key"] not in trust.wg_peers("h1")
    with pytest.raises((RemoteError, ConstellationError, OSError)):
        trust.vpnapi("h4", "GetDataKey", data_key_id="app", length=32)
    rows = trust.activate_nodes("h4")  # what add_nodes.yml sends for an evicted node of ours
    assert [(r["ok"], r["action"], r["node_vpn_ip"]) for r in rows] == [(True, "readmitted", before["vpn_ip"])], rows
    assert before["vpn_ip"] not in [e["vpn_ip"] for e in trust.state("h1")["evicted"]]
    after = trust.state("h4")
    assert (after["vpn_ip"], after["vpn_pub_key"], after["state"]) == (before["vpn_ip"], before["vpn_pub_key"], "IsNode")
    until(lambda: before["vpn_pub_key"] in trust.wg_peers("h2") and before["vpn_pub_key"] in trust.wg_peers("h1"),
          timeout=15, what="every peer lists h4 again")
    key = base64.b64decode(until(lambda: _data_key(trust, "h4"), timeout=15, what="h4 gets data keys again"))
    assert key == kms.ClusterKMS(trust.secret).derive_key("peer/%s/app" % before["vpn_pub_key"], 32)  # its namespace


def _data_key(trust, name):
    try:
        return trust.vpnapi(name, "GetDataKey", data_key_id="app", length=32)["data_key"]
    except (RemoteError, ConstellationError, OSError):
        return None


def test_a_rebooted_node_rejoins_with_a_ticket_and_never_gets_the_kms_uri(trust):
    # A real reboot takes longer than this lab's re-attestation rounds: the Coordinator (restarted: it
    # keeps its evictions) counts the rebooting node as unreachable with a higher limit here.
    trust.stop("h1")
    trust.start("h1", reattest_unreachable_limit=60)
    assert [e["public_ip"] for e in trust.state("h1")["evicted"]] == [trust.hosts["h3"].public_ip]
    before = trust.state("h2")
    disk_key = trust.disk_key("h2")
    # A caller that cannot attest asks for h2's ticket with h2's public identity: refused, no ticket.
    with trust.client("h1") as c, pytest.raises(RemoteError) as err:
        c.issue_rejoin_ticket(before["vpn_ip"], before["vpn_pub_key"], before["state_disk_uuid"], _Forger(),
                              lambda ticket, binding=None: pytest.fail("a ticket reached a forger"))
    assert err.value.kind == "AttestationError", _refused(err.value)
    trust.stop("h2")
    trust.lab.reboot_tpm("h2")
    trust.start("h2")
    until(lambda: trust.state("h2")["state"] == "IsNode", timeout=30, what="h2 rejoined",
          why=lambda: tail_log(trust.hosts["h2"]))
    after = trust.state("h2")
    assert (after["vpn_ip"], after["vpn_pub_key"]) == (before["vpn_ip"], before["vpn_pub_key"])
    assert trust.pcr15("h2") == expected_pcr15(trust.cluster_id)
    assert trust.disk_key("h2") == disk_key
    assert '"event": "node_rejoined"' in trust.log("h1") and '"event": "node_rejoined"' in trust.log("h2")
    # Least secret: nothing the node holds or logged contains the KMS URI or the master key.
    needles = [trust.secret.to_uri(), base64.b64encode(trust.secret.key).decode(),
               base64.urlsafe_b64encode(trust.secret.key).decode()]
    for path in agent_dir(trust.hosts["h2"]).rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert not any(n.encode() in data for n in needles), path
    # The KMS URI is refused by a Node even when offered (only the Coordinator takes it).
    with trust.client("h2") as c, pytest.raises(RemoteError):
        c.recover("kms://cluster-kms?key=AAAA&salt=AAAA")
    until(lambda: before["vpn_pub_key"] in trust.wg_peers("h1"), timeout=10, what="h2 in the Coordinator's mesh")


class _Forger:
    """An issuer without a TPM: it signs nothing the Coordinator's validator accepts."""

    oid = "1.3.9900.5.1"

    def issue(self, user_data, nonce):  # pylint: disable=unused-argument
        return json.dumps({"Attestation": {}, "UserData": base64.b64encode(user_data).decode()}).encode()


def test_an_altered_signed_policy_is_refused_naming_the_file(trust):
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import settings_from_args

    h5 = trust.lab.host("h5")
    policy = agent_dir(h5) / "measurements.json"
    trust.start("h5")  # signed with the lab key: starts
    trust.stop("h5")
    policy.write_text(policy.read_text().replace(lab_measurements()["9"]["expected"], "00" * 32))
    with pytest.raises(RuntimeError) as err:
        start_agent(trust.lab, h5, trust=False, measurements_pub_key=str(trust.lab.measurements_pub_path))
    assert str(policy) in str(err.value) and "does not verify" in str(err.value), str(err.value)
    # The controller's loader (site.yml's actions, verify.yml) refuses it too, and an unsigned file.
    args = {"measurements_file": str(policy), "measurements_pub_key_file": str(trust.lab.measurements_pub_path),
            "variant": "qemu-vtpm", "insecure_trust_any_ak": True, "timeout": 5.0, "attestation_timeout": 5.0}
    with pytest.raises(InputError, match="does not verify"):
        settings_from_args(args)
    os.unlink(str(policy) + ".sig")
    with pytest.raises(InputError, match="no signature file"):
        settings_from_args(args)
