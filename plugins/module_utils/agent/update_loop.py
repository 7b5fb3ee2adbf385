# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The agent's one loop over its peer's state (docs/agent.md): a fresh node joins (``coordinator_public_endpoint``)
or, rebooted, rejoins; a Node finishes an interrupted activation, then asks its Coordinators for updates
(GetUpdate, long-polled where it can: agent/long_poll.py) and follows a newer measurements document; a Coordinator
sharing its state follows the shared store. Errors back off x2 up to min(30 s, 16 x the interval)."""

from __future__ import annotations

import threading
from typing import Optional

from ansible_collections.constellation.cluster.plugins.module_utils import atls
from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import AgentConfig
from ansible_collections.constellation.cluster.plugins.module_utils.agent.long_poll import LongPoll
from ansible_collections.constellation.cluster.plugins.module_utils.agent.measurement_policy import MeasurementPolicy
from ansible_collections.constellation.cluster.plugins.module_utils.agent.pubapi import join_cluster, rejoin_cluster
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import policy_version
from ansible_collections.constellation.cluster.plugins.module_utils.core import ROLE_NODE, Core, State
from ansible_collections.constellation.cluster.plugins.module_utils.core.accepted_measurements import MAX_DOCUMENT
from ansible_collections.constellation.cluster.plugins.module_utils.encoding import b64decode
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import ask_in_turn
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard.peer_auth import NodePeerAuth

MAX_BACKOFF = 30.0


class UpdateLoop:
    """``run`` until ``stop`` is set. ``node_auth``: the vpnapi's PeerAuth with this node's WireGuard key;
    ``long_poll``: the kept connection for GetUpdate (authenticated with ``node_auth``); ``issuer`` and
    ``peer_validator``: the agent's attestation for a join or rejoin."""

    def __init__(self, config: AgentConfig, core: Core, policy: MeasurementPolicy, issuer, peer_validator,
                 node_auth: NodePeerAuth, long_poll: LongPoll, stop: threading.Event, log):
        self.config = config
        self.core = core
        self.policy = policy
        self.issuer = issuer
        self.peer_validator = peer_validator
        self.node_auth = node_auth
        self.long_poll = long_poll
        self._stop = stop
        self.log = log
        self._update_from: Optional[str] = None  # the Coordinator VPN IP that answered the last GetUpdate
        self._refused_version: Optional[int] = None  # a document version this agent refused (logged once)

    def close(self) -> None:
        """Ends a held GetUpdate now."""
        self.long_poll.close()

    def run(self) -> None:
        """Nodes: join (if configured) while AcceptingInit, then poll GetUpdate with backoff."""
        failures = 0
        while not self._stop.is_set():
            state = self.core.state
            delay = self.config.update_interval
            try:
                if state == State.IS_NODE:
                    if self._update_once():
                        delay = 0.0  # a held long poll answered: ask again at once
                elif state == State.ACTIVATING_NODES and self.core.context.etcd_member is not None:
                    self._follow_measurements(self.core.accepted_measurements.version())  # another Coordinator set them
                    self.core.shared_store.supervise_etcd_member()  # its member died: started again, it rejoins
                    self.core.cluster.sync_coordinator_peers()  # another Coordinator may have changed the peers
                elif state == State.NODE_WAITING_FOR_CLUSTER_JOIN and self.core.context.coordinator_vpn_ip:
                    self._finish_activation_once()
                elif state == State.ACCEPTING_INIT and self.core.context.recovery_pending and self.core.role == ROLE_NODE:
                    # Rebooted: a rejoin ticket from the Coordinator, never the KMS URI.
                    delay = self.config.join_interval
                    self._rejoin_once()
                elif (state == State.ACCEPTING_INIT and self.config.coordinator_public_endpoint
                      and not self.core.context.recovery_pending):
                    delay = self.config.join_interval
                    self._join_once()
                failures = 0
            except (ConstellationError, OSError) as err:
                failures += 1
                cap = max(delay, min(MAX_BACKOFF, delay * 16))
                delay = min(delay * (2 ** min(failures, 8)), cap)
                self.log("loop_error", level="warning", state=state.wire_name, error=str(err)[:300],
                         retry_in=round(delay, 2))
            self._stop.wait(delay)

    def _follow_measurements(self, version: Optional[int]) -> None:
        """A newer document than ours (GetUpdate's version on a Node; the shared store on a further Coordinator).
        One this agent refuses (no valid signature, an older version) is logged once per version and never stops
        the peer updates."""
        if not version or version <= policy_version(self.policy.current()) or version == self._refused_version:
            return
        try:
            if self.core.state == State.IS_NODE:
                answer = self._ask_coordinators(lambda client: client.invoke("GetMeasurements"))
                answer["document"] = b64decode(answer["document"], "document", max_size=MAX_DOCUMENT)
            else:
                answer = self.core.accepted_measurements.stored() or {}
            if answer.get("document") is not None:
                self.policy.apply(answer["document"], answer.get("signature"))
        except InputError as err:
            self._refused_version = version
            self.log("measurements_refused", level="error", version=version, error=str(err)[:300])

    def _ask_coordinators(self, call):
        """``call(client)`` on the Coordinator that answered last; when it does not answer, on the next
        Coordinator this Node knows (several Coordinators on one etcd cluster answer alike)."""
        timeout = max(5.0, min(30.0, self.config.update_interval * 3))
        ips = self.core.recovery.coordinator_vpn_ips()
        if self._update_from in ips:
            start = ips.index(self._update_from)
            ips = ips[start:] + ips[:start]
        endpoint, answer = ask_in_turn(["%s:%d" % (ip, self.config.vpnapi_port) for ip in ips],  # PeerAuth, then call
                                       lambda c: call(self.node_auth.authenticate(c, self.core.context.node_state)), timeout)
        from_ip = endpoint.rsplit(":", 1)[0]
        if from_ip != (self._update_from or ips[0]):
            self.log("update_failover", coordinator_vpn_ip=from_ip, level="warning")
        self._update_from = from_ip
        return answer

    def _update_once(self) -> bool:
        """One GetUpdate: held on the kept connection to the Coordinator that answered last (agent/long_poll.py) where
        it can, else a poll (the fallback and the failover). True: a held long poll answered (ask again now)."""
        ip = self._update_from
        answer = (self.long_poll.get_update(ip, self.core.context.resource_version)
                  if ip is not None and ip in self.core.recovery.coordinator_vpn_ips() else None)
        if answer is None:
            answer = self._ask_coordinators(lambda client: client.get_update(self.core.context.resource_version))
        self.core.node.apply_update(answer)
        self._follow_measurements(answer.get("measurements_version"))
        return bool(answer.get("long_poll"))

    def _finish_activation_once(self) -> None:
        """An interrupted activation: our disk key from a Coordinator, through the WireGuard tunnel."""
        self.core.node.finish_activation(lambda: self._ask_coordinators(lambda client: client.get_state_disk_key()))

    def _rejoin_once(self) -> None:
        """A rebooted Node: a rejoin ticket from its Coordinator, or from the next one it knows."""
        port = atls.parse_endpoint(self.config.public_endpoint)[1]
        endpoints = [self.config.coordinator_public_endpoint] if self.config.coordinator_public_endpoint else [
            ("[%s]:%d" if ":" in ip else "%s:%d") % (ip, port) for ip in self.core.recovery.coordinator_public_ips()]
        if not endpoints:
            raise ConstellationError("rejoin: the stored peers do not name a Coordinator's public IP")
        result = rejoin_cluster(self.core.recovery, endpoints, [self.peer_validator], self.issuer)
        self.log("rejoined", node_vpn_ip=result.get("vpn_ip"), resource_version=result.get("resource_version"))

    def _join_once(self) -> None:
        result = join_cluster(self.core.node, self.config.coordinator_public_endpoint, [self.peer_validator],
                              self.issuer)
        self.log("joined", node_vpn_ip=result.get("node_vpn_ip"), resource_version=result.get("resource_version"))
