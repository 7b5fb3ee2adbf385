"""Versioned peer updates: what a node downloads per poll, ours (delta) against Constellation's GetUpdate
(the full peer list on any change), measured in the same run.

In memory, for 10 and 1,000 peers: the answer when nothing changed and after 5 changes (2 added, 2
endpoints changed, 1 removed), as JSON bytes and time to compute + serialise (median, us). Baseline: the
full peer list as JSON (store records) and its protobuf wire size (GetUpdateResponse{resource_version,
repeated Peer}).

Through the server, for 10, 100 and 1,000 peers on the file store and on etcd (a real etcd from
lab/etcd.py): a Coordinator Core (real swtpm) restarted over a store that holds the peers, its vpnapi
FrameServer on loopback, and a poll as a Node's agent makes it (a new TCP connection from a peer's VPN IP,
the known-peer check, PeerAuth with the node's WireGuard key (its pair key cached, as the agent's), GetUpdate
with the current version, close): median ms. Same run, same server: the poll without PeerAuth, as the
vpnapi would answer it with the source IP as the only identity, to show what the proof costs. The VPN CIDR is
127.0.0.0/16 so that loopback addresses are VPN IPs (no namespace needed). Baseline, same run, same
server: the registry loaded from the store for the known-peer check and for GetUpdate (what the
Coordinator did before the in-memory registry, core/registry/cache.py).

    python bench/peer_updates.py [--no-server] [--polls 300]

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "collections"),
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")]
os.environ.setdefault("TSS2_LOG", "all+none")

from ansible_collections.constellation.cluster.plugins.module_utils.core.records import state_store  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_record import PeerRecord  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_set import VersionedPeerSet  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import (  # noqa: E402
    generate_priv_key,
    pub_key_from_priv_key,
)
from ansible_collections.constellation.cluster.plugins.module_utils.agent.peer_view import CorePeerView  # noqa: E402


BENCH_VPN_CIDR = "127.0.0.0/16"
SERVER_SIZES = (10, 100, 1000)


def _ip(base: str, i: int) -> str:
    return "%s.%d.%d" % (base, i // 250, 1 + i % 250)


def _records(n: int, offset: int = 0) -> list[PeerRecord]:
    return [PeerRecord.parse(_ip("10.118", 11 + offset + i), pub_key_from_priv_key(generate_priv_key()),
                             _ip("10.42", offset + i), "node") for i in range(n)]


def _median_us(fn, repeat: int) -> float:
    times = []
    for dummy_run in range(repeat):
        start = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1000.0


def _varint_len(n: int) -> int:
    size = 1
    while n >= 0x80:
        n >>= 7
        size += 1
    return size


def _proto_full_bytes(peers: list[PeerRecord], version: int) -> int:
    """Wire size of GetUpdateResponse{resource_version=1 int64, peers=2 repeated Peer{public_ip=1,
    vpn_ip=2, vpn_pub_key=3 bytes(32), role=4}} (the Coordinator's protobuf messages)."""
    total = 1 + _varint_len(version)
    for p in peers:
        body = (2 + len(p.public_ip or "") if p.public_ip else 0) + 2 + len(p.vpn_ip) + 2 + 32 + 2
        total += 1 + _varint_len(body) + body
    return total


def measure(n: int) -> dict:
    peers = VersionedPeerSet()
    version = peers.apply(put=_records(n))

    def answer(v):
        return json.dumps(peers.updates_since(v).to_dict(), separators=(",", ":")).encode()

    nochange_bytes = len(answer(version))
    nochange_us = _median_us(lambda: answer(version), 500)

    current = peers.peers
    first = sorted(current)[:3]
    for record in _records(2, offset=n + 10):
        peers.put(record)
    for ip in first[:2]:
        old = current[ip]
        peers.put(PeerRecord.parse(old.vpn_ip, old.vpn_pub_key, "10.43.0.%d" % (1 + first.index(ip)), old.role))
    peers.remove(first[2])
    five_bytes = len(answer(version))
    five_us = _median_us(lambda: answer(version), 200)

    full = list(peers.peers.values())

    def baseline():
        return json.dumps({"resource_version": peers.version,
                           "peers": [{"PublicIP": r.public_ip or "", "VPNIP": r.vpn_ip,
                                      "VPNPubKey": r.vpn_pub_key, "Role": "Node"} for r in full]}, separators=(",", ":")).encode()

    return {
        "peers": n,
        "nochange_bytes": nochange_bytes,
        "nochange_us": nochange_us,
        "five_changes_bytes": five_bytes,
        "five_changes_us": five_us,
        "baseline_full_json_bytes": len(baseline()),
        "baseline_full_json_us": _median_us(baseline, 20 if n > 100 else 200),
        "baseline_full_proto_bytes": _proto_full_bytes(full, peers.version),
    }


class _NullVPN:
    """The Core's VPN port without WireGuard (the poll path never touches it; loopback addresses stand for
    the tunnel)."""

    vpn_cidr = BENCH_VPN_CIDR

    def setup(self, vpn_ip, priv_key, cluster_pod_cidr=None):
        pass

    def set_peers(self, records, own_pub_key):
        return True


class _StoreEveryTime:
    """The registry as the Coordinator read it before 0.3.0: loaded and validated from the store each time."""

    def __init__(self, store):
        self._store = store

    def current(self):
        return state_store.load_peer_registry(self._store)

    def is_known_peer_ip(self, vpn_ip):
        registry = self.current()
        return registry is not None and registry.peers.get(vpn_ip) is not None


def _coordinator(store, tpm, state_dir: str, n: int):
    """A Coordinator with ``n`` peers (itself and n - 1 Nodes), restarted over ``store``: (Core, load ms)."""
    from ansible_collections.constellation.cluster.plugins.module_utils import core, kms
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    pem = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    disk_uuid = core.new_disk_uuid()
    first = core.Core(store, core.TPMDevice(tpm.tcti), _NullVPN(), state_dir, "127.0.0.1", disk_uuid)
    first.recovery.load()
    first.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), pem,
                                              cluster_config={"vpn_cidr": BENCH_VPN_CIDR})
    priv_keys = [generate_priv_key() for _i in range(n - 1)]
    node_priv_keys = {}

    def add_nodes(registry):
        for i, priv_key in enumerate(priv_keys):
            node_priv_keys[registry.add(pub_key_from_priv_key(priv_key), _ip("10.42", i), "node").vpn_ip] = priv_key

    state_store.update_peer_registry(store, add_nodes)  # one transaction
    restarted = core.Core(store, core.TPMDevice(tpm.tcti), _NullVPN(), state_dir, "127.0.0.1", disk_uuid)
    start = time.perf_counter()
    restarted.recovery.load()  # the one read of the registry
    restarted.bench_node_priv_keys = node_priv_keys
    return restarted, (time.perf_counter() - start) * 1000


def _poll_ms(endpoint, source_ip: str, version: int, polls: int, pair_keys=None, server_pub_key=None) -> float:
    """``pair_keys``: the node's (peer_auth.PairKeys, as the agent caches them): PeerAuth first."""
    from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient

    times = []
    for _poll in range(polls):
        start = time.perf_counter()
        sock = socket.create_connection(endpoint, timeout=10, source_address=(source_ip, 0))
        with AgentClient.connect_plain("%s:%d" % endpoint, sock=sock) as client:
            if pair_keys is not None:
                client.peer_auth(pair_keys, server_pub_key)
            answer = client.get_update(version)
        times.append(time.perf_counter() - start)
        if answer != {"resource_version": version}:
            raise SystemExit("unexpected answer: %r" % answer)
    return statistics.median(times) * 1000


def measure_server(store, tpm, n: int, polls: int) -> dict:
    from ansible_collections.constellation.cluster.plugins.module_utils.agent.json_log import JSONLog
    from ansible_collections.constellation.cluster.plugins.module_utils.rpc import schema
    from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import FrameServer
    from ansible_collections.constellation.cluster.plugins.module_utils.agent.wiring import vpnapi_handlers
    from ansible_collections.constellation.cluster.plugins.module_utils.wireguard.peer_auth import PairKeys

    state_dir = tempfile.mkdtemp(prefix="bench-peers-")
    devnull = open(os.devnull, "w", encoding="utf-8")  # pylint: disable=consider-using-with
    log = JSONLog(devnull)  # the agent logs every request: keep that cost in
    try:
        coordinator, load_ms = _coordinator(store, tpm, state_dir, n)
        registry = coordinator.context.peer_registry.current()
        assert len(registry.peers) == n
        version = registry.peers.version
        vpnapi = vpnapi_handlers(coordinator, log=log)
        server = FrameServer("vpnapi", (coordinator.context.vpn_ip, 0), vpnapi.handlers(), log=log,
                             accept_check=vpnapi.accept_check, apis=(schema.VPNAPI,),
                             peer_view=CorePeerView(coordinator)).start()
        try:
            node_ip = sorted(ip for ip, r in registry.peers.peers.items() if r.role == "node")[0]
            auth = (PairKeys(coordinator.bench_node_priv_keys[node_ip]), coordinator.context.vpn_pub_key)
            _poll_ms(server.address, node_ip, version, 20, *auth)  # warm up
            memory_ms = _poll_ms(server.address, node_ip, version, polls, *auth)
            in_memory = coordinator.context.peer_registry
            coordinator.context.peer_registry = _StoreEveryTime(store)
            baseline_ms = _poll_ms(server.address, node_ip, version, max(10, polls // (10 if n >= 1000 else 3)), *auth)
            coordinator.context.peer_registry = in_memory
        finally:
            server.stop()
        # The same Core, the vpnapi without PeerAuth (the baseline), interleaved with the authenticated one.
        plain = vpnapi_handlers(coordinator, log=log)  # served without the server's checks: no PeerAuth
        server = FrameServer("vpnapi", (coordinator.context.vpn_ip, 0), plain.handlers(), log=log,
                             accept_check=plain.accept_check, apis=(schema.VPNAPI,),
                             insecure_skip_access_checks=True).start()
        authed = FrameServer("vpnapi", (coordinator.context.vpn_ip, 0), vpnapi.handlers(), log=log,
                             accept_check=vpnapi.accept_check, apis=(schema.VPNAPI,),
                             peer_view=CorePeerView(coordinator)).start()
        try:
            _poll_ms(server.address, node_ip, version, 20)
            noauth, withauth = [], []
            for _round in range(5):
                noauth.append(_poll_ms(server.address, node_ip, version, max(10, polls // 5)))
                withauth.append(_poll_ms(authed.address, node_ip, version, max(10, polls // 5), *auth))
        finally:
            server.stop()
            authed.stop()
        return {"peers": n, "server_nochange_ms": memory_ms, "baseline_store_reload_ms": baseline_ms,
                "restart_load_ms": load_ms, "noauth_ms": statistics.median(noauth),
                "auth_ms": statistics.median(withauth)}
    finally:
        devnull.close()
        shutil.rmtree(state_dir, ignore_errors=True)


def server_rows(polls: int) -> dict:
    from lab.etcd import Etcd, free_ports, tmpfs_dir
    from lab.swtpm import SwTPM, free_port
    from ansible_collections.constellation.cluster.plugins.module_utils.store import open_store

    rows = {}
    work = tempfile.mkdtemp(prefix="bench-peers-", dir=tmpfs_dir())
    etcd = None
    tpms = []
    try:
        etcd = Etcd(os.path.join(work, "etcd"), *free_ports(2), extra_args=["--max-txn-ops", "16384"]).start()
        for kind in ("file", "etcd"):
            for n in SERVER_SIZES:
                tpm = SwTPM(os.path.join(work, "tpm-%s-%d" % (kind, n)), free_port()).start()
                tpms.append(tpm)
                if kind == "file":
                    spec = {"type": "file", "path": os.path.join(work, "store-%d.json" % n)}
                else:
                    spec = {"type": "etcd", "endpoints": [etcd.endpoint], "prefix": "bench-%d/" % n}
                with open_store(spec) as store:
                    rows[(kind, n)] = measure_server(store, tpm, n, polls)
                tpm.stop()
    finally:
        for tpm in tpms:
            try:
                tpm.stop()
            except Exception:  # pylint: disable=broad-except
                pass
        if etcd is not None:
            etcd.stop()
        shutil.rmtree(work, ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-server", action="store_true", help="only the in-memory figures")
    parser.add_argument("--polls", type=int, default=300)
    args = parser.parse_args()
    print("load average: %.2f %.2f %.2f (2 cores)" % os.getloadavg())
    rows = [measure(10), measure(1000)]
    print("%-7s %12s %10s %14s %11s %15s %12s %16s" % ("peers", "nochange B", "us", "5 changes B", "us",
                                                       "full JSON B", "us", "full proto B"))
    for r in rows:
        print("%-7d %12d %10.1f %14d %11.1f %15d %12.1f %16d" % (
            r["peers"], r["nochange_bytes"], r["nochange_us"], r["five_changes_bytes"], r["five_changes_us"],
            r["baseline_full_json_bytes"], r["baseline_full_json_us"], r["baseline_full_proto_bytes"]))
    small, big = rows
    print("baseline = Constellation GetUpdate: the full peer list on every change (JSON records / protobuf wire size);")
    print("           with no change it too answers with the version only, so the saving is on change.")
    result = {
        "peers": big["peers"],
        "nochange_us": round(big["nochange_us"], 2),
        "nochange_bytes": big["nochange_bytes"],
        "nochange_bytes_10": small["nochange_bytes"],
        "five_changes_bytes": big["five_changes_bytes"],
        "five_changes_us": round(big["five_changes_us"], 2),
        "baseline_full_json_bytes": big["baseline_full_json_bytes"],
        "baseline_full_json_us": round(big["baseline_full_json_us"], 2),
        "baseline_full_proto_bytes": big["baseline_full_proto_bytes"],
    }
    if not args.no_server:
        served = server_rows(args.polls)
        print()
        print("through the vpnapi server (new connection, known-peer check, PeerAuth, GetUpdate, close), median ms:")
        print("%-6s %-7s %12s %22s %16s %14s %16s" % ("store", "peers", "in memory", "baseline: store reload",
                                                      "restart load", "no PeerAuth", "with PeerAuth"))
        for (kind, n), r in sorted(served.items()):
            print("%-6s %-7d %12.3f %22.3f %16.1f %14.3f %16.3f"
                  % (kind, n, r["server_nochange_ms"], r["baseline_store_reload_ms"], r["restart_load_ms"],
                     r["noauth_ms"], r["auth_ms"]))
            suffix = "" if kind == "file" else "_etcd"
            result["server_nochange_noauth_ms_%d%s" % (n, suffix)] = round(r["noauth_ms"], 3)
            result["server_nochange_auth_ms_%d%s" % (n, suffix)] = round(r["auth_ms"], 3)
            result["server_nochange_ms_%d%s" % (n, suffix)] = round(r["server_nochange_ms"], 3)
            result["baseline_server_store_reload_ms_%d%s" % (n, suffix)] = round(r["baseline_store_reload_ms"], 3)
            result["restart_load_ms_%d%s" % (n, suffix)] = round(r["restart_load_ms"], 1)
        print("baseline = the same server and Core reading the registry from the store for the known-peer check")
        print("           and GetUpdate (before core/registry/cache.py); server_nochange_ms_N is the file store,")
        print("           *_etcd the etcd store. no/with PeerAuth: the same Core, two servers polled in turn (5")
        print("           rounds, median): the vpnapi with the source IP only and with the WireGuard key proof.")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
