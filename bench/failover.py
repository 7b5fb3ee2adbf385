"""Several Coordinators on one etcd cluster (#18): a Node's failover when the leader dies, and GetUpdate
from a follower, each beside the single-Coordinator figure measured in the same run.

All on loopback with real etcd (lab/etcd.py) and a real swtpm; Coordinators are Cores with their vpnapi
FrameServer, as in bench/peer_updates.py (whose functions this imports). The VPN CIDR is 127.0.0.0/16,
so loopback addresses are VPN IPs.

* ``single_nochange_ms_N``: GetUpdate with nothing changed at N peers through the vpnapi of a Coordinator
  whose store is ONE etcd endpoint (a single-member etcd: one Coordinator, as today), median ms per
  poll (new connection from a Node's VPN IP, known-peer check, GetUpdate, close): peer_updates'
  server path, unchanged.
* ``follower_nochange_ms_N``: the same poll against a follower: a Coordinator whose store lists the 3
  members of an etcd cluster that another Coordinator (the writer) filled. With more than one endpoint
  a read compares the stored peersResourceVersion with the one in memory (core/registry/cache.py), at most
  once per FOLLOW_INTERVAL (0.1 s): back-to-back polls share it. ``follower_every_read_ms_N``: the same
  with a version read on every poll (the worst case). ``leader_nochange_ms_N``: the writer itself.
* ``failover_s``: Coordinators A and B on the 3-member cluster, A's store talking to the etcd raft
  leader first (the worst case: etcd must elect before anyone can write), each with its vpnapi server.
  A Node-side poller asks them in turn as the agent's update loop does (rpc/client.ask_in_turn, sticking
  with the one that answered last) every ``--poll-interval`` seconds. Just after a poll answered (the
  same phase in every run, the worst: the change waits one whole interval), A dies: SIGKILL to its etcd
  member (t=0) and its vpnapi server stops; B adds a new peer at once (a join's two registry writes,
  retried while etcd has no leader). ``failover_s`` = from the kill to the poller holding the new peer;
  ``failover_write_s`` = to B's write committed. Baseline, same run and same Cores: ``no_failover_s``,
  the same with nothing killed (B writes, the poller gets it from A, which follows the store);
  ``failover_extra_s`` = the median of (failover - baseline) over the pairs of runs. Median of
  ``--runs`` runs, and each run.

* ``lab_failover_s`` (``--no-lab`` skips it): the same on real agents in the lab: 3 Coordinators activated
  through the chain of trust, each with its etcd member on its VPN IP, 2 Nodes polling every 0.5 s. A new
  Node is activated through h2 and timed until Node h4 has it as a WireGuard peer; once with every host up
  (``lab_no_failover_s``), once with h1 lost at t=0 (agent and etcd member SIGKILLed, its link cut: a dead
  host whose packets are dropped). Includes the activation (``lab_activate_s``, and
  ``lab_activate_after_kill_s`` while etcd elects) and the Node's connect timeout towards the dead one.

The poll interval defaults to 1 s, not the agent's ``update_interval`` (10 s), so that the figure shows
the failover rather than the wait for the next poll. A stopped server on loopback refuses at once; a
dead host that drops packets would add the agent's connect timeout (max(5, 3 x update_interval) s).
Every Coordinator on the cluster is a restart of the first one's state (the node state is in the store;
additional Coordinators activated through the chain of trust come with #18 item 1), so they share one VPN
IP (127.0.0.1) and differ by port; the poller connects from 127.0.0.1 (ask_in_turn takes no source
address), a known peer, so the known-peer check is the same as for a Node's IP.

    python bench/failover.py [--peers 1000] [--runs 3] [--poll-interval 1] [--polls 300] [--quick] [--no-lab]

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(BENCH, "..", "collections"), os.path.join(BENCH, ".."), BENCH]
os.environ.setdefault("TSS2_LOG", "all+none")

from peer_updates import _coordinator, _NullVPN, _poll_ms, measure_server  # noqa: E402
from lab.etcd import Etcd, EtcdCluster, free_ports, tmpfs_dir  # noqa: E402
from lab.swtpm import SwTPM, free_port  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils import core  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.agent.json_log import JSONLog  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import DEFAULT_UPDATE_INTERVAL  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.cache import FOLLOW_INTERVAL  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_set import PeerUpdate  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import schema  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import (  # noqa: E402
    FAILOVER_CONNECT_TIMEOUT, ask_in_turn)
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import FrameServer  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.agent.wiring import vpnapi_handlers  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.store import EtcdStore  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.agent.peer_view import CorePeerView  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import (  # noqa: E402
    generate_priv_key,
    pub_key_from_priv_key,
)

MEMBERS = 3
PREFIX = "bench-failover/"
STORE_TIMEOUT = 2.0  # per etcd request, as the cluster tests use
WRITE_LIMIT = 60.0  # seconds for B's write after a kill (etcd elects in about a second)
RECEIVE_LIMIT = 60.0  # seconds for the poller to get the new peer once it is written
READY_LIMIT = 30.0


def _until(predicate, limit: float, what: str):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise SystemExit("timed out after %.0f s waiting for %s" % (limit, what))


def _serve(coordinator, log) -> FrameServer:
    """The Coordinator's vpnapi on loopback, as the agent starts it (agent/wiring.py)."""
    vpnapi = vpnapi_handlers(coordinator, log=log)
    return FrameServer("vpnapi", (coordinator.context.vpn_ip, 0), vpnapi.handlers(), log=log,
                       accept_check=vpnapi.accept_check, apis=(schema.VPNAPI,),
                       peer_view=CorePeerView(coordinator)).start()


def _endpoint(server: FrameServer) -> str:
    return "%s:%d" % server.address


def _store(cluster: EtcdCluster, first: int) -> EtcdStore:
    """A Coordinator's store: every member, its own (``first``) asked first."""
    endpoints = cluster.endpoints[first:] + cluster.endpoints[:first]
    return EtcdStore(endpoints, prefix=PREFIX, timeout=STORE_TIMEOUT)


def _raft_leader(cluster: EtcdCluster) -> int:
    """The index of the member that leads etcd's raft (maintenance status through the gateway)."""
    for member in cluster.members:
        req = urllib.request.Request(member.url + "/v3/maintenance/status", data=b"{}",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=2) as resp:
                status = json.load(resp)
        except OSError:
            continue
        if status.get("leader") and status["leader"] == status.get("header", {}).get("member_id"):
            return cluster.members.index(member)
    return -1


class Poller(threading.Thread):
    """A Node's update loop (agent/update_loop.py ``_update_once``): GetUpdate from the Coordinator that answered last,
    the next one when it does not answer; the answers applied to a peer map as the Node core does."""

    def __init__(self, endpoints, interval: float, vpn_priv_key: str):
        super().__init__(name="bench-poller", daemon=True)
        from ansible_collections.constellation.cluster.plugins.module_utils.wireguard.peer_auth import PairKeys

        self.pair_keys = PairKeys(vpn_priv_key)  # PeerAuth on each connection, as the agent's update loop
        self.endpoints = list(endpoints)
        self.interval = interval
        self.timeout = max(5.0, min(30.0, interval * 3))  # the agent's
        self.peers: dict = {}
        self.version = -1
        self.answered_by = None
        self.received = {}  # VPN IP -> monotonic time its peer first arrived
        self.errors = []
        self.polls = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self._poll()
            except (ConstellationError, OSError) as err:
                self.errors.append(str(err)[:200])
            self._halt.wait(self.interval)

    def _poll(self) -> None:
        eps = self.endpoints
        if self.answered_by in eps:
            start = eps.index(self.answered_by)
            eps = eps[start:] + eps[:start]

        def call(client):  # PeerAuth first, as the agent's update loop
            client.peer_auth(self.pair_keys)
            return client.get_update(self.version)

        endpoint, update = ask_in_turn(eps, call, self.timeout)
        now = time.monotonic()
        parsed = PeerUpdate.from_dict(update)
        self.peers = parsed.apply_to(self.peers)
        for ip in self.peers:
            self.received.setdefault(ip, now)
        self.version = parsed.resource_version
        self.answered_by = endpoint
        self.polls += 1

    def stop(self) -> None:
        self._halt.set()
        self.join(self.timeout + 5)


def _retry(fn, limit: float):
    """``fn()`` until the store takes it (etcd has no leader for a moment after its leader died)."""
    deadline = time.monotonic() + limit
    while True:
        try:
            return fn()
        except ConstellationError:
            if time.monotonic() >= deadline:
                raise
        time.sleep(0.02)


def _nochange_ms(coordinator, log, polls: int, node_priv_keys) -> float:
    """A Node's no-change poll (PeerAuth with its WireGuard key, as the agent's)."""
    from ansible_collections.constellation.cluster.plugins.module_utils.wireguard.peer_auth import PairKeys

    registry = coordinator.context.peer_registry.current()
    node_ip = sorted(ip for ip, r in registry.peers.peers.items() if r.role == "node")[0]
    auth = (PairKeys(node_priv_keys[node_ip]), coordinator.context.vpn_pub_key)
    server = _serve(coordinator, log)
    try:
        _poll_ms(server.address, node_ip, registry.peers.version, 20, *auth)  # warm up
        return _poll_ms(server.address, node_ip, registry.peers.version, polls, *auth)
    finally:
        server.stop()


def _restart(store, tpm, state_dir: str, disk_uuid: str):
    """The Coordinator's Core started again over ``store`` (an agent on another Coordinator host)."""
    coordinator = core.Core(store, core.TPMDevice(tpm.tcti), _NullVPN(), state_dir, "127.0.0.1", disk_uuid)
    coordinator.recovery.load()
    return coordinator


def one_run(cluster: EtcdCluster, tpm, state_dir: str, disk_uuid: str, log, interval: float, kill: bool) -> dict:
    """A and B on the cluster, a poller on A; with ``kill``, A dies before B adds a peer."""
    leader = _raft_leader(cluster)
    first = leader if leader >= 0 else 0
    second = (first + 1) % len(cluster.members)
    stores, servers, poller, stopping = [], [], None, None
    try:
        stores = [_store(cluster, first), _store(cluster, second)]
        a, b = (_restart(store, tpm, state_dir, disk_uuid) for store in stores)
        servers = [_serve(a, log), _serve(b, log)]
        # It connects from 127.0.0.1, the Coordinators' (shared) VPN IP: it proves that peer's key.
        poller = Poller([_endpoint(s) for s in servers], interval, a.context.node_state["vpn_priv_key"])
        poller.start()
        version = b.context.peer_registry.current().peers.version
        _until(lambda: poller.version == version and poller.answered_by == _endpoint(servers[0]), READY_LIMIT,
               "the poller's first update from A")
        key = pub_key_from_priv_key(generate_priv_key())
        polls = poller.polls
        _until(lambda: poller.polls > polls, READY_LIMIT, "a poll")  # the same phase in every run
        start = time.monotonic()
        if kill:
            cluster.members[first].kill()
            # Its accept loop ends within 0.5 s, before the poller's next poll (one interval away).
            stopping = threading.Thread(target=servers[0].stop, daemon=True)
            stopping.start()
        new_ip = _retry(b.coordinator.reserve_node_ip, WRITE_LIMIT)
        _retry(lambda: b.coordinator.add_node_peer(new_ip, key, "10.43.0.1"), WRITE_LIMIT)
        written = time.monotonic()
        _until(lambda: new_ip in poller.received, RECEIVE_LIMIT, "the new peer %s at the poller" % new_ip)
        return {"s": poller.received[new_ip] - start, "write_s": written - start,
                "answered_by": "B" if poller.answered_by == _endpoint(servers[1]) else "A",
                "raft_leader_killed": kill and leader >= 0, "poll_errors": len(poller.errors)}
    finally:
        if stopping is not None:
            stopping.join(10)
        if poller is not None:
            poller.stop()
        for server in servers:
            server.stop()
        for store in stores:
            store.close()
        if kill:
            cluster.members[first].start()  # back, and caught up, for the next run


def cluster_figures(work: str, n: int, polls: int, runs: int, interval: float, log) -> dict:
    cluster = EtcdCluster(os.path.join(work, "cluster"), size=MEMBERS)
    for member in cluster.members:
        member.extra_args += ["--max-txn-ops", "16384"]  # the N peers are written in one transaction
    tpm = None
    state_dir = tempfile.mkdtemp(prefix="bench-failover-", dir=work)
    stores = []
    try:
        cluster.start()
        tpm = SwTPM(os.path.join(work, "tpm-cluster"), free_port()).start()
        stores.append(_store(cluster, 0))
        writer, dummy_load_ms = _coordinator(stores[0], tpm, state_dir, n)
        stores.append(_store(cluster, 1))
        follower = _restart(stores[1], tpm, state_dir, writer.context.disk_uuid)
        assert follower.context.peer_registry.shared and len(follower.context.peer_registry.current().peers) == n
        keys = writer.bench_node_priv_keys
        out = {"follower_nochange_ms": _nochange_ms(follower, log, polls, keys),
               "leader_nochange_ms": _nochange_ms(writer, log, polls, keys)}
        # The worst case: a poll that pays the version check (polls closer together than the cache's
        # follow_interval share one read; with 1,000 Nodes polling every 10 s, one poll in ten pays it).
        follower.context.peer_registry.follow_interval = 0
        out["follower_every_read_ms"] = _nochange_ms(follower, log, polls, keys)
        for store in stores:
            store.close()
        stores = []
        out["no_failover"], out["failover"] = [], []
        for dummy_run in range(runs):
            out["no_failover"].append(one_run(cluster, tpm, state_dir, writer.context.disk_uuid, log, interval, False))
            out["failover"].append(one_run(cluster, tpm, state_dir, writer.context.disk_uuid, log, interval, True))
        return out
    finally:
        for store in stores:
            store.close()
        if tpm is not None:
            tpm.stop()
        cluster.stop()


def single_figure(work: str, n: int, polls: int) -> dict:
    """peer_updates' server path on one single-member etcd (one Coordinator, one endpoint)."""
    from ansible_collections.constellation.cluster.plugins.module_utils.store import open_store

    etcd = tpm = None
    try:
        etcd = Etcd(os.path.join(work, "etcd-single"), *free_ports(2), extra_args=["--max-txn-ops", "16384"]).start()
        tpm = SwTPM(os.path.join(work, "tpm-single"), free_port()).start()
        with open_store({"type": "etcd", "endpoints": [etcd.endpoint], "prefix": PREFIX}) as store:
            return measure_server(store, tpm, n, polls)
    finally:
        if tpm is not None:
            tpm.stop()
        if etcd is not None:
            etcd.stop()


LAB_COORDINATORS = ("h1", "h2", "h3")
LAB_NODES = ("h4", "h5")


def lab_figures(runs: int) -> dict:
    """The same on real agents in the lab: 3 Coordinators (one etcd member each on its VPN IP, TLS from the
    KMS, activated through the chain of trust), 2 Nodes (update_interval 0.5 s, as the lab runs them). Per
    run, a spare host is activated through h2 and the time until Node h4 has it as a WireGuard peer is taken:
    once with every Coordinator up (baseline), once with h1 lost at t=0 (agent and etcd member SIGKILLed,
    its link cut: packets to it are dropped, so h4's poll of h1 waits for its connect timeout). h1 comes
    back and catches up before the next run."""
    from tests.support.cluster import lab_cluster

    agent = {"update_interval": 0.5, "reattest_interval": 0}
    etcd = {"heartbeat_ms": 50, "election_ms": 500}

    def start(name):
        cluster.start(name, **dict(agent, etcd_member=dict(etcd)) if name in LAB_COORDINATORS else agent)

    def wait_peer(on, key, limit=60.0):
        _until(lambda: key in cluster.wg_peers(on), limit, "%s has the new peer" % on)

    out = {"no_failover": [], "failover": [], "activate": [], "activate_after_kill": []}
    with lab_cluster("bfail", 5, variant="qemu-vtpm") as cluster:
        lab = cluster.lab
        for name in LAB_COORDINATORS + LAB_NODES:
            start(name)
        with cluster.client("h1") as client:
            client.activate_as_coordinator(cluster.secret.to_uri(), cluster.salt, cluster.admin_pem)
        rows = cluster.activate("h1", nodes=LAB_NODES, coordinators=LAB_COORDINATORS[1:])["nodes"]
        if not all(r["ok"] for r in rows):
            raise RuntimeError("lab activation failed: %s" % [r["error"] for r in rows])
        spare = len(lab.hosts)
        for dummy_run in range(runs):
            for kill in (False, True):
                spare += 1
                name = "h%d" % spare
                lab.grow(spare)
                start(name)
                if kill:
                    # h4 asks its own Coordinator (h1) first again: a fresh agent has not failed over yet.
                    cluster.stop("h4")
                    start("h4")
                    time.sleep(1.5)  # a few polls, answered by h1
                started = time.monotonic()
                if kill:
                    cluster.kill_coordinator("h1")
                    lab.admin_run(["ip", "link", "set", "h1", "down"])
                    started = time.monotonic()
                _retry(lambda n=name: _activated(cluster.activate("h2", nodes=(n,))), 60)
                activated = time.monotonic() - started
                wait_peer("h4", cluster.state(name)["vpn_pub_key"])
                out["failover" if kill else "no_failover"].append(time.monotonic() - started)
                out["activate_after_kill" if kill else "activate"].append(activated)
                if kill:
                    lab.admin_run(["ip", "link", "set", "h1", "up"])
                    start("h1")
                    wait_peer("h1", cluster.state(name)["vpn_pub_key"])
        return out


def _activated(answer: dict) -> list:
    rows = answer["nodes"]
    if not all(r["ok"] for r in rows):
        raise ConstellationError("activation failed: %s" % [r["error"] for r in rows])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--peers", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--polls", type=int, default=300, help="polls per no-change median")
    parser.add_argument("--poll-interval", type=float, default=1.0,
                        help="seconds between a Node's polls (the agent's update_interval is %g s)"
                        % DEFAULT_UPDATE_INTERVAL)
    parser.add_argument("--quick", action="store_true", help="10 peers, 1 run, 30 polls (a smoke run)")
    parser.add_argument("--no-lab", action="store_true", help="skip the figures on real agents in the lab")
    args = parser.parse_args()
    if args.quick:
        args.peers, args.runs, args.polls = 10, 1, 30
    if args.peers < 2 or args.runs < 1 or args.polls < 1 or not 0.01 <= args.poll_interval <= 60:
        parser.error("--peers >= 2, --runs >= 1, --polls >= 1, --poll-interval in 0.01..60")
    n = args.peers
    print("load average: %.2f %.2f %.2f (%d cores)" % (os.getloadavg() + (os.cpu_count() or 0,)))
    work = tempfile.mkdtemp(prefix="bench-failover-", dir=tmpfs_dir())
    devnull = open(os.devnull, "w", encoding="utf-8")  # pylint: disable=consider-using-with
    log = JSONLog(devnull)  # the agent logs every request: keep that cost in
    try:
        single = single_figure(work, n, args.polls)
        shared = cluster_figures(work, n, args.polls, args.runs, args.poll_interval, log)
        on_lab = None if args.no_lab else lab_figures(args.runs)
    finally:
        devnull.close()
        shutil.rmtree(work, ignore_errors=True)

    print("GetUpdate, nothing changed, %d peers, through the vpnapi server (new connection, known-peer check,"
          " GetUpdate, close), median of %d polls, ms:" % (n, args.polls))
    print("%-34s %10s" % ("", "ms"))
    print("%-34s %10.3f" % ("single Coordinator, 1 etcd endpoint", single["server_nochange_ms"]))
    print("%-34s %10.3f" % ("follower, %d-member etcd" % MEMBERS, shared["follower_nochange_ms"]))
    print("%-34s %10.3f" % ("writer, %d-member etcd" % MEMBERS, shared["leader_nochange_ms"]))
    print("%-34s %10.3f" % ("follower, a version read per poll", shared["follower_every_read_ms"]))
    print("(a follower reads the stored version at most every %g s: polls closer together share that read)"
          % FOLLOW_INTERVAL)
    print()
    print("a new peer reaching a Node polling every %g s (the agent's default: %g s), s:"
          % (args.poll_interval, DEFAULT_UPDATE_INTERVAL))
    print("%-5s %22s %12s %22s %12s %14s"
          % ("run", "baseline: none killed", "write", "leader killed", "write", "answered by"))
    bases, fails = shared["no_failover"], shared["failover"]
    for i, (base, fail) in enumerate(zip(bases, fails)):
        print("%-5d %22.3f %12.3f %22.3f %12.3f %14s"
              % (i + 1, base["s"], base["write_s"], fail["s"], fail["write_s"], fail["answered_by"]))

    def median(rows, key):
        return round(statistics.median(r[key] for r in rows), 3)

    print("%-5s %22.3f %12.3f %22.3f %12.3f"
          % ("med", median(bases, "s"), median(bases, "write_s"), median(fails, "s"), median(fails, "write_s")))
    print("t=0 just after a poll answered (the change then waits one whole interval, in every run).")
    print("leader killed = SIGKILL to its etcd member (the raft leader) at t=0 and its vpnapi server stopped;")
    print("                the other Coordinator adds a peer at once; write = until that write committed.")
    print("baseline      = the same two Coordinators, nothing killed: the poller gets the peer from A, which")
    print("                follows what B wrote (its first poll after the change reloads the registry from etcd).")
    print("A dead host that drops packets would add the poller's connect timeout (%g s here)."
          % max(5.0, min(30.0, args.poll_interval * 3)))
    if on_lab is not None:
        print()
        print("real agents in the lab (3 Coordinators with their etcd members, Nodes polling every 0.5 s): a new")
        print("Node activated through h2 until Node h4 has it as a WireGuard peer, s:")
        print("%-5s %22s %22s" % ("run", "baseline: all up", "h1 lost at t=0"))
        for i, (base, fail) in enumerate(zip(on_lab["no_failover"], on_lab["failover"])):
            print("%-5d %22.3f %22.3f" % (i + 1, base, fail))
        print("%-5s %22.3f %22.3f" % ("med", statistics.median(on_lab["no_failover"]),
                                      statistics.median(on_lab["failover"])))
        print("h1 lost = its agent and etcd member SIGKILLed and its link cut (a dead host: packets dropped);")
        print("          includes the new Node's activation through h2 (attestation, etcd writes: %.2f s median; %.2f s"
              % (statistics.median(on_lab["activate"]), statistics.median(on_lab["activate_after_kill"])))
        print("          right after the kill, while etcd elects) and h4's poll of h1 running into the failover")
        print("          connect timeout (%g s, rpc/client.FAILOVER_CONNECT_TIMEOUT) before it asks h2 or h3."
              % FAILOVER_CONNECT_TIMEOUT)
    result = {
        "peers": n,
        "etcd_members": MEMBERS,
        "poll_interval_s": args.poll_interval,
        "runs": args.runs,
        "failover_s": median(fails, "s"),
        "failover_write_s": median(fails, "write_s"),
        "no_failover_s": median(bases, "s"),
        "no_failover_write_s": median(bases, "write_s"),
        "failover_extra_s": round(statistics.median(f["s"] - b["s"] for f, b in zip(fails, bases)), 3),
        "failover_s_runs": [round(r["s"], 3) for r in fails],
        "no_failover_s_runs": [round(r["s"], 3) for r in bases],
        "failover_answered_by_other": all(r["answered_by"] == "B" for r in fails),
        "failover_raft_leader_killed": all(r["raft_leader_killed"] for r in fails),
        "failover_poll_errors": sum(r["poll_errors"] for r in fails),
        "follower_nochange_ms_%d" % n: round(shared["follower_nochange_ms"], 3),
        "leader_nochange_ms_%d" % n: round(shared["leader_nochange_ms"], 3),
        "follower_every_read_ms_%d" % n: round(shared["follower_every_read_ms"], 3),
        "single_nochange_ms_%d" % n: round(single["server_nochange_ms"], 3),
        "single_baseline_store_reload_ms_%d" % n: round(single["baseline_store_reload_ms"], 3),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    if on_lab is not None:
        result.update({
            "lab_failover_s": round(statistics.median(on_lab["failover"]), 3),
            "lab_no_failover_s": round(statistics.median(on_lab["no_failover"]), 3),
            "lab_failover_s_runs": [round(v, 3) for v in on_lab["failover"]],
            "lab_no_failover_s_runs": [round(v, 3) for v in on_lab["no_failover"]],
            "lab_activate_s": round(statistics.median(on_lab["activate"]), 3),
            "lab_activate_after_kill_s": round(statistics.median(on_lab["activate_after_kill"]), 3),
        })
    print(json.dumps(result))


if __name__ == "__main__":
    main()
