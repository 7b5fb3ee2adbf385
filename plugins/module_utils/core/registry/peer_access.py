# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who gets what from the Coordinator: the vpnapi's caller authentication
(PeerAuth: proof of the WireGuard private key the registry recorded for the caller's VPN IP,
wireguard/peer_auth.py), the admin's control-plane designation, GetDataKey's per-caller namespace, and
the ownership of disk UUIDs (a UUID belongs to the first peer recorded with it)."""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, Any, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils import kms as kms_mod
from ansible_collections.constellation.cluster.plugins.module_utils.core.records import node_records
from ansible_collections.constellation.cluster.plugins.module_utils.core.state import ROLE_COORDINATOR
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AccessDenied, InputError
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_record import PeerRecord
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import peer_auth

if TYPE_CHECKING:  # pragma: no cover
    from ansible_collections.constellation.cluster.plugins.module_utils.core.context import PeerContext

# GetDataKey never hands out these: they are given only to whom they belong, at activation.
RESERVED_DATA_KEY_IDS = frozenset((kms_mod.MEASUREMENT_SECRET_KEY_ID, kms_mod.EMERGENCY_SSH_CA_KEY_ID,
                                   kms_mod.CLUSTER_ID_KEY_ID, kms_mod.COORDINATOR_SIGNING_KEY_ID))

DATA_KEY_NAMESPACE = "peer/%s/"


def data_key_namespace(vpn_pub_key: str) -> str:
    """The prefix of a peer's GetDataKey IDs: its WireGuard public key (the identity PeerAuth proved;
    stable across restarts and rejoins, and never handed to another peer, unlike a VPN IP)."""
    return DATA_KEY_NAMESPACE % vpn_pub_key


def refuse_control_plane_join(method: str, is_control_plane: Any) -> None:
    """The join service never hands out control-plane material: a control plane is designated by the
    admin (ActivateAdditionalNodes' control_plane_endpoints), not by the node that asks."""
    if is_control_plane:
        raise AccessDenied("%s: is_control_plane: a node cannot designate itself a control plane; the admin "
                           "designates control planes when activating them (activate_nodes "
                           "control_plane_public_endpoints)" % method)


class PeerAccess:
    """The Coordinator's answers on who gets what, over the peer's ``PeerContext``."""

    def __init__(self, context: PeerContext):
        self.context = context
        self._peer_auth_cache: Optional[Tuple[str, peer_auth.PairKeys]] = None

    def vpn_peer_record(self, vpn_ip: str) -> Optional[PeerRecord]:
        """The registry's record of the peer at ``vpn_ip`` (from memory), or None."""
        registry = self.context.peer_registry.current()
        return registry.peers.get(vpn_ip) if registry is not None else None

    def _pair_keys(self) -> peer_auth.PairKeys:
        """This Coordinator's pair keys with its peers (wireguard/peer_auth.py), made once per WireGuard key."""
        priv_key = self.context.stored_node().vpn_priv_key
        cached = self._peer_auth_cache
        if cached is None or cached[0] != priv_key:
            cached = (priv_key, peer_auth.PairKeys(priv_key))
            self._peer_auth_cache = cached
        return cached[1]

    def peer_auth_server_pub_key(self) -> str:
        return self._pair_keys().own_pub_key

    def check_peer_proof(self, peer_ip: str, server_ip: str, challenge: bytes, proof: bytes) -> Optional[str]:
        """PeerAuth (vpnapi): the caller at ``peer_ip`` proved the WireGuard private key of the public key the
        registry recorded for that address at its activation. Returns that public key, or None."""
        self.context.require_coordinator("PeerAuth")
        record = self.vpn_peer_record(peer_ip)
        if record is None:
            return None
        if not self._pair_keys().check(record.vpn_pub_key, proof, challenge, peer_ip, server_ip):
            return None
        return record.vpn_pub_key

    def is_designated_control_plane(self, vpn_ip: str, vpn_pub_key: str) -> bool:
        """Whether the admin designated the peer at ``vpn_ip`` (with this WireGuard key) a control plane:
        a Coordinator always is (it holds the KMS URI); a Node only if its activation said so
        (``node_records.load_control_plane``, bound to its key so that a reused VPN IP inherits nothing)."""
        record = self.vpn_peer_record(vpn_ip)
        if record is None or record.vpn_pub_key != vpn_pub_key:
            return False
        if record.role == ROLE_COORDINATOR:
            return True
        designated = node_records.load_control_plane(self.context.store, vpn_ip)
        return designated is not None and hmac.compare_digest(designated.encode("ascii"), vpn_pub_key.encode("ascii"))

    def claim_disk_uuid(self, disk_uuid: str, vpn_ip: str, vpn_pub_key: str, method: str) -> None:
        """A disk UUID belongs to the first peer recorded with it (by its WireGuard key): recorded with the
        node's disk UUID in one store transaction (node_records.claim_disk_uuid). AccessDenied naming the
        UUID when another peer holds it: its disk key is never derived for anyone else."""
        owner = self._own_disk(disk_uuid, vpn_pub_key)
        if owner is None:
            owner = node_records.claim_disk_uuid(self.context.store, disk_uuid, vpn_ip, vpn_pub_key)
        if owner is not None:
            self.context.log("disk_uuid_refused", node_vpn_ip=vpn_ip, disk_uuid=disk_uuid, owner_vpn_ip=owner)
            raise AccessDenied("%s: disk UUID %s is taken (it belongs to another peer, %s)" % (method, disk_uuid, owner))

    def require_disk_uuid_free(self, disk_uuid: str, vpn_pub_key: str, method: str) -> None:
        """Refuses early (AccessDenied naming the UUID) a disk UUID that belongs to a peer other than
        the one with ``vpn_pub_key``; ``claim_disk_uuid`` decides for good, in a transaction."""
        owner = node_records.disk_uuid_owner(self.context.store, disk_uuid)
        if owner is not None and owner.get("vpn_pub_key") != vpn_pub_key:
            raise AccessDenied("%s: disk UUID %s is taken (it belongs to another peer, %s)"
                               % (method, disk_uuid, owner.get("vpn_ip")))
        mine = self._own_disk(disk_uuid, vpn_pub_key)
        if mine is not None:
            raise AccessDenied("%s: disk UUID %s is taken (it belongs to another peer, %s)" % (method, disk_uuid, mine))

    def _own_disk(self, disk_uuid: str, vpn_pub_key: str) -> Optional[str]:
        """This Coordinator's VPN IP if ``disk_uuid`` is its own disk and ``vpn_pub_key`` another peer's key
        (a Coordinator activated before ownership records existed has none for its own disk)."""
        node = self.context.node
        if node is None or disk_uuid != self.context.disk_uuid or node.role != ROLE_COORDINATOR:
            return None
        return None if vpn_pub_key == self.context.vpn_pub_key else node.vpn_ip

    def get_data_key(self, data_key_id: Any, length: Any, caller_vpn_pub_key: Optional[str] = None) -> bytes:
        """A data key for the caller: derived for ``peer/<caller's WireGuard public key>/<data_key_id>``
        (docs/protocol.md), so no peer can ask for another's keys. ``caller_vpn_pub_key`` None: the
        Coordinator's own namespace (its key), never a bare ID."""
        kms = self.context.require_coordinator("GetDataKey")
        if not isinstance(data_key_id, str) or not data_key_id:
            raise InputError("data_key_id", "a non-empty key ID")
        if data_key_id in RESERVED_DATA_KEY_IDS:
            raise InputError("data_key_id", "an ID other than %s (reserved)" % ", ".join(sorted(RESERVED_DATA_KEY_IDS)),
                             data_key_id)
        try:
            kms_mod.state_disk_key_id(data_key_id)
        except InputError:
            pass
        else:
            raise InputError("data_key_id", "no disk UUID (state disk keys go only to their node)", data_key_id)
        if not isinstance(length, int) or isinstance(length, bool) or not 1 <= length <= 64:
            raise InputError("length", "an integer in 1..64", length)
        return kms_mod.derive_key(kms, data_key_namespace(caller_vpn_pub_key or self.context.vpn_pub_key) + data_key_id, length)
