# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Concurrency for tests: run one piece of work in several threads at once and fail on any error."""

from __future__ import annotations

import threading
from typing import Callable


def run_in_threads(work: Callable[[int], None], count: int, timeout: float) -> None:
    """Runs ``work(index)`` for each index below ``count``, each in a thread of its own, all at once; waits
    ``timeout`` seconds at most for each; fails naming the errors any of them raised."""
    errors = []

    def run(index):
        try:
            work(index)
        except Exception as err:  # pylint: disable=broad-except  # reported below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not errors, errors
