# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Continuous pings over a lab cluster's mesh during a rolling upgrade, and what they show.

``Pings(cluster, vpn_ips)`` runs one ``ping`` per pair of hosts over the VPN (from the lower to the higher);
``stop()`` returns each pair's reply times; ``pinged(cluster, vpn_ips, play)`` runs ``play`` with them.
``windows(run, task)`` reads from a playbook run when each host's reboot task ran; ``silent_pairs(replies,
windows)`` names the pairs that did not answer while a host outside them rebooted (none, when the roll keeps the
rest of the mesh up)."""

from __future__ import annotations

import datetime
import itertools
import re
import subprocess
import time
from typing import Any, Callable, Dict, List, Tuple


class Pings:
    def __init__(self, cluster, vpn_ips: Dict[str, str]):
        self.procs = {}
        self.files = {}
        for a, b in itertools.combinations(sorted(vpn_ips), 2):
            out = cluster.lab.state_dir / ("ping-%s-%s.log" % (a, b))
            self.files[(a, b)] = out
            with open(out, "wb") as handle:
                self.procs[(a, b)] = cluster.hosts[a].popen(["ping", "-D", "-n", "-i", "0.2", vpn_ips[b]],
                                                            stdout=handle, stderr=subprocess.STDOUT)

    def stop(self) -> Dict[Tuple[str, str], List[float]]:
        for proc in self.procs.values():
            proc.terminate()
            proc.wait(timeout=5)
        replies = {}
        for pair, path in self.files.items():
            replies[pair] = [float(m) for m in re.findall(r"^\[(\d+\.\d+)\] \d+ bytes from", path.read_text(), re.M)]
        return replies


def pinged(cluster, vpn_ips: Dict[str, str], play: Callable[[], Any]) -> Tuple[Any, Dict[Tuple[str, str], List[float]]]:
    """``play()``'s result and the replies of the pings that ran throughout it (and a second after)."""
    pings = Pings(cluster, vpn_ips)
    try:
        run = play()
        time.sleep(1.0)
    finally:
        replies = pings.stop()
    return run, replies


def _ts(text: str) -> float:
    """An ansible-runner event time (ISO, local) as a Unix time."""
    return datetime.datetime.fromisoformat(text).timestamp()


def windows(run, task: str) -> Dict[str, Tuple[float, float]]:
    """host -> (start, end) of ``task`` in the playbook run (its runner_on_ok events)."""
    out = {}
    for event in run.events:
        data = event.get("event_data") or {}
        if data.get("task") == task and event.get("event") == "runner_on_ok":
            out[data["host"]] = (_ts(data["start"]), _ts(data["end"]))
    return out


def silent_pairs(replies, reboots) -> List[str]:
    """The pairs without a reply while a host outside them rebooted (and pairs without any reply)."""
    silent = []
    for (a, b), times in replies.items():
        if not times:
            silent.append("%s-%s never answered" % (a, b))
        for name, (start, end) in reboots.items():
            if name not in (a, b) and not any(start <= t <= end for t in times):
                silent.append("%s-%s did not answer while %s rebooted" % (a, b, name))
    return silent
