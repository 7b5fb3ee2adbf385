"""Versioned peer updates: what a node downloads per poll, ours (delta) against Constellation's GetUpdate
(the full peer list on any change), measured in the same run.

For 10 and 1,000 peers: the answer when nothing changed and after 5 changes (2 added, 2 endpoints
changed, 1 removed), as JSON bytes and time to compute + serialise (median, us). Baseline: the full peer
list as JSON (store records) and its protobuf wire size (GetUpdateResponse{resource_version, repeated Peer}).
Last line: one JSON object.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "collections")]

from ansible_collections.constellation.cluster.plugins.module_utils.peers import PeerRecord, VersionedPeerSet  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import (  # noqa: E402
    generate_priv_key,
    pub_key_from_priv_key,
)


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
    vpn_ip=2, vpn_pub_key=3 bytes(32), role=4}} (SPEC 6.2/6.3)."""
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


def main() -> None:
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
    print(json.dumps({
        "peers": big["peers"],
        "nochange_us": round(big["nochange_us"], 2),
        "nochange_bytes": big["nochange_bytes"],
        "nochange_bytes_10": small["nochange_bytes"],
        "five_changes_bytes": big["five_changes_bytes"],
        "five_changes_us": round(big["five_changes_us"], 2),
        "baseline_full_json_bytes": big["baseline_full_json_bytes"],
        "baseline_full_json_us": round(big["baseline_full_json_us"], 2),
        "baseline_full_proto_bytes": big["baseline_full_proto_bytes"],
    }))


if __name__ == "__main__":
    main()
