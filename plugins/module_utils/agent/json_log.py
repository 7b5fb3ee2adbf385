# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent's log (docs/agent.md): one JSON object per line on stderr; fields are names, IPs, versions and
errors, never key material."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

KILL_AFTER_EVENT_ENV = "CONSTELLATION_AGENT_TEST_KILL_AFTER_EVENT"


class JSONLog:
    """Structured logs: one JSON object per line. Callers pass names and metadata, never keys."""

    def __init__(self, stream=None, node: str = ""):
        self.stream = stream or sys.stderr
        self.node = node
        self._lock = threading.Lock()
        # Fault tests only (the repository's test_faults.py): the process dies at once, as under
        # SIGKILL, right after it logs this event, so that a test can stop an agent at an exact step.
        self.kill_after_event = os.environ.get(KILL_AFTER_EVENT_ENV) or None

    def __call__(self, event: str, level: str = "info", **fields: Any) -> None:
        record = {"ts": round(time.time(), 3), "level": level, "event": event}
        if self.node:
            record["node"] = self.node
        record.update({k: (v if isinstance(v, (str, int, float, bool, type(None))) else str(v))
                       for k, v in fields.items()})
        line = json.dumps(record, sort_keys=False)
        with self._lock:
            try:
                self.stream.write(line + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass
            if event == self.kill_after_event:
                os._exit(137)  # pylint: disable=protected-access
