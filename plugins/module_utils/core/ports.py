# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Core's ports: what it needs from the outside, as ``typing.Protocol`` classes.

The real adapters (``TPMDevice``, ``WireGuardVPN``, the stores of ``store.py``, ``kms.ClusterKMS``)
and the tests' fakes implement them. The transports (``rpc/``) implement the exchange ports
(``NodeClient``, ``JoinChannel``, ``TicketRequest``): the Core never imports a transport.
All are ``runtime_checkable`` so a test can check an implementation by ``isinstance``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol, Tuple, runtime_checkable

from ansible_collections.constellation.cluster.plugins.module_utils.kms import backends as kms_backends
from ansible_collections.constellation.cluster.plugins.module_utils.core.registry.peer_record import PeerRecord


@runtime_checkable
class TPM(Protocol):
    """The TPM operations the Core needs."""

    def mark_initialized(self, cluster_id: bytes) -> None:
        """Extends PCR 15 with the cluster ID (the node lock's point of no return)."""

    def pcr15(self) -> bytes:
        """The current value of PCR 15 (sha256 bank)."""


@runtime_checkable
class VPN(Protocol):
    """The VPN as the Core uses it: one interface, a full peer list."""

    vpn_cidr: str

    def setup(self, vpn_ip: str, priv_key: str, cluster_pod_cidr: Optional[str] = None) -> None:
        """Brings the interface up with this address and (base64) private key; with ``cluster_pod_cidr``, routes
        the cluster's pod range into it (docs/wireguard.md, "Pod CIDRs")."""

    def set_peers(self, records: List[PeerRecord], own_pub_key: str) -> bool:
        """Makes the peers exactly ``records`` (minus ourselves); True if anything changed."""


@runtime_checkable
class Store(Protocol):
    """A key-value store with transactions (``store.py``); ``state_store`` keeps the Core's records in it."""

    def get_default(self, key: str, default: Optional[bytes] = None) -> Optional[bytes]:
        """The value of ``key``, or ``default``."""

    def put(self, key: str, value: bytes) -> None:
        """Writes one key."""

    def update(self, fn: Callable[[Any], Any]) -> Any:
        """Runs ``fn(txn)`` in one transaction (re-run on a conflict) and returns its result."""

    def close(self) -> None:
        """Releases the store's connections."""


@runtime_checkable
class KMS(kms_backends.KMS, Protocol):
    """The cluster's KMS, any backend of the table (``kms.open_kms``): every secret the Core hands out is
    derived from it. The KMS protocol of ``kms/backends.py`` (``get_dek``); the named keys (cluster ID,
    measurement secret, state disk keys) are ``kms``'s functions over it (``kms/keys.py``)."""


@runtime_checkable
class AttestationValidator(Protocol):
    """Checks a node's attestation document (``attestation/``); ``validate`` raises AttestationError."""

    oid: str

    def validate(self, document: bytes, nonce: bytes) -> Any:
        """The validation result; its ``user_data`` is what the node bound into the document."""


@runtime_checkable
class NodeClient(Protocol):
    """A verified connection from the Coordinator to a node (a context manager)."""

    def __enter__(self) -> "NodeClient":
        """The connection is open."""

    def __exit__(self, *exc_info: Any) -> Any:
        """Closes the connection."""

    def attested_pcrs(self) -> Dict[int, bytes]:
        """The PCR values of the node's verified attestation on this connection."""

    def get_state(self) -> Dict[str, Any]:
        """The node's GetState answer (state, role, vpn_ip, vpn_pub_key, state_disk_uuid)."""

    def activate_as_node(self, params: Dict[str, Any], disk_key_for: Callable[[str, str], bytes]) -> Dict[str, Any]:
        """Runs the two steps of ActivateAsNode; the answer holds ``node_vpn_pub_key`` and
        ``state_disk_uuid``. ``disk_key_for(uuid, node_vpn_pub_key)`` is called between the steps (the node
        holds the node lock then) and returns the disk key for the UUID the node reports."""

    def activate_as_additional_coordinator(self, params: Dict[str, Any],
                                           secrets_for: Callable[[str, str], Dict[str, Any]],
                                           promote: Callable[[], None]) -> Dict[str, Any]:
        """Runs ActivateAsAdditionalCoordinator (core/cluster.py): ``secrets_for(uuid, vpn_pub_key)``
        records the new Coordinator and returns what it gets (KMS URI, etcd cluster); ``promote()`` runs
        once its etcd member started."""


@runtime_checkable
class ClusterStoreMember(Protocol):
    """The etcd member a Coordinator runs to share the cluster's state (``store/etcd_member.py``)."""

    def member_name(self, vpn_ip: str) -> str:
        """The member name of the Coordinator at ``vpn_ip``."""

    def peer_url(self, vpn_ip: str) -> str:
        """The member's peer URL (on the Coordinator's VPN IP)."""

    running: bool  # whether the member process this adapter started is alive

    def has_data(self) -> bool:
        """Whether the member ran before (a restart rejoins from its data)."""

    def start(self, vpn_ip: str, kms: Any, initial_cluster: Optional[str] = None) -> None:
        """Starts the member: a new cluster, or joining ``initial_cluster`` as a learner."""

    def open_store(self, vpn_ip: str) -> Any:
        """A store on the member, once it serves reads."""

    def stop(self) -> None:
        """Stops the member."""


ConnectNode = Callable[[str], NodeClient]
"""``connect_node(endpoint) -> NodeClient``: how the Coordinator reaches a node."""


@runtime_checkable
class JoinChannel(Protocol):
    """The Coordinator's side of one IssueJoinTicket exchange with a joining node."""

    peer_ip: str

    def user_data(self, node_vpn_pub_key: bytes, disk_uuid: str) -> bytes:
        """What the node's attestation must carry to be bound to this channel and request."""

    def challenge(self, nonce: bytes) -> Tuple[str, bytes]:
        """Sends the nonce; returns the node's (attestation variant OID, attestation document)."""

    def enroll_ak(self, challenge_for: Callable[[Dict[str, Any]], Dict[str, Any]]) -> bytes:
        """qemu-vtpm-ek: asks the node for its enrollment request (EK certificate, AK), sends the
        challenge ``challenge_for`` makes of it, returns the secret the node's TPM recovered."""

    def deliver(self, ticket: Any) -> None:
        """Sends the join ticket and waits for the node's confirmation (raises if it does not come)."""


TicketRequest = Callable[[str, bytes, Callable[[Mapping[str, Any], bytes], None]], Dict[str, Any]]
"""The joining node's side: ``request(disk_uuid, node_vpn_pub_key, on_ticket) -> the Coordinator's
answer``; it attests the node, calls ``on_ticket(ticket, binding)`` (``binding``: the user data its attestation
was bound to, which the Coordinators' signature covers; it locks and configures the node; raising
aborts the join), confirms, and raises ``errors.ConnectionLost`` if the Coordinator goes away."""


@runtime_checkable
class StateDiskPort(Protocol):
    """The encrypted state disk (disk/attach.py): the Core hands it the disk key when the key arrives (first
    activation, join, rejoin) and reports its status in GetState's details."""

    def key_arrived(self, key: bytes, disk_uuid: str, first: bool) -> None:
        """Formats (``first``, no header yet), opens and mounts the disk with ``key``; StateDiskError if refused."""

    def status(self) -> Dict[str, Any]:
        """``{"encrypted": bool, "device", "luks_uuid", "open": bool, "message"}``."""
