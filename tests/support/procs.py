# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Processes by pid, for tests and benchmarks: the lab's own helpers (lab/procs.py), which the lab needs
too (to stop its hosts' processes), re-exported here so that a test has one place to look."""

from lab.procs import alive, is_zombie, kill_all, wait_gone  # noqa: F401  (re-exported)

__all__ = ["alive", "is_zombie", "kill_all", "wait_gone"]
