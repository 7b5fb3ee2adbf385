# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node agent's life cycle (docs/agent.md): ``start`` restores the Core's state, says what is insecure, opens
the public listeners and starts the update loop; once the peer is an activated Coordinator it opens the vpnapi and
re-attests its Nodes; ``stop`` ends all of it. agent/wiring.py builds every collaborator and passes it here.

Threads, all bounded: one accept thread per listener, one thread per connection (at most 64),
one update/join loop, one re-attestation loop (a Coordinator). SIGTERM stops the listeners and loops
(agent/wiring.py ``main``)."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, List, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import deployment
from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import AgentConfig
from ansible_collections.constellation.cluster.plugins.module_utils.agent.remote_exec import RemoteExec
from ansible_collections.constellation.cluster.plugins.module_utils.agent.reset import AgentReset
from ansible_collections.constellation.cluster.plugins.module_utils.agent.update_loop import UpdateLoop
from ansible_collections.constellation.cluster.plugins.module_utils.core import Core, State
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import AgentServerContext, FrameServer


class Agent:
    """``listeners``: opens the servers when their time comes (``serve_public`` at start, ``serve_vpnapi`` and
    ``reattest_loop`` once this peer is an activated Coordinator: agent/wiring.py ``Listeners``). ``stop``: the
    event every loop of this agent waits on (ResetAgent sets it too)."""

    def __init__(self, config: AgentConfig, log, core: Core, store: Any, state_disk: Any, listeners: Any,
                 update_loop: UpdateLoop, remote_exec: RemoteExec, reset: AgentReset, issuer: Any,
                 tls: AgentServerContext, stop: threading.Event):
        self.config = config
        self.log = log
        self.core = core
        self.store = store
        self.state_disk = state_disk
        self.listeners = listeners
        self.update_loop = update_loop
        self.remote_exec = remote_exec
        self.reset = reset
        self.issuer = issuer
        self.tls = tls
        self._stop = stop
        self._threads: List[threading.Thread] = []
        self.servers: List[Any] = []
        self.vpnapi_server: Optional[FrameServer] = None
        self._vpnapi_lock = threading.Lock()
        self._reattest_started = False
        core.context.on_state_change(self._on_state)

    def start(self) -> "Agent":
        if self.state_disk is not None:
            self.state_disk.at_boot()  # before the store is read: the store is on the disk
        state = self.core.recovery.load()
        if self.state_disk is not None:
            self.state_disk.after_load(bool(self.core.context.node_state), self.core.context.disk_uuid)
        self._log_start()
        self.log("agent_started", state=state.wire_name, role=self.core.role, disk_uuid=self.core.context.disk_uuid,
                 failure=self.core.context.failure)
        self._log_insecure()
        self.servers.extend(self.listeners.serve_public())
        self._spawn("loop", self.update_loop.run)
        return self

    def _log_start(self) -> None:
        for deprecation in self.config.deprecations:
            self.log("config_deprecated", level="warning", message=deprecation)

    def _log_insecure(self) -> None:
        """What this configuration leaves insecure, said on every start."""
        config = self.config
        if config.init_secret_hash is None:  # insecure_unauthenticated_activation
            self.log("init_secret_not_configured", level="warning", message="no init_secret_hash: anyone can activate this node")
        if choose.insecure_warning(config.variant):  # insecure_trust_any_ak
            self.log("insecure_variant", level="warning", message=choose.insecure_warning(config.variant))
        if (config.store or {}).get("type") == "etcd":
            self.log("secrets_not_sealed", level="warning", message="store type etcd: this peer's secrets are kept "
                     "in that etcd cluster, not sealed to this TPM")
        if config.measurements_pub_key is None and config.measurements:  # insecure_unsigned_measurements
            self.log("measurements_unsigned", level="warning", message="insecure_unsigned_measurements: no "
                     "measurements_pub_key, the policy file is used without a signature check")
        if deployment.warning(config.deployment_mode):
            self.log("host_root_trusted", level="warning", deployment_mode=config.deployment_mode,
                     message=deployment.warning(config.deployment_mode))

    def _spawn(self, name: str, target) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _on_state(self, state: State) -> None:
        if state == State.ACTIVATING_NODES:
            self._start_vpnapi()
            self._start_reattest()

    def _start_reattest(self) -> None:
        """The Coordinator re-attests every Node each ``reattest_interval`` (core/eviction/peer_trust.py)."""
        with self._vpnapi_lock:
            if self._reattest_started or self._stop.is_set() or not self.config.reattest_interval:
                return
            self._reattest_started = True
        self._spawn("reattest", self.listeners.reattest_loop().run)

    def _start_vpnapi(self) -> None:
        with self._vpnapi_lock:
            if self.vpnapi_server is not None or self._stop.is_set():
                return
            self.vpnapi_server = self.listeners.serve_vpnapi()
            self.servers.append(self.vpnapi_server)

    def request_stop(self) -> None:
        """Ends ``wait`` (SIGTERM, SIGINT); ``stop`` then stops everything."""
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        self.update_loop.close()  # ends a held GetUpdate now
        for server in list(self.servers):
            server.stop()
        for thread in self._threads:
            thread.join(timeout=5)
        self.tls.close()
        close = getattr(self.issuer, "close", None)
        if close is not None:
            close()
        self.remote_exec.close()  # the warm interpreters
        for store in {id(s): s for s in (self.store, self.core.context.store)}.values():  # local, and etcd's
            with contextlib.suppress(ConstellationError):
                store.close()
        if self.core.context.etcd_member is not None:
            self.core.context.etcd_member.stop()
        self.log("agent_stopped")

    def wait(self) -> None:
        while not self._stop.is_set():
            self._stop.wait(1.0)
