# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who may call an RPC method and in which states: part of its registration (``schema.Method(..., access=)``),
enforced by the server (``server.FrameServer``) before the handler runs, so that no handler has to remember it.

A declaration names a caller (``CALLER_*``: what the connection must have proven) and where the method is
served (``SERVED_*``: the peer's states or role). The server learns what the connection proved from the
``Connection`` (``admin``: AdminAuth; ``vpn_peer_pub_key``: the key PeerAuth proved) and the peer's
state from a ``PeerView`` the agent's wiring gives it (agent/peer_view.py reads the Core): this module imports
neither the Core nor the agent. ``authorise`` returns the authenticated ``Caller``, which the server hands the
handler (``conn.caller``): a handler reads who called from it and checks nothing itself.

The init secret's proof travels in the request (ActivateAsCoordinator's ``init_secret``, ActivateAsNode's
``init_proof``) and is checked by the Core before the node lock (docs/protocol.md, "Who may call"): the
declaration ``CALLER_INIT_SECRET`` says so, the server lets the request through to the Core.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ansible_collections.constellation.cluster.plugins.module_utils import constants
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AccessDenied, StateError

# Who may call (what the connection must have proven before the handler runs).
CALLER_ANYONE = "anyone"
CALLER_INIT_SECRET = "init-secret proof"  # in the request: checked by the Core before the node lock
CALLER_ADMIN = "admin"  # AdminAuth with the admin key pinned at activation, on this connection
CALLER_COORDINATORS = "Coordinators"  # AdminAuth role coordinator (the Coordinators' key): GetState's details only
# From a VPN peer's address (the vpnapi admits known peers' VPN IPs only), not evicted: what PeerAuth itself needs.
CALLER_VPN_PEER = "VPN peer"
CALLER_PEER = "PeerAuth'd peer"  # PeerAuth: the WireGuard key recorded for the caller's VPN IP, on this connection
# A PeerAuth'd peer that is not unverified (its last re-attestation passed): what a new secret needs.
CALLER_VERIFIED_PEER = "verified peer"
CALLER_CONTROL_PLANE = "designated control plane"  # a verified peer the admin designated a control plane
CALLERS = (CALLER_ANYONE, CALLER_INIT_SECRET, CALLER_ADMIN, CALLER_COORDINATORS, CALLER_VPN_PEER, CALLER_PEER,
           CALLER_VERIFIED_PEER, CALLER_CONTROL_PLANE)
# The callers that must have proven a peer's WireGuard key on the connection (PeerAuth), and the admin key (AdminAuth).
PEER_CALLERS = (CALLER_PEER, CALLER_VERIFIED_PEER, CALLER_CONTROL_PLANE)
ADMIN_CALLERS = (CALLER_ADMIN,)

# Where the method is served (the peer's state or role).
SERVED_ALWAYS = "any state"
SERVED_ACCEPTING_INIT = "AcceptingInit only"
SERVED_ACTIVATED = "activated"  # ActivatingNodes or IsNode
SERVED_ADMIN_KEY_PINNED = "admin key pinned"  # activated, NodeWaitingForClusterJoin, or rebooted holding its state
SERVED_COORDINATOR = "activated Coordinator only"  # ActivatingNodes
SERVED = (SERVED_ALWAYS, SERVED_ACCEPTING_INIT, SERVED_ACTIVATED, SERVED_ADMIN_KEY_PINNED, SERVED_COORDINATOR)

ACTIVATED_STATES = (constants.STATE_ACTIVATING_NODES, constants.STATE_IS_NODE)

_NEEDS = {
    CALLER_ADMIN: "AdminAuth (the admin key pinned at activation)",
    CALLER_PEER: "PeerAuth (the WireGuard key recorded for the caller's VPN IP)",
    CALLER_VERIFIED_PEER: "PeerAuth by a peer whose last re-attestation passed (not unverified)",
    CALLER_CONTROL_PLANE: "PeerAuth by a peer the admin designated a control plane",
}


@dataclass(frozen=True)
class Access:
    """One method's declaration: ``caller`` (CALLER_*), ``served`` (SERVED_*), and ``note``: what the Core still
    decides on the request's data (e.g. the init proof, the attestation), for the docs."""

    caller: str
    served: str
    note: str = ""

    def __post_init__(self):
        if self.caller not in CALLERS:
            raise ValueError("access: caller %r is not one of %s" % (self.caller, ", ".join(CALLERS)))
        if self.served not in SERVED:
            raise ValueError("access: served %r is not one of %s" % (self.served, ", ".join(SERVED)))

    def who(self) -> str:
        """The docs' "who may call" cell."""
        return "%s (%s)" % (self.caller, self.note) if self.note else self.caller


@dataclass(frozen=True)
class Caller:
    """Who the server authenticated for the current request, as the method's declaration asks: the server hands it
    to the handler (``conn.caller``). ``vpn_pub_key``: the WireGuard key the caller proved (PeerAuth), for the
    methods that declare a peer; ``admin``/``coordinator``: what AdminAuth proved on this connection."""

    peer_ip: str
    vpn_pub_key: Optional[str] = None
    admin: bool = False
    coordinator: bool = False
    # The declaration's check again, for a request held a while (a long poll): the caller may have been evicted or
    # removed meanwhile. Raises as the server's check does.
    confirm: Callable[[], Any] = field(default=lambda: None, repr=False, compare=False)


class PeerView:
    """What the server asks about this peer before a handler runs; the agent's wiring gives one over its Core
    (agent/peer_view.py). The ``check_*`` methods raise the Core's own error (AccessDenied, with its reason)."""

    def state(self) -> str:
        """The peer's state (its wire name, constants.STATE_*)."""
        raise NotImplementedError

    def admin_key_pinned(self) -> bool:
        """An admin key is pinned: activated, waiting for its join, or rebooted holding a cluster's state."""
        raise NotImplementedError

    def check_not_evicted(self, method: str, peer_ip: str) -> None:
        """The caller's VPN IP is not evicted (an eviction may come while a connection is open)."""
        raise NotImplementedError

    def check_peer(self, method: str, peer_ip: str, vpn_pub_key: str) -> None:
        """The caller proved ``vpn_pub_key`` for ``peer_ip`` (PeerAuth): it is still that peer, not evicted."""
        raise NotImplementedError

    def check_verified(self, method: str, peer_ip: str) -> None:
        """The caller is not unverified: its last re-attestation passed (a new secret goes only to such a peer)."""
        raise NotImplementedError

    def check_control_plane(self, method: str, peer_ip: str, vpn_pub_key: str) -> None:
        """The caller is a peer the admin designated a control plane."""
        raise NotImplementedError


def _served(method: str, served: str, view: Optional[PeerView]) -> None:
    if served == SERVED_ALWAYS:
        return
    if view is None:  # fail closed: a server built without the peer's state serves no state-bound method
        raise StateError("%s is served %s; this server cannot tell this peer's state" % (method, served))
    state = view.state()
    if served == SERVED_ACCEPTING_INIT:
        ok = state == constants.STATE_ACCEPTING_INIT
        why = "is allowed only in state %s" % constants.STATE_ACCEPTING_INIT
    elif served == SERVED_ACTIVATED:
        ok, why = state in ACTIVATED_STATES, "is served only after activation"
    elif served == SERVED_ADMIN_KEY_PINNED:
        ok, why = view.admin_key_pinned(), "is served only after activation (once the admin key is pinned)"
    else:
        ok = state == constants.STATE_ACTIVATING_NODES
        why = "is served only after activation, by an activated Coordinator (state %s)" % constants.STATE_ACTIVATING_NODES
    if not ok:
        raise StateError("%s %s; this node is %s" % (method, why, state))


def caller_of(conn: Any, confirm: Optional[Callable[[], Any]] = None) -> Caller:
    """The ``Caller`` of what ``conn`` proved (AdminAuth, PeerAuth)."""
    pub_key = getattr(conn, "vpn_peer_pub_key", None)
    return Caller(conn.peer_ip, pub_key, bool(getattr(conn, "admin", False)), bool(getattr(conn, "coordinator", False)),
                  confirm or (lambda: None))


def authorise(method: str, access: Access, conn: Any, view: Optional[PeerView]) -> Caller:
    """Raises StateError (not served in this peer's state) or AccessDenied (the connection has not proven what the
    declaration asks), naming the method and what it needs; returns the authenticated caller when the handler may
    run (its ``confirm()`` checks again)."""
    _served(method, access.served, view)
    _authenticate(method, access.caller, conn, view)
    return caller_of(conn, lambda: authorise(method, access, conn, view))


def _authenticate(method: str, caller: str, conn: Any, view: Optional[PeerView]) -> None:
    if caller in (CALLER_ANYONE, CALLER_INIT_SECRET):
        return
    if caller == CALLER_ADMIN:
        if not getattr(conn, "admin", False):
            raise AccessDenied("%s needs %s: this connection has not proven possession of the admin key (AdminAuth "
                               "first)" % (method, _NEEDS[caller]))
        return
    if caller == CALLER_COORDINATORS:
        if not (getattr(conn, "admin", False) or getattr(conn, "coordinator", False)):
            raise AccessDenied("%s needs AdminAuth (the admin key, or role coordinator with the Coordinators' key)"
                               % method)
        return
    if caller == CALLER_VPN_PEER:
        if view is None:
            raise AccessDenied("%s needs a VPN peer's address: this server cannot tell this peer's registry" % method)
        view.check_not_evicted(method, conn.peer_ip)
        return
    pub_key = getattr(conn, "vpn_peer_pub_key", None)
    if pub_key is None:
        raise AccessDenied("%s needs %s: this connection has not proven the WireGuard key of %s (PeerAuth first)"
                           % (method, _NEEDS[caller], getattr(conn, "peer_ip", "?")))
    if view is None:
        raise AccessDenied("%s needs %s: this server cannot tell this peer's registry" % (method, _NEEDS[caller]))
    view.check_peer(method, conn.peer_ip, pub_key)
    if caller in (CALLER_VERIFIED_PEER, CALLER_CONTROL_PLANE):
        view.check_verified(method, conn.peer_ip)
    if caller == CALLER_CONTROL_PLANE:
        view.check_control_plane(method, conn.peer_ip, pub_key)
