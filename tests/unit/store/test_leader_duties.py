# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Cluster-wide duties run on one Coordinator at a time (#18): two re-attestation loops on one real
etcd, elected through its lease; the other takes over when the leader stops."""

from __future__ import annotations

import threading
import time

from ansible_collections.constellation.cluster.plugins.module_utils.core.leadership import Leadership
from ansible_collections.constellation.cluster.plugins.module_utils.core.state import State
from ansible_collections.constellation.cluster.plugins.module_utils.core.eviction.reattest_loop import ReattestLoop
from ansible_collections.constellation.cluster.plugins.module_utils.store import EtcdStore, MemoryStore


class RoundCounter:
    """Stands in for a Coordinator's Core in the loop: counts the rounds it is asked to run."""

    state = State.ACTIVATING_NODES

    def __init__(self):
        self.rounds = 0

    def reattest_targets(self):
        return ["10.118.0.11"]

    def reattest_peers(self, connect_peer, workers, unreachable_limit, only=None, unverified_eviction_after=None):
        self.rounds += 1
        return []


def _loop(store, name, stop):
    core = RoundCounter()
    loop = ReattestLoop(core, None, 0.05, 1, 3, stop, leadership=Leadership(store, name, ttl=1))
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    return core, loop, thread


def test_only_the_leader_runs_the_rounds_and_the_other_takes_over(etcd_server, etcd_prefix):
    stops = [threading.Event(), threading.Event()]
    first, first_loop, first_thread = _loop(EtcdStore([etcd_server.endpoint], prefix=etcd_prefix), "c0", stops[0])
    time.sleep(0.3)  # c0 starts first and takes the lease
    second, _second_loop, second_thread = _loop(EtcdStore([etcd_server.endpoint], prefix=etcd_prefix), "c1", stops[1])
    try:
        time.sleep(1.0)
        assert first.rounds > 0 and second.rounds == 0
        # c0 stops (a crash: no resign); once its lease ran out, c1 runs the rounds.
        stops[0].set()
        first_thread.join(5)
        deadline = time.monotonic() + 15
        while second.rounds == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert second.rounds > 0 and not first_loop.leadership.leads()
    finally:
        for stop in stops:
            stop.set()
        second_thread.join(5)


def test_a_coordinator_alone_always_runs_them():
    stop = threading.Event()
    core, _loop_obj, thread = _loop(MemoryStore(), "c0", stop)
    try:
        deadline = time.monotonic() + 10
        while core.rounds < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert core.rounds >= 2
    finally:
        stop.set()
        thread.join(5)
