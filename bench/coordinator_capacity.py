# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How many Nodes one Coordinator serves at the agent's defaults, on loopback.

Per size N (default 100, 1,000 and 5,000 peers: the Coordinator and N - 1 Nodes):

* the Coordinator: a real Core (its own swtpm, activated as Coordinator, VPN CIDR 127.0.0.0/16 so that
  loopback addresses are VPN IPs) in its OWN process, with the vpnapi FrameServer and the VPNAPI handlers
  and the re-attestation loop as agent/wiring.py composes them (JSON log lines written, as the agent does).
  Its registry gets the N - 1 Nodes through the registry API activation uses (``PeerRegistry.add``: a
  VPN IP allocated and the record put) in one store transaction (one per Node through ActivateAdditionalNodes
  would take minutes at 5,000 on the file store and is not what is measured here);
* the Nodes' polls: ``pollers`` other processes, each Node with its own WireGuard key and its own VPN IP
  (the client socket bound to it), polling as agent/update_loop.py does every ``update_interval`` (10 s): a new
  TCP connection, PeerAuth (its pair key cached, as the agent's NodePeerAuth), GetUpdate with its version,
  close; a version change is fetched (GetUpdate's delta is applied to the Node's version; a new
  measurements version: GetMeasurements). The first polls are spread at random over one interval;
* the Nodes' answers to re-attestation (``reattest_interval`` 60 s, 4 workers): ONE aTLS FrameServer in
  this (the orchestrating) process for every Node's public endpoint (127.2.x.y, one port: the listener is
  bound to 0.0.0.0 and ``getsockname`` tells which Node was called), quoting with ONE real swtpm whose
  qemu-vtpm AK all Nodes share (PCR 15 extended with the cluster ID, as after the node lock); AdminAuth
  role coordinator checked with the Coordinators' key, GetState with that Node's VPN IP and key. The
  Coordinator validates with its real validator (qemu-vtpm, a policy without PCR 15, the Core checks it).
  qemu-vtpm trusts any AK (no enrollment); qemu-vtpm-ek binds an enrolled AK to its EK, which a shared
  AK would not model any better.

Phases (the same Coordinator, one after the other): ``idle`` (N peers registered, nothing asks: the
baseline), ``polls`` (the Nodes poll; no re-attestation), ``full`` (polls and re-attestation at the
defaults, the spread schedule of core/eviction/reattest_loop.py). The Coordinator's CPU seconds per second are read
from /proc/<pid>/stat over each window after a warm-up. The poll latency is the Node's (connect to
answer). Where the Coordinator's time goes: the costs of a poll's parts in its process, measured there.

    python bench/coordinator_capacity.py [--nodes 100,1000,5000] [--window 20]

Last line: one JSON object (``cpu_share_N``, ``poll_p99_ms_N`` for the full load; ``cpu_share_idle_N``,
``cpu_share_polls_N`` the baselines; ``poll_rate_N``/``poll_rate_intended_N``).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import queue
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "collections"), os.path.join(HERE, ".."), HERE]
os.environ.setdefault("TSS2_LOG", "all+none")

# pylint: disable=wrong-import-position
from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import (  # noqa: E402
    DEFAULT_REATTEST_INTERVAL,
    DEFAULT_REATTEST_UNREACHABLE_LIMIT,
    DEFAULT_REATTEST_WORKERS,
    DEFAULT_UPDATE_INTERVAL,
)
from ansible_collections.constellation.cluster.plugins.module_utils.agent.long_poll import JITTER  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.agent.peer_view import CorePeerView  # noqa: E402
from peer_updates import BENCH_VPN_CIDR, _NullVPN  # noqa: E402

IMAGE_DIGEST = bytes.fromhex("5198fd549fc9f44a49168b788f58e366af624866647dbe7e917388a0b1673c1d")
POLLS_PER_PROCESS = 2500  # Nodes one poller process drives (5,000 Nodes: 500 polls a second in all)
POLL_THREADS = 24


def public_ip(i: int) -> str:
    return "127.2.%d.%d" % (i // 250, 1 + i % 250)


def percentile(samples, pct):
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(round(pct / 100.0 * (len(ordered) - 1))))]


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process (all its threads), seconds."""
    with open("/proc/%d/stat" % pid, encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def policy_without_pcr15():
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
        Measurements, extend_digest)

    return Measurements.from_dict({"4": extend_digest(bytes(32), IMAGE_DIGEST).hex(), "8": "00" * 32,
                                   "9": "00" * 32, "11": "00" * 32, "12": "00" * 32, "13": "00" * 32})


# --------------------------------------------------------------------------- the Coordinator's process


def coordinator_main(spec_file: str) -> None:
    """The Coordinator: activated, N - 1 Nodes registered, the vpnapi served; then commands on stdin:
    ``reattest`` starts the re-attestation loop, ``costs`` measures a poll's parts, EOF stops."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from ansible_collections.constellation.cluster.plugins.module_utils import core, kms
    from ansible_collections.constellation.cluster.plugins.module_utils.agent.json_log import JSONLog
    from ansible_collections.constellation.cluster.plugins.module_utils.agent.wiring import vpnapi_handlers
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose
    from ansible_collections.constellation.cluster.plugins.module_utils.rpc import schema
    from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient, connect_enrolling
    from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import MAX_PEER_CONNECTIONS, FrameServer
    from ansible_collections.constellation.cluster.plugins.module_utils.store import open_store

    with open(spec_file, encoding="utf-8") as handle:
        spec = json.load(handle)
    log_file = open(spec["log"], "w", encoding="utf-8")  # pylint: disable=consider-using-with
    log = JSONLog(log_file)
    store = open_store({"type": "file", "path": os.path.join(spec["dir"], "store.json")})
    pem = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    coordinator = core.Core(store, core.TPMDevice(spec["tcti"]), _NullVPN(), spec["dir"], "127.0.0.1",
                            core.new_disk_uuid(), log=log)
    coordinator.recovery.load()
    coordinator.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), pem,
                                                    cluster_config={"vpn_cidr": BENCH_VPN_CIDR})
    vpn_ips = {}

    def add_nodes(registry):
        for i, pub_key in enumerate(spec["pub_keys"]):
            vpn_ips[pub_key] = registry.add(pub_key, public_ip(i), "node").vpn_ip

    coordinator.context.peer_registry.update(add_nodes)  # one transaction
    registry = coordinator.context.peer_registry.current()
    vpnapi = vpnapi_handlers(coordinator, log=log)
    server = FrameServer("vpnapi", (coordinator.context.vpn_ip, 0), vpnapi.handlers(), log=log,  # as agent/wiring.py
                         accept_check=vpnapi.accept_check, apis=(schema.VPNAPI,),
                         max_peer_connections=MAX_PEER_CONNECTIONS, peer_view=CorePeerView(coordinator)).start()
    node = coordinator.context.stored_node()
    print(json.dumps({"pid": os.getpid(), "vpnapi": list(server.address), "vpn_ips": vpn_ips,
                      "resource_version": registry.peers.version, "cluster_id": node.cluster_id.hex(),
                      "server_vpn_pub_key": coordinator.context.vpn_pub_key,
                      "coordinator_pub_key": coordinator.signing.coordinator_pub_key()}), flush=True)

    stop = threading.Event()
    validator = choose.validator("qemu-vtpm", policy_without_pcr15(), insecure_trust_any_ak=True)
    timeout = max(2.0, min(10.0, float(spec["reattest_interval"])))

    def connect_peer(ip: str):  # as agent/wiring.py: a new aTLS connection, a fresh nonce, a fresh quote
        endpoint = "%s:%d" % (ip, spec["reattest_port"])
        return connect_enrolling(lambda v: AgentClient.connect(endpoint, v, timeout=timeout), [validator])

    outcomes = {}
    reattest_peers = coordinator.peer_trust.reattest_peers

    def counted(*args, **kwargs):  # what the loop's batches did, for the report
        rows = reattest_peers(*args, **kwargs)
        for row in rows:
            outcomes[row["outcome"]] = outcomes.get(row["outcome"], 0) + 1
        return rows

    coordinator.peer_trust.reattest_peers = counted
    changes = []
    for line in sys.stdin:
        command = line.strip()
        if command == "reattest":
            loop = core.ReattestLoop(coordinator.peer_trust, connect_peer, float(spec["reattest_interval"]),
                                     DEFAULT_REATTEST_WORKERS, DEFAULT_REATTEST_UNREACHABLE_LIMIT, stop, log=log)
            threading.Thread(target=loop.run_cycles, daemon=True).start()  # the first cycle now, not after one interval
            print(json.dumps({"reattest": "started"}), flush=True)
        elif command == "change":  # a new peer (the next of extra_pub_keys): every Node's update changes
            pub_key = spec["extra_pub_keys"][len(changes)]
            index = len(spec["pub_keys"]) + len(changes)
            changes.append(coordinator.context.peer_registry.update(
                lambda registry: registry.add(pub_key, public_ip(index), "node").vpn_ip))
            print(json.dumps({"changed_at": time.monotonic(), "vpn_ip": changes[-1], "pub_key": pub_key,
                              "public_ip": public_ip(index),
                              "version": coordinator.context.peer_registry.current().peers.version}), flush=True)
        elif command == "costs":
            print(json.dumps(poll_costs(coordinator, vpnapi, spec)), flush=True)
        elif command == "stats":
            rows = [json.loads(x) for x in open(spec["log"], encoding="utf-8")]  # pylint: disable=consider-using-with
            counts, examples = {}, {}
            for row in rows:
                counts[row["event"]] = counts.get(row["event"], 0) + 1
                if row.get("level") in ("warning", "error"):
                    examples.setdefault(row["event"], str(row.get("error") or row.get("reason") or "")[:160])
            print(json.dumps({"events": counts, "examples": examples, "reattested": outcomes,
                              "version": coordinator.context.peer_registry.current().peers.version}), flush=True)
    stop.set()
    server.stop()
    log_file.close()


def poll_costs(coordinator, vpnapi, spec) -> dict:
    """Where a poll's server time goes, in this process (us, median): the known-peer check, the eviction
    check, PeerAuth's proof check with the pair key cached and without (an X25519 exchange), GetUpdate's
    answer with no change, and the measurements version (cached; the once-a-second store ``peek``)."""
    from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import peer_auth

    def median_us(fn, repeat=2000):
        times = []
        for _i in range(repeat):
            start = time.perf_counter_ns()
            fn()
            times.append(time.perf_counter_ns() - start)
        return round(statistics.median(times) / 1000.0, 2)

    registry = coordinator.context.peer_registry.current()
    record = next(r for r in registry.peers.peers.values() if r.role == "node")
    priv_key = spec["priv_key_0"]
    challenge = os.urandom(peer_auth.CHALLENGE_SIZE)
    server_ip = coordinator.context.vpn_ip
    node_keys = peer_auth.PairKeys(priv_key)
    proof = node_keys.proof(coordinator.context.vpn_pub_key, challenge, record.vpn_ip, server_ip)
    peer_access = coordinator.peer_access
    version = registry.peers.version
    accepted_measurements = coordinator.accepted_measurements

    def uncached():
        peer_access._peer_auth_cache = None  # pylint: disable=protected-access
        peer_access.check_peer_proof(record.vpn_ip, server_ip, challenge, proof)

    def peek():
        accepted_measurements._version = (0.0, 0)  # pylint: disable=protected-access
        accepted_measurements.version()

    assert peer_access.check_peer_proof(record.vpn_ip, server_ip, challenge, proof) == record.vpn_pub_key
    return {
        "known_peer_check_us": median_us(lambda: vpnapi.accept_check((record.vpn_ip, 1))),
        "peer_auth_cached_us": median_us(lambda: peer_access.check_peer_proof(record.vpn_ip, server_ip, challenge, proof)),
        "peer_auth_x25519_us": median_us(uncached, 500),
        "get_update_nochange_us": median_us(lambda: coordinator.coordinator.get_update(version)),
        "measurements_version_cached_us": median_us(accepted_measurements.version),
        "measurements_version_peek_us": median_us(peek, 500),
    }


# --------------------------------------------------------------------------- the Nodes' polls


def poller_main(spec_file: str) -> None:
    """The Nodes of the slice ask for updates as the agent does: mode ``poll`` (an older agent, or a Coordinator that does not hold: every
    ``update_interval`` a new connection, PeerAuth, GetUpdate, close; a pool of threads) or ``long`` (the agent
    now, agent/long_poll.py: one kept PeerAuth'd connection per Node, GetUpdate with ``wait`` =
    ``update_interval``, asked again at once; a thread per Node). The first requests are spread at random over
    one interval. On stdin EOF: the samples (sent, answered: monotonic seconds, resource version, ok) go to the
    spec's ``out`` file."""
    with open(spec_file, encoding="utf-8") as handle:
        spec = json.load(handle)
    nodes = [{"vpn_ip": vpn_ip, "priv_key": priv_key, "version": spec["resource_version"], "measurements_version": 0}
             for vpn_ip, priv_key in spec["nodes"]]
    samples, errors = [], {}
    stop = threading.Event()
    run = _long_polls if spec["mode"] == "long" else _polls
    closers = run(spec, nodes, samples, errors, stop)
    print(json.dumps({"polling": len(nodes)}), flush=True)
    sys.stdin.read()  # until EOF
    stop.set()
    for close in closers:
        close()
    with open(spec["out"], "w", encoding="utf-8") as handle:
        json.dump({"samples": list(samples), "errors": errors}, handle)


def _client(spec, node, timeout):
    from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient
    from ansible_collections.constellation.cluster.plugins.module_utils.wireguard.peer_auth import PairKeys

    if "keys" not in node:
        node["keys"] = PairKeys(node["priv_key"])  # cached across polls, as the agent's NodePeerAuth
    endpoint = tuple(spec["vpnapi"])
    sock = socket.create_connection(endpoint, timeout=timeout, source_address=(node["vpn_ip"], 0))
    client = AgentClient.connect_plain("%s:%d" % endpoint, sock=sock, timeout=timeout)
    client.peer_auth(node["keys"], spec["server_vpn_pub_key"])
    return client


def _answered(client, node, answer) -> None:
    node["version"] = answer["resource_version"]
    seen = answer.get("measurements_version") or 0
    if seen > node["measurements_version"]:  # a new document: fetched, as the agent does
        client.invoke("GetMeasurements")
        node["measurements_version"] = seen


def _error(errors, err) -> None:
    key = type(err).__name__ + ": " + str(err)[:80]
    errors[key] = errors.get(key, 0) + 1


def _polls(spec, nodes, samples, errors, stop):
    interval = float(spec["update_interval"])
    due = queue.Queue()
    wake = threading.Condition()
    rng = random.Random(spec["seed"])
    now = time.monotonic()
    heap = [(now + rng.uniform(0, interval), index) for index in range(len(nodes))]
    heapq.heapify(heap)

    def worker() -> None:
        while not stop.is_set():
            try:
                index = due.get(timeout=0.5)
            except queue.Empty:
                continue
            node = nodes[index]
            start = time.monotonic()
            ok = True
            try:
                with _client(spec, node, 30) as client:
                    _answered(client, node, client.get_update(node["version"]))
            except Exception as err:  # pylint: disable=broad-except
                ok = False
                _error(errors, err)
            end = time.monotonic()
            samples.append((start, end, node["version"], ok, node["vpn_ip"]))
            with wake:  # the agent waits update_interval after a poll
                heapq.heappush(heap, (end + interval, index))
                wake.notify()

    def dispatcher() -> None:
        while not stop.is_set():
            with wake:
                if not heap:
                    wake.wait(0.5)
                    continue
                when, index = heap[0]
                delay = when - time.monotonic()
                if delay > 0:
                    wake.wait(min(delay, 0.5))
                    continue
                heapq.heappop(heap)
            due.put(index)

    threads = [threading.Thread(target=worker, daemon=True) for _i in range(POLL_THREADS)]
    threads.append(threading.Thread(target=dispatcher, daemon=True))
    for thread in threads:
        thread.start()
    return [lambda: [thread.join(timeout=5) for thread in threads]]


def _long_polls(spec, nodes, samples, errors, stop):
    interval = float(spec["update_interval"])
    rng = random.Random(spec["seed"])
    held = {}

    def node_loop(index: int, first: float) -> None:
        node = nodes[index]
        if stop.wait(first):
            return
        while not stop.is_set():
            try:
                client = held[index] = _client(spec, node, interval + 5.0)
                with client:
                    while not stop.is_set():
                        start = time.monotonic()
                        wait = interval * (1.0 - JITTER * rng.random())  # as agent/long_poll.py draws it
                        answer = client.get_update(node["version"], wait=wait)
                        _answered(client, node, answer)
                        samples.append((start, time.monotonic(), node["version"], True, node["vpn_ip"], wait))
            except Exception as err:  # pylint: disable=broad-except
                if stop.is_set():
                    return
                _error(errors, err)
                samples.append((time.monotonic(), time.monotonic(), node["version"], False, node["vpn_ip"]))
                stop.wait(interval)  # the agent polls once (its fallback), then holds again

    threads = [threading.Thread(target=node_loop, args=(i, rng.uniform(0, interval)), daemon=True)
               for i in range(len(nodes))]
    for thread in threads:
        thread.start()

    def close() -> None:
        for client in list(held.values()):
            try:
                client.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + 10
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    return [close]


# --------------------------------------------------------------------------- the Nodes' public endpoints


def node_server(issuer, nodes_by_public_ip, coordinator_key: dict):
    """One aTLS FrameServer for every Node's pubapi: AdminAuth role coordinator and GetState, answered for
    the Node whose public IP the Coordinator called; ``coordinator_key["key"]``: the Coordinators' key."""
    from ansible_collections.constellation.cluster.plugins.module_utils.core import signing
    from ansible_collections.constellation.cluster.plugins.module_utils.errors import AccessDenied
    from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import b64d, b64e
    from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import AgentServerContext, FrameServer

    def admin_auth(conn, params):
        if params.role != "coordinator":  # the server decoded the request (schema.AdminAuthRequest)
            raise AccessDenied("AdminAuth: only role coordinator here")
        challenge = os.urandom(32)
        conn.stream.send_msg({"challenge": b64e(challenge)})
        signature = b64d(conn.stream.recv_msg("the signed challenge").get("signature"), "signature", max_size=1024)
        if not signing.verify_auth(coordinator_key.get("key"), signature, challenge, conn.server_spki_hash):
            raise AccessDenied("AdminAuth (role coordinator): the signature does not verify")
        conn.coordinator = True
        conn.stream.send_result({"authenticated": True})

    def get_state(conn, params):
        vpn_ip, vpn_pub_key = nodes_by_public_ip[conn.sock.getsockname()[0]]
        answer = {"state": "IsNode", "state_code": 8, "role": "node"}
        if getattr(conn, "coordinator", False):
            answer.update(vpn_ip=vpn_ip, vpn_pub_key=vpn_pub_key)
        conn.stream.send_result(answer)

    context = AgentServerContext(issuer)
    # One server stands in for every Node's pubapi: the per-source handshake rate is each Node's own, not the sum.
    server = FrameServer("nodes-pubapi", ("0.0.0.0", 0), {"AdminAuth": admin_auth, "GetState": get_state},
                         tls=context, handshake_rate=None).start()
    return server, context


# --------------------------------------------------------------------------- the orchestration


def _spawn(mode: str, spec: dict, work: str, name: str):
    path = os.path.join(work, name + ".json")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(spec, handle)
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--" + mode, path],  # pylint: disable=consider-using-with
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _read_json(proc) -> dict:
    line = proc.stdout.readline()
    if not line:
        raise SystemExit("a bench process ended early (exit %s)" % proc.wait())
    return json.loads(line)


def _cpu_window(pid: int, seconds: float) -> float:
    start_cpu, start = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - start_cpu) / (time.monotonic() - start)


def _command(proc, command: str) -> dict:
    proc.stdin.write(command + "\n")
    proc.stdin.flush()
    return _read_json(proc)


def _pollers(mode, n, info, nodes, args, work, size_dir):
    """The poller processes of one mode: (processes, their out files)."""
    count = max(1, -(-len(nodes) // POLLS_PER_PROCESS))
    procs, outs = [], []
    for k in range(count):
        out = os.path.join(size_dir, "%s-%d.out" % (mode, k))
        outs.append(out)
        procs.append(_spawn("poller", {"mode": mode, "vpnapi": info["vpnapi"], "update_interval": args.update_interval,
                                       "nodes": nodes[k::count], "server_vpn_pub_key": info["server_vpn_pub_key"],
                                       "resource_version": info["resource_version"], "seed": k, "out": out},
                            work, "%s-%d-%d" % (mode, n, k)))
    for proc in procs:
        _read_json(proc)
    return procs, outs


def _collect(procs, outs):
    samples, errors = [], {}
    for proc in procs:
        proc.stdin.close()
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:  # its samples are lost: counted as missing below
            proc.kill()
            proc.wait()
    for out in outs:
        if not os.path.exists(out):
            errors["poller process lost (killed after 60 s)"] = errors.get("poller process lost (killed after 60 s)", 0) + 1
            continue
        with open(out, encoding="utf-8") as handle:
            data = json.load(handle)
        samples.extend(data["samples"])
        for key, value in data["errors"].items():
            errors[key] = errors.get(key, 0) + value
    return samples, errors


def _window(samples, bounds, held=False):
    """Requests sent in the window: count, rate, failures; latency p50/p99 (ms) of the answered ones; ``held``:
    long polls, their latency less the wait each asked for (how late it was answered at its bound), counted
    when answered in the window: after a change every Node holds again at once, so their requests start
    nearly together and one sent in a window of less than twice the wait may not also end in it."""
    at = 1 if held else 0
    rows = [s for s in samples if bounds[0] <= s[at] < bounds[1]]
    latencies = [max(0.0, (s[1] - s[0]) - (s[5] if held else 0.0)) * 1000.0 for s in rows if s[3]]
    return {"requests": len(rows), "failed": sum(1 for s in rows if not s[3]),
            "rate": len(rows) / (bounds[1] - bounds[0]), "p50": percentile(latencies, 50),
            "p99": percentile(latencies, 99)}


def _update_latency(samples, change, nodes_count):
    """From the change's commit to each Node's first answer at its version or later: p50/p99 ms, and how
    many Nodes had it by the end of the samples."""
    first = {}
    for sample in samples:
        if sample[3] and sample[2] >= change["version"] and sample[1] >= change["changed_at"]:
            first.setdefault(sample[4], sample[1])
    latencies = [(t - change["changed_at"]) * 1000.0 for t in first.values()]
    return {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99), "nodes": len(first), "of": nodes_count}


def run_size(n: int, args, work: str) -> dict:
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation import tpm
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import VTPMIssuer
    from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import (
        generate_priv_key, pub_key_from_priv_key)
    from lab.swtpm import SwTPM, free_port

    size_dir = os.path.join(work, "n%d" % n)
    os.makedirs(size_dir)
    coordinator_tpm = SwTPM(os.path.join(size_dir, "tpm-coordinator"), free_port()).start()
    nodes_tpm = SwTPM(os.path.join(size_dir, "tpm-nodes"), free_port()).start()
    procs = []
    server = context = issuer = None
    try:
        priv_keys = [generate_priv_key() for _i in range(n - 1)]
        pub_keys = [pub_key_from_priv_key(k) for k in priv_keys]
        extra = [pub_key_from_priv_key(generate_priv_key()) for _i in range(2)]  # the peers the changes add
        tpm.extend_pcr(nodes_tpm.tcti, 4, IMAGE_DIGEST)  # a measured boot, as the policy expects
        issuer = VTPMIssuer(nodes_tpm.tcti, event_log_path=None, ak_alg="rsa")  # the agent's default AK
        nodes_by_public_ip, coordinator_key = {}, {}
        # The Nodes' endpoint first (its port goes to the Coordinator); the Nodes' identities once known.
        server, context = node_server(issuer, nodes_by_public_ip, coordinator_key)
        coordinator = _spawn("coordinator", {"tcti": coordinator_tpm.tcti, "dir": size_dir, "pub_keys": pub_keys,
                                             "extra_pub_keys": extra, "log": os.path.join(size_dir, "coordinator.log"),
                                             "reattest_interval": args.reattest_interval,
                                             "reattest_port": server.address[1], "priv_key_0": priv_keys[0]},
                             work, "coordinator-%d" % n)
        procs.append(coordinator)
        info = _read_json(coordinator)
        coordinator_key["key"] = info["coordinator_pub_key"]
        for i, pub_key in enumerate(pub_keys):
            nodes_by_public_ip[public_ip(i)] = (info["vpn_ips"][pub_key], pub_key)
        tpm.mark_initialized(nodes_tpm.tcti, bytes.fromhex(info["cluster_id"]))  # every Node holds our node lock
        pid = info["pid"]
        nodes = [(info["vpn_ips"][pub_keys[i]], priv_keys[i]) for i in range(n - 1)]

        def change():
            row = _command(coordinator, "change")
            nodes_by_public_ip[row["public_ip"]] = (row["vpn_ip"], row["pub_key"])
            return row

        def measured(seconds):  # (cpu share, (start, end)); a change to the peers in the middle
            start_cpu, start = cpu_seconds(pid), time.monotonic()
            time.sleep(seconds / 2)
            row = change()
            time.sleep(seconds / 2)
            end = time.monotonic()
            return (cpu_seconds(pid) - start_cpu) / (end - start), (start, end), row

        # 1. idle: N peers registered, nothing asks.
        time.sleep(1.0)
        idle = _cpu_window(pid, args.idle_window)

        # 2. the polls of older Nodes (and of any Node whose Coordinator does not hold): no
        #    re-attestation.
        pollers, outs = _pollers("poll", n, info, nodes, args, work, size_dir)
        procs.extend(pollers)
        time.sleep(args.update_interval)  # warm-up: every Node polled once
        polls, polls_bounds, polls_change = measured(args.window)
        time.sleep(args.update_interval)  # every Node polls after the change
        poll_samples, poll_errors = _collect(pollers, outs)

        # 3. the long polls of the agent now, then 4. with re-attestation at the defaults.
        pollers, outs = _pollers("long", n, info, nodes, args, work, size_dir)
        procs.extend(pollers)
        time.sleep(args.update_interval + 2)  # warm-up: every Node connected and holding
        long_cpu, long_bounds, long_change = measured(args.window)
        _command(coordinator, "reattest")
        time.sleep(args.reattest_warmup)
        full = _cpu_window(pid, args.window)
        full_bounds = (time.monotonic() - args.window, time.monotonic())
        stats = _command(coordinator, "stats")
        costs = _command(coordinator, "costs")
        long_samples, long_errors = _collect(pollers, outs)
        return {"n": n, "idle": idle, "polls": polls, "long": long_cpu, "full": full,
                "polls_latency": _window(poll_samples, polls_bounds),
                "long_latency": _window(long_samples, long_bounds, held=True),
                "full_latency": _window(long_samples, full_bounds, held=True),
                "polls_update": _update_latency(poll_samples, polls_change, n - 1),
                "long_update": _update_latency(long_samples, long_change, n - 1),
                "intended_rate": (n - 1) / args.update_interval, "errors": dict(poll_errors, **long_errors),
                "events": stats["events"], "examples": stats["examples"], "reattested": stats["reattested"],
                "costs": costs, "load": os.getloadavg()}
    finally:
        for proc in procs:
            try:
                if proc.stdin and not proc.stdin.closed:
                    proc.stdin.close()
                proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
        if server is not None:
            server.stop()
        if context is not None:
            context.close()
        if issuer is not None:
            issuer.close()
        nodes_tpm.stop()
        coordinator_tpm.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", default="100,1000,5000", help="peer counts (the Coordinator included)")
    parser.add_argument("--window", type=float, default=15.0, help="seconds of each measured window")
    parser.add_argument("--idle-window", type=float, default=5.0)
    parser.add_argument("--reattest-warmup", type=float, default=5.0)
    parser.add_argument("--update-interval", type=float, default=DEFAULT_UPDATE_INTERVAL)
    parser.add_argument("--reattest-interval", type=float, default=DEFAULT_REATTEST_INTERVAL)
    parser.add_argument("--coordinator", help=argparse.SUPPRESS)
    parser.add_argument("--poller", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.coordinator:
        coordinator_main(args.coordinator)
        return
    if args.poller:
        poller_main(args.poller)
        return
    sizes = [int(x) for x in args.nodes.split(",") if x.strip()]
    if any(n < 2 for n in sizes):
        raise SystemExit("--nodes: at least 2 peers (the Coordinator and a Node)")
    from lab.etcd import tmpfs_dir

    print("load average: %.2f %.2f %.2f (2 cores)" % os.getloadavg())
    work = tempfile.mkdtemp(prefix="bench-capacity-", dir=tmpfs_dir())
    rows = []
    try:
        for n in sizes:
            rows.append(run_size(n, args, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("Coordinator CPU seconds per second (its process), update_interval %gs, reattest_interval %gs, %d workers:"
          % (args.update_interval, args.reattest_interval, DEFAULT_REATTEST_WORKERS))
    print("%-6s %7s %7s %7s %7s  %15s %16s %12s %17s %17s %6s %5s" % (
        "peers", "idle", "polls", "long", "full", "polls/s (want)", "poll p50/p99 ms", "held late99",
        "update polls ms", "update long ms", "failed", "load"))
    result = {}
    for r in rows:
        n = r["n"]
        failed = r["polls_latency"]["failed"] + r["long_latency"]["failed"] + r["full_latency"]["failed"]
        print("%-6d %7.3f %7.3f %7.3f %7.3f  %7.1f (%5.1f) %7.2f/%8.2f %12.2f %8.0f/%8.0f %8.0f/%8.0f %6d %5.2f" % (
            n, r["idle"], r["polls"], r["long"], r["full"], r["polls_latency"]["rate"], r["intended_rate"],
            r["polls_latency"]["p50"], r["polls_latency"]["p99"], r["full_latency"]["p99"],
            r["polls_update"]["p50"], r["polls_update"]["p99"], r["long_update"]["p50"], r["long_update"]["p99"],
            failed, r["load"][0]))
        print("       re-attestations (full phase, from its start): %s; Nodes that saw the change polls/long: %d/%d of %d;"
              % (json.dumps(r["reattested"], sort_keys=True), r["polls_update"]["nodes"], r["long_update"]["nodes"],
                 r["polls_update"]["of"]))
        errors = json.dumps(r["errors"]) if r["errors"] else "none"
        print("       request errors: %s; log events: %s" % (errors, json.dumps(r["events"], sort_keys=True)))
        for event, example in sorted(r["examples"].items()):
            print("       %s: %s" % (event, example))
        result.update({
            "cpu_share_%d" % n: round(r["full"], 4), "poll_p99_ms_%d" % n: round(r["full_latency"]["p99"], 2),
            "cpu_share_idle_%d" % n: round(r["idle"], 4), "cpu_share_polls_%d" % n: round(r["polls"], 4),
            "cpu_share_long_%d" % n: round(r["long"], 4),
            "poll_p50_ms_polls_%d" % n: round(r["polls_latency"]["p50"], 2),
            "poll_p99_ms_polls_%d" % n: round(r["polls_latency"]["p99"], 2),
            "poll_rate_%d" % n: round(r["polls_latency"]["rate"], 1),
            "poll_rate_intended_%d" % n: round(r["intended_rate"], 1),
            "update_p99_ms_%d" % n: round(r["long_update"]["p99"], 1),
            "update_p99_ms_polls_%d" % n: round(r["polls_update"]["p99"], 1),
            "requests_failed_%d" % n: failed, "load_avg_1m_%d" % n: round(r["load"][0], 2)})
    costs = rows[-1]["costs"]
    print("a poll's parts in the Coordinator's process (us, median, %d peers): %s" % (rows[-1]["n"], json.dumps(costs)))
    result.update({"cost_%s" % k: v for k, v in costs.items()})
    print("idle: the Coordinator with its peers registered, nothing asking (baseline). polls: every Node polls as")
    print("poll: as older agents do (a new connection, PeerAuth, GetUpdate, close; baseline). long: the agent now, one held")
    print("GetUpdate per Node (agent/long_poll.py). full: long polls and re-attestation at the defaults (cpu_share_N).")
    print("poll p50/p99: a poll's latency (polls). held late99: how late a held GetUpdate is answered after its wait")
    print("(p99, full: poll_p99_ms_N). update: from a change of the peers to each Node having it (p50/p99).")
    print(json.dumps({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in result.items()}))


if __name__ == "__main__":
    main()
