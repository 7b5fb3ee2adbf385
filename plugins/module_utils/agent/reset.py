# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""ResetAgent's side in the agent (agent/admin.py answers, reset.yml and remove_node.yml ask): the agent answers,
stops shortly after, its WireGuard interface goes, its state is wiped, and ``wiring.main`` starts it again fresh in
the same process. PCR 15 keeps the old cluster ID until a reboot (docs/site.md, "Reset hosts")."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from typing import Any, Callable, List

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, StateError


class AgentReset:
    """``request`` (the admin handler's ``reset``) and ``wipe`` (after the agent stopped)."""

    DELAY = 0.5  # the answer goes out before the servers stop

    def __init__(self, config: Any, vpn: Any, stop: threading.Event, log: Callable[..., None]):
        self.config = config
        self.vpn = vpn
        self._stop = stop
        self._log = log
        self.requested = False

    def paths(self) -> List[str]:
        """What a reset wipes: everything in the state directory (store, sealed storage key, disk key, disk UUID,
        warm interpreters, etcd member data) and a file store or disk UUID file kept elsewhere."""
        paths = [os.path.join(self.config.state_dir, name) for name in sorted(os.listdir(self.config.state_dir))]
        store = self.config.store or {}
        for extra in (store.get("path") if store.get("type", "file") == "file" else None, self.config.state_disk_uuid_file):
            if extra and os.path.lexists(extra) and os.path.abspath(extra) not in paths:
                paths.append(os.path.abspath(extra))
        return paths

    def request(self) -> List[str]:
        """Refused (StateError) with a state disk or an etcd store (their data is not this agent's to wipe);
        otherwise the agent stops shortly after the answer and ``daemon.main`` wipes and starts it again."""
        if self.config.state_disk_device:
            raise StateError("ResetAgent: this agent keeps its state on the state disk %s: wipe it by hand (docs/site.md, "
                             "reset.yml)" % self.config.state_disk_device)
        if (self.config.store or {}).get("type") == "etcd":
            raise StateError("ResetAgent: this agent keeps its state in an etcd cluster (store type etcd): not reset")
        self.requested = True
        timer = threading.Timer(self.DELAY, self._stop.set)
        timer.daemon = True
        timer.start()
        return self.paths()

    def wipe(self) -> List[str]:
        """After the agent stopped: the WireGuard interface goes, then the state. Returns what was removed."""
        removed = []
        with contextlib.suppress(ConstellationError):
            if self.vpn.teardown():
                removed.append("wireguard interface %s" % self.config.vpn_interface)
        for path in self.paths():
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            removed.append(path)
        self._log("agent_reset", level="warning", removed=removed,
                  message="PCR 15 keeps the old cluster ID until a reboot: activate this host again after one")
        return removed
