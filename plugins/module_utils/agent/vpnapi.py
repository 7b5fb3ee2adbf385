# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vpnapi (docs/protocol.md): served on the Coordinator's VPN IP only; a caller must come
from a known peer's VPN IP (the WireGuard tunnel authenticates that address) AND prove, once per
connection, the WireGuard private key the registry recorded for that address (``PeerAuth``,
wireguard/peer_auth.py): any other process on that Node (an unprivileged user, a hostNetwork pod)
gets nothing. Control-plane material goes only to peers the admin designated control planes;
GetDataKey IDs are namespaced per caller.

GetUpdate may be a long poll (docs/protocol.md): with ``wait`` the answer is held until the peer set's
version is not the caller's, the measurements version changes, or ``wait`` seconds passed; the caller is checked
again before anything is sent (an evicted peer gets AccessDenied, no peers)."""

from __future__ import annotations

import secrets
import time
from typing import Any, Dict, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.errors import AccessDenied, InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import schema
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import b64d, b64e
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import Connection
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import peer_auth

VPNAPI_PORT = 9027
KUBEADM_UNAVAILABLE = "kubeadm not available on the Coordinator"
MAX_WAIT = 60.0  # GetUpdate's ``wait``, at most
LOOK_AGAIN = 5.0  # a held GetUpdate looks at the measurements version (and a shared registry) this often


class VPNAPI:
    """The services (core/__init__.py; agent/wiring.py passes them): ``coordinator`` (registry, updates), ``peer_access``
    (PeerAuth, data keys), ``evictions``, ``kubernetes`` (join material; its ``kubeadm_provider``, None:
    GetJoinArgs and GetCertificateKey answer that kubeadm is not available here), ``activation``
    (GetStateDiskKey), ``accepted_measurements`` (GetMeasurements, GetUpdate's version)."""

    def __init__(self, log=None, *, coordinator=None, peer_access=None, evictions=None, kubernetes=None, activation=None,
                 accepted_measurements=None):
        # core/accepted_measurements.py (GetMeasurements, GetUpdate's version)
        self.accepted_measurements = accepted_measurements
        self.coordinator = coordinator
        self.peer_access = peer_access
        self.evictions = evictions
        self.kubernetes = kubernetes
        self.activation = activation
        self._log = log or (lambda event, **fields: None)

    @property
    def kubeadm(self):
        return getattr(self.kubernetes, "kubeadm_provider", None)

    def accept_check(self, peer: Tuple[str, int]) -> Optional[str]:
        if self.evictions.is_evicted(peer[0]):
            return "vpnapi: %s was evicted from this cluster" % peer[0]
        if not self.coordinator.is_known_peer_ip(peer[0]):
            return "vpnapi: %s is not a VPN peer of this cluster" % peer[0]
        return None

    def handlers(self) -> Dict[str, Any]:
        return {"PeerAuth": self.peer_auth, "GetUpdate": self.get_update, "GetJoinArgs": self.get_join_args,
                "GetCertificateKey": self.get_certificate_key, "GetDataKey": self.get_data_key,
                "GetStateDiskKey": self.get_state_disk_key, "GetMeasurements": self.get_measurements}

    # Every handler gets its request decoded by the server (schema.py records).
    def peer_auth(self, conn: Connection, request: schema.Empty) -> None:
        """A fresh challenge; the caller answers with the MAC only the holder of its WireGuard private key
        can make (wireguard/peer_auth.py), bound to this connection's two addresses and our key. The server
        refused an evicted caller before (the declaration: CALLER_VPN_PEER)."""
        challenge = secrets.token_bytes(peer_auth.CHALLENGE_SIZE)
        server_ip = conn.sock.getsockname()[0]
        conn.stream.send_msg({"challenge": b64e(challenge), "server_vpn_pub_key": self.peer_access.peer_auth_server_pub_key()})
        step = conn.recv_owed("the proof")  # a short deadline, replaceable meanwhile (rpc/server.py)
        proof = b64d(step.get("proof"), "proof", max_size=64)
        pub_key = self.peer_access.check_peer_proof(conn.peer_ip, server_ip, challenge, proof)
        if pub_key is None:
            self._log("peer_auth_refused", peer=conn.peer_ip)
            raise AccessDenied("PeerAuth: %s did not prove the WireGuard private key recorded for it at activation"
                               % conn.peer_ip)
        conn.vpn_peer_pub_key = pub_key  # rpc/server.py: now a peer's connection, never evicted by strangers
        conn.stream.send_result({"authenticated": True})

    # Every other handler runs only for a PeerAuth'd peer on an activated Coordinator (schema.py declares it, the
    # server checks it): ``conn.caller.vpn_pub_key`` is the key the caller proved.
    def get_update(self, conn: Connection, request: schema.GetUpdateRequest) -> None:
        if request.wait is not None:
            if not 0 < request.wait <= MAX_WAIT:
                raise InputError("wait", "seconds in (0, %g]" % MAX_WAIT, request.wait)
            self._hold(request.resource_version, float(request.wait))
            conn.caller.confirm()  # evicted (or another key) meanwhile: refused as the server refuses, nothing sent
        answer = self.coordinator.get_update(request.resource_version)
        version = self._measurements_version()
        if version:
            answer = dict(answer, measurements_version=version)
        if request.wait is not None:
            answer["long_poll"] = True
        conn.stream.send_result(answer)

    def _measurements_version(self) -> int:
        return self.accepted_measurements.version() if self.accepted_measurements is not None else 0

    def _hold(self, resource_version: int, wait: float) -> None:
        """Until the peer set is not at ``resource_version`` (at once if it is not now), the measurements version
        changes, or ``wait`` seconds passed. Sleeps on the registry (core/registry/cache.py); looks at the
        measurements version every LOOK_AGAIN seconds."""
        if not isinstance(resource_version, int) or isinstance(resource_version, bool):
            return  # GetUpdate says what is wrong
        deadline = time.monotonic() + wait
        measurements = self._measurements_version()
        while True:
            if self.coordinator.peer_version() != resource_version:
                return
            left = deadline - time.monotonic()
            if left <= 0 or self._measurements_version() != measurements:
                return
            self.coordinator.wait_for_update(resource_version, min(left, LOOK_AGAIN))

    def _kubeadm(self, method: str, conn: Connection) -> str:
        if self.kubeadm is None:
            raise StateError("%s: %s" % (method, KUBEADM_UNAVAILABLE))
        return conn.caller.vpn_pub_key

    def get_join_args(self, conn: Connection, request: schema.GetJoinArgsRequest) -> None:
        """A fresh token per call; the kubelet certificate only for the caller's own VPN IP; the PKI files
        only for a designated control plane."""
        pub_key = self._kubeadm("GetJoinArgs", conn)
        args = self.kubernetes.kubernetes_join_for(conn.peer_ip, "GetJoinArgs", request.certificate_request,
                                                   bool(request.is_control_plane), vpn_pub_key=pub_key)
        conn.stream.send_result(schema.GetJoinArgsAnswer.decode(args).encode())

    def get_certificate_key(self, conn: Connection, request: schema.Empty) -> None:
        pub_key = self._kubeadm("GetCertificateKey", conn)
        conn.stream.send_result({"certificate_key": self.kubernetes.kubernetes_certificate_key_for(
            conn.peer_ip, vpn_pub_key=pub_key)})

    def get_data_key(self, conn: Connection, request: schema.GetDataKeyRequest) -> None:
        pub_key = conn.caller.vpn_pub_key
        length = 32 if request.length is None else request.length
        key = self.peer_access.get_data_key(request.data_key_id, length, pub_key)  # namespaced: peer/<pub_key>/<id>
        self._log("data_key", peer=conn.peer_ip, data_key_id=request.data_key_id)
        conn.stream.send_result({"data_key": b64e(key)})

    def get_state_disk_key(self, conn: Connection, request: schema.Empty) -> None:
        # The caller proved its WireGuard key (the server checked it): a node gets only its own key.
        conn.stream.send_result({"state_disk_key": b64e(self.activation.node_state_disk_key(conn.peer_ip))})

    def get_measurements(self, conn: Connection, request: schema.Empty) -> None:
        """The accepted measurement sets, for a peer that proved its WireGuard key (the document is public; the
        node checks its signature with its own pinned key)."""
        answer = self.accepted_measurements.get_measurements()
        conn.stream.send_result(schema.GetMeasurementsAnswer(**answer).encode())
