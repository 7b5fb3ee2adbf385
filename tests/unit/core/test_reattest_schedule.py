# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Re-attestation spread over the interval (core/eviction/reattest_loop.py): each peer once per interval at
its stable offset, in batches of one tick's share, not all at once; a peer added mid-cycle comes in the next
cycle, one removed is skipped; the unreachable limit and the unverified period (core/eviction/peer_trust.py) count per peer. A fake clock
whose ``stop.wait`` advances it: no sleeping, no timing assertion."""

from __future__ import annotations

import os

from ansible_collections.constellation.cluster.plugins.module_utils import core, kms
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import expected_pcr15
from ansible_collections.constellation.cluster.plugins.module_utils.core.eviction.reattest_loop import (
    ReattestLoop,
    due,
    spread_offset,
)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError

from ansible_collections.constellation.cluster.tests.support.core_fakes import (
    FakePeerClient,
    MemoryTPM,
    admin_pem,
    record_nodes,
)

INTERVAL = 60.0


class FakeTime:
    """``clock()`` and a stop event whose ``wait(t)`` moves the clock on by ``t``; set once ``end`` is reached."""

    def __init__(self, end: float):
        self.now = 1000.0
        self.end = 1000.0 + end

    def __call__(self) -> float:
        return self.now

    def is_set(self) -> bool:
        return self.now >= self.end

    def wait(self, timeout=None) -> bool:
        self.now = min(self.end, self.now + max(0.0, timeout or 0.0))
        return self.is_set()


class Recorder:
    """A Coordinator's peer_trust service in the loop: records when each peer was re-attested."""

    state = core.State.ACTIVATING_NODES

    def __init__(self, clock: FakeTime, peers):
        self.clock = clock
        self.peers = list(peers)
        self.calls = []  # (time, [vpn_ip])
        self.on_call = None

    def reattest_targets(self):
        return list(self.peers)

    def reattest_peers(self, connect_peer, workers, unreachable_limit, only=None, unverified_eviction_after=None):
        batch = [ip for ip in self.peers if ip in set(only)]
        self.calls.append((self.clock(), batch))
        if self.on_call is not None:
            self.on_call(self)
        return [{"vpn_ip": ip, "outcome": "passed"} for ip in batch]


def _ips(count):
    return ["10.118.%d.%d" % (i // 250, 1 + i % 250) for i in range(count)]


def _times(recorder):
    out = {}
    for when, batch in recorder.calls:
        for ip in batch:
            out.setdefault(ip, []).append(when - 1000.0)
    return out


def test_offsets_are_stable_and_spread_over_the_interval():
    offsets = [spread_offset(ip, INTERVAL) for ip in _ips(600)]
    assert offsets == [spread_offset(ip, INTERVAL) for ip in _ips(600)]
    assert all(0 <= o < INTERVAL for o in offsets)
    # Every tenth of the interval holds some of them (hash-spread, not bunched at the start).
    assert all(any(k * 6 <= o < (k + 1) * 6 for o in offsets) for k in range(10))
    schedule = sorted((o, ip) for o, ip in zip(offsets, _ips(600)))
    batch, count = due(schedule, 0.0, 1.0)
    assert count == len(batch) and all(o < 1.0 for o, _ip in schedule[:count]) and schedule[count][0] >= 1.0


def test_each_peer_is_reattested_once_per_interval_at_its_offset_in_small_batches():
    clock = FakeTime(3 * INTERVAL)
    recorder = Recorder(clock, _ips(600))
    loop = ReattestLoop(recorder, None, INTERVAL, 4, 3, clock, clock=clock)
    loop.run_cycles()
    times = _times(recorder)
    assert sorted(times) == sorted(_ips(600))
    for ip, seen in times.items():
        offset = spread_offset(ip, INTERVAL)
        assert len(seen) == 3
        for cycle, when in enumerate(seen):  # at its offset (at most one tick early), every cycle alike
            assert offset - loop.tick <= when - cycle * INTERVAL <= offset + 1e-9
    # Spread: many batches per cycle, none more than a few ticks' share (600 peers, 60 ticks: ~10 each).
    assert len(recorder.calls) >= 3 * 30
    assert max(len(batch) for _when, batch in recorder.calls) <= 40


def test_a_peer_added_in_a_cycle_comes_in_the_next_and_a_removed_one_is_skipped():
    clock = FakeTime(2 * INTERVAL)
    peers = _ips(50)
    recorder = Recorder(clock, peers[:40])
    removed = peers[0] if spread_offset(peers[0], INTERVAL) > 30 else next(
        ip for ip in peers[:40] if spread_offset(ip, INTERVAL) > 30)

    def change(rec):
        if rec.clock() - 1000.0 >= 20 and len(rec.peers) == 40:
            rec.peers = [ip for ip in rec.peers if ip != removed] + peers[40:]

    recorder.on_call = change
    ReattestLoop(recorder, None, INTERVAL, 4, 3, clock, clock=clock).run_cycles()
    times = _times(recorder)
    assert removed not in times
    for ip in peers[40:]:
        assert len(times[ip]) == 1 and times[ip][0] >= INTERVAL  # the next cycle
    assert all(len(times[ip]) == 2 for ip in peers[:40] if ip != removed)


def test_not_a_coordinator_or_not_the_leader_runs_nothing():
    clock = FakeTime(2 * INTERVAL)
    recorder = Recorder(clock, _ips(10))
    recorder.state = core.State.ACCEPTING_INIT
    ReattestLoop(recorder, None, INTERVAL, 4, 3, clock, clock=clock).run_cycles()
    assert recorder.calls == [] and clock.is_set()

    class Follower:
        current, last_error = "another", ""

        def step(self):
            return False

    clock = FakeTime(2 * INTERVAL)
    recorder = Recorder(clock, _ips(10))
    ReattestLoop(recorder, None, INTERVAL, 4, 3, clock, leadership=Follower(), clock=clock).run_cycles()
    assert recorder.calls == []


def test_the_unreachable_limit_still_counts_cycles_of_each_peer(make_core):
    """The loop over a real Coordinator Core: a Node that does not answer is unverified in the cycle of its
    third failure (the limit), not before, and evicted only in the first cycle at least
    ``unverified_eviction_after`` after its first failure (one fake clock for the loop and the Core); the
    other Node passes once per cycle."""
    c, _vpn = make_core(MemoryTPM(), public_ip="10.42.0.11")
    c.recovery.load()
    c.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), admin_pem())
    nodes = record_nodes(c, ("10.42.0.12", "10.42.0.13"))
    ours = expected_pcr15(c.context.cluster_id)
    down = nodes["10.42.0.12"]["vpn_ip"]
    calls = []

    def connect(public_ip):
        calls.append(public_ip)
        if public_ip == "10.42.0.12":
            return FakePeerClient(error=ConstellationError("cannot connect to %s:9000: timed out" % public_ip))
        return FakePeerClient(ours, nodes[public_ip])

    clock = FakeTime(0)
    c.peer_trust.clock = clock
    seen = []
    for _cycle in range(8):  # one cycle each; evicted 5 intervals after the first failure
        clock.end = clock.now + INTERVAL
        ReattestLoop(c.peer_trust, connect, INTERVAL, 4, 3, clock, clock=clock,
                     unverified_eviction_after=5 * INTERVAL).run_cycles()
        seen.append("evicted" if c.evictions.is_evicted(down) else
                    "unverified" if c.evictions.is_unverified(down) else "unreachable")
    assert seen == ["unreachable"] * 2 + ["unverified"] * 3 + ["evicted"] * 3
    assert calls.count("10.42.0.12") == 6 and calls.count("10.42.0.13") == 8
