# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Recovery of a peer whose TPM was reset (reboot) while its store holds a cluster's state:

* the Coordinator proves, with the KMS URI from the admin (``Recover``, recover.yml), that the cluster
  is its own, takes the node lock again and resumes;
* a Node never gets the KMS URI: it pulls a rejoin ticket from its Coordinator (``IssueRejoinTicket``
  over aTLS: it verifies the Coordinator, the Coordinator attests it in-band and checks its recorded
  identity) holding only its disk key, the measurement secret and its peers (``rejoin``)."""

from __future__ import annotations

import hmac
import ipaddress
from typing import Any, Callable, Dict, List, Mapping, Optional

from ansible_collections.constellation.cluster.plugins.module_utils import kms as kms_mod
from ansible_collections.constellation.cluster.plugins.module_utils.core import signing
from ansible_collections.constellation.cluster.plugins.module_utils.core.base import CoreBase
from ansible_collections.constellation.cluster.plugins.module_utils.core.inputs import open_kms
from ansible_collections.constellation.cluster.plugins.module_utils.core.records import RejoinTicket
from ansible_collections.constellation.cluster.plugins.module_utils.core.state import ROLE_COORDINATOR, ROLE_NODE
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    REASON_NOT_WAITING_FOR_RECOVERY,
    AccessDenied,
    StateError,
)

# Requests a rejoin ticket: (vpn_ip, vpn_pub_key, disk_uuid, on_ticket) -> the Coordinator's END result;
# ``on_ticket(ticket, binding)``: the ticket as received and the user data our attestation was bound to.
RejoinRequest = Callable[[str, str, str, Callable[[Mapping[str, Any]], None]], Dict[str, Any]]


class Recovery(CoreBase):
    def _require_recovery(self, method: str) -> None:
        if not self.recovery_pending:
            raise StateError("%s is allowed only on a node whose stored state waits for recovery (PCR 15 reset); "
                             "this node is %s" % (method, self._state.wire_name)).with_reason(
                                 REASON_NOT_WAITING_FOR_RECOVERY)

    def recover(self, kms_uri: str) -> Dict[str, Any]:
        method = "Recover"
        self._require_recovery(method)
        node = self._stored_node()
        if node.role != ROLE_COORDINATOR:
            # Least secret: only the Coordinator ever holds the KMS URI (docs/agent.md, "Rejoin after a reboot").
            raise StateError("%s: a Node does not take the KMS URI; it rejoins with a ticket from its Coordinator "
                             "(IssueRejoinTicket), by itself" % method)
        kms = open_kms(kms_uri)
        cluster_id = kms.cluster_id(node.measurement_salt)
        if not hmac.compare_digest(cluster_id, node.cluster_id):
            raise StateError("%s: the KMS URI does not derive this node's cluster ID" % method)
        self._take_lock(cluster_id, method)
        try:
            self.recovery_pending = False
            self._resume()
        except BaseException as err:
            self._fail(method, err)
            raise
        return self.get_state()

    def coordinator_public_ip(self) -> Optional[str]:
        """Where a rebooted Node finds its Coordinator: the public IP of the stored peer at its
        ``coordinator_vpn_ip``."""
        node = self._node
        if node is None:
            return None
        found = next((p for p in node.peers or () if p.vpn_ip == node.coordinator_vpn_ip), None)
        return found.public_ip if found is not None else None

    def coordinator_public_ips(self) -> List[str]:
        """Where a rebooted Node asks for a rejoin ticket, in turn: its own Coordinator's public IP, then
        those of the other Coordinators it knows (several Coordinators on one etcd cluster)."""
        node = self._node
        if node is None:
            return []
        own = self.coordinator_public_ip()
        others = [p.public_ip for p in sorted(node.peers or (), key=lambda p: int(ipaddress.ip_address(p.vpn_ip)))
                  if p.role == ROLE_COORDINATOR and p.public_ip]
        return list(dict.fromkeys(([own] if own else []) + others))

    def coordinator_vpn_ips(self) -> List[str]:
        """Where a Node asks for updates, in turn: its own Coordinator first, then every other peer with
        the Coordinator role it knows from its updates (several Coordinators on one etcd cluster)."""
        node = self._node
        if node is None or not node.coordinator_vpn_ip:
            return []
        others = sorted((p.vpn_ip for p in node.peers or ()
                         if p.role == ROLE_COORDINATOR and p.vpn_ip != node.coordinator_vpn_ip),
                        key=lambda a: int(ipaddress.ip_address(a)))
        return [node.coordinator_vpn_ip] + others

    def rejoin(self, request_ticket: RejoinRequest) -> Dict[str, Any]:
        """A rebooted Node: ``request_ticket`` reaches its (verified) Coordinator, which attests us and
        hands over a ``RejoinTicket``; we check it (the measurement secret derives our stored cluster ID,
        the disk key is the one we hold, if we hold one), take the node lock again and resume."""
        method = "Rejoin"
        self._require_recovery(method)
        node = self._stored_node()
        if node.role != ROLE_NODE:
            raise StateError("%s: only a Node rejoins with a ticket; a Coordinator recovers with the KMS URI "
                             "(recover.yml)" % method)
        outcome: Dict[str, Any] = {}

        def on_ticket(data: Mapping[str, Any], binding: Optional[bytes] = None) -> None:
            ticket = RejoinTicket.from_dict(data)
            # The measurement secret is every Node's: only the Coordinators' signature, with the key pinned at
            # our activation and bound to this request and connection, says a Coordinator sent these peers.
            try:
                if binding is None:
                    raise AccessDenied("%s: the ticket is not bound to this connection: refused" % method)
                signing.verify(node.coordinator_pub_key, signing.CONTEXT_REJOIN_TICKET,
                               signing.ticket_payload(ticket.to_dict(), binding), ticket.signature, method + " ticket")
            except AccessDenied as err:
                self._log("rejoin_ticket_refused", level="warning", reason=str(err)[:300])
                raise
            derived = kms_mod.derive_cluster_id(ticket.measurement_secret, node.measurement_salt)
            if not hmac.compare_digest(derived, node.cluster_id):
                raise StateError("%s: the ticket's measurement secret does not derive this node's cluster ID" % method)
            held = self.read_disk_key()
            if held is not None and not hmac.compare_digest(held, ticket.state_disk_key):
                raise StateError("%s: the ticket's disk key is not this node's" % method)
            self._take_lock(node.cluster_id, method)
            try:
                self.recovery_pending = False
                if held is None:
                    self._keep_disk_key(ticket.state_disk_key, first=False)
                self._save_node(peers=tuple(ticket.peers), resource_version=ticket.resource_version)
                self._resume()
            except BaseException as err:
                self._fail(method, err)
                raise
            self._log("node_rejoined", node_vpn_ip=node.vpn_ip, resource_version=ticket.resource_version)
            outcome.update(self.get_state())

        result = request_ticket(node.vpn_ip, self.vpn_pub_key, node.disk_uuid or self.disk_uuid, on_ticket)
        outcome["resource_version"] = result.get("resource_version")
        return outcome
