# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vpnapi (docs/protocol.md): served on the Coordinator's VPN IP only; a caller must come
from a known peer's VPN IP (the WireGuard tunnel authenticates that address)."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.errors import AccessDenied, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import schema
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import b64e
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import Connection

VPNAPI_PORT = 9027
KUBEADM_UNAVAILABLE = "kubeadm not available on the Coordinator"


class VPNAPI:
    """``kubeadm``: the Coordinator's kubeadm provider (``kubeadm/join_provider.py``); it becomes the Core's
    (``core/kubernetes.py`` decides who gets what). None: GetJoinArgs and GetCertificateKey answer that
    kubeadm is not available here."""

    def __init__(self, core, kubeadm=None, log=None):
        self.core = core
        if kubeadm is not None:
            core.kubeadm_provider = kubeadm
        self._log = log or (lambda event, **fields: None)

    @property
    def kubeadm(self):
        return getattr(self.core, "kubeadm_provider", None)

    def accept_check(self, peer: Tuple[str, int]) -> Optional[str]:
        if self.core.is_evicted(peer[0]):
            return "vpnapi: %s was evicted from this cluster" % peer[0]
        if not self.core.is_known_peer_ip(peer[0]):
            return "vpnapi: %s is not a VPN peer of this cluster" % peer[0]
        return None

    def _not_evicted(self, conn: Connection, method: str) -> None:
        """An eviction may come while a connection is open: every request checks again (O(1))."""
        self.core.require_not_evicted(conn.peer_ip, method)

    def handlers(self) -> Dict[str, Any]:
        return {"GetUpdate": self.get_update, "GetJoinArgs": self.get_join_args,
                "GetCertificateKey": self.get_certificate_key, "GetDataKey": self.get_data_key,
                "GetStateDiskKey": self.get_state_disk_key}

    # Every handler gets its request decoded by the server (schema.py records).
    def get_update(self, conn: Connection, request: schema.GetUpdateRequest) -> None:
        self._not_evicted(conn, "GetUpdate")
        conn.stream.send_result(self.core.get_update(request.resource_version))

    def _kubeadm(self, method: str, conn: Connection) -> None:
        self.core.require_coordinator(method)
        self._not_evicted(conn, method)
        if not self.core.is_known_peer_ip(conn.peer_ip):  # removed since the connection was accepted
            raise AccessDenied("%s: %s is not a VPN peer of this cluster" % (method, conn.peer_ip))
        if self.kubeadm is None:
            raise StateError("%s: %s" % (method, KUBEADM_UNAVAILABLE))

    def get_join_args(self, conn: Connection, request: schema.GetJoinArgsRequest) -> None:
        """A fresh token per call; the kubelet certificate only for the caller's own VPN IP."""
        self._kubeadm("GetJoinArgs", conn)
        args = self.core.kubernetes_join_for(conn.peer_ip, "GetJoinArgs", request.certificate_request,
                                             bool(request.is_control_plane))
        conn.stream.send_result(schema.GetJoinArgsAnswer.decode(args).encode())

    def get_certificate_key(self, conn: Connection, request: schema.Empty) -> None:
        self._kubeadm("GetCertificateKey", conn)
        conn.stream.send_result({"certificate_key": self.core.kubernetes_certificate_key_for(conn.peer_ip)})

    def get_data_key(self, conn: Connection, request: schema.GetDataKeyRequest) -> None:
        self._not_evicted(conn, "GetDataKey")
        length = 32 if request.length is None else request.length
        key = self.core.get_data_key(request.data_key_id, length)
        self._log("data_key", peer=conn.peer_ip, data_key_id=request.data_key_id)
        conn.stream.send_result({"data_key": b64e(key)})

    def get_state_disk_key(self, conn: Connection, request: schema.Empty) -> None:
        # The WireGuard tunnel authenticates the caller's VPN IP: a node gets only its own key.
        self._not_evicted(conn, "GetStateDiskKey")
        conn.stream.send_result({"state_disk_key": b64e(self.core.node_state_disk_key(conn.peer_ip))})
