# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Polling with a deadline, for tests: ``until(check)``."""

from __future__ import annotations

import time


def until(check, timeout: float = 20.0, interval: float = 0.2, what: str = "condition", why=None):
    """Polls ``check()`` until it returns something true (which is returned), at most ``timeout``
    seconds; AssertionError naming ``what``, the last value and ``why()`` (e.g. log tails) otherwise."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError("timed out waiting for %s (last: %r)%s" % (what, last, " " + why() if why else ""))
