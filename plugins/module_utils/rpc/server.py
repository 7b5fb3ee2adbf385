# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A small threaded frame server: accept, (aTLS) handshake, then requests one after another.

Dispatch comes from the RPC schema (``schema.py``): a server built for some APIs refuses any other
method (naming the ones it has), checks at start that it has a handler for every method of its
APIs and none without a table entry, enforces each method's declaration (who may call it in which
states, rpc/access.py: ``_authorise``) and decodes every request into its record before the
handler runs (a bad request of a method that streams stdin is drained first, so the connection
stays in step).

Bounded, and a stranger cannot fill it (docs/agent.md, "Connection limits"): at most
``max_connections`` connections at once and at most ``max_per_source`` unauthenticated ones per
source IP; a connection must finish its handshake and send its first request within
``first_request_timeout``, and one that did not authenticate as the admin may sit idle between
requests for ``unauthenticated_idle_timeout`` only (an admin connection: ``idle_timeout``). Inside a
request, a message the caller owes before it authenticated (a signature, a proof, an attestation) is read
with ``Connection.recv_owed``: a short deadline, and the connection counts as waiting (replaceable) meanwhile.
When a limit is reached, the new connection takes the place of a replaceable one (in its handshake, idle, or
waiting on an unauthenticated caller): of its own source first, then the one waiting longest; only when
every connection is busy in a request or authenticated is the new one closed. The accept loop never waits
for a slot or a handshake.

Cheap checks before any quote: on an aTLS server each source IP's handshakes are rate-limited
(``handshake_rate``, a token bucket per source) when the connection is accepted, before its slot, its
thread or its handshake. ``reserved_for(source_ip)`` (the agent passes who its Coordinators are) gives those
sources ``reserved_connections`` slots of their own, which no other source's connection takes, and the
first place in the aTLS context's quote queue (atls.py).

Authenticated peers (the vpnapi's long polls): a connection whose handler set
``conn.authenticated_peer`` (it proved a registered peer's key: PeerAuth) leaves the budget above for its own,
``max_peer_connections`` (0: none, the default), at most ``MAX_PEER_CONNECTIONS_PER_SOURCE`` per source IP
(beyond either it stays in the general budget). Such a connection is never replaced by a newer one, so a
stranger's connections cannot push out a Node's held GetUpdate; it may sit idle between requests for
``unauthenticated_idle_timeout`` (a Node asks again at once). Handlers get a ``Connection`` (its ``caller``:
who the server authenticated, as the method's declaration asks) and the request's record and must finish the
answer with exactly one END (``send_result``); any exception they raise becomes an END error naming what was wrong.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils import atls, errors
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import access, schema
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.rate_limit import RateLimit
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import (
    CHANNEL_STDIN,
    KIND_MSG,
    ConnectionClosed,
    FrameStream,
    MalformedMessage,
    ProtocolError,
    request_of,
)

IDLE_TIMEOUT = 300.0  # an admin connection between requests; every read inside a request
MAX_CONNECTIONS = 64
MAX_CONNECTIONS_PER_SOURCE = 8  # unauthenticated connections of one source IP
FIRST_REQUEST_TIMEOUT = 15.0  # accept -> handshake done and the first request read
UNAUTHENTICATED_IDLE_TIMEOUT = 20.0  # between requests, on a connection without AdminAuth
MAX_THREADS_FACTOR = 2  # connection threads alive (closed ones still finishing included) <= factor * max
MAX_PEER_CONNECTIONS = 8192  # the vpnapi: PeerAuth'd connections (a Node's held GetUpdate), besides the 64
MAX_PEER_CONNECTIONS_PER_SOURCE = 4  # PeerAuth'd connections of one VPN IP in the peers' budget
REAP_EVERY = 0.2  # seconds between two looks for connections past their deadline
OWED_TIMEOUT = 10.0  # a message an unauthenticated caller owes inside a request (a signature, a proof)
OWED_TPM_TIMEOUT = 30.0  # one whose sender works its TPM first (a quote, an AK, ActivateCredential)
OWED_PEER_TIMEOUT = 60.0  # one that an activating Coordinator sends after its own store work (etcd: 30 s each)
RESERVED_CONNECTIONS = 8  # the Coordinators' own room on a Node's pubapi, besides the 64
HANDSHAKE_RATE = (32, 8.0)  # aTLS handshakes (each a TPM quote) of one source IP: a burst, then per second

Handler = Callable[["Connection", Dict[str, Any]], None]


def crash_fields(err: BaseException) -> Dict[str, Any]:
    """What a log line says about an unexpected exception: its type and where it was raised
    (file:line of the innermost frame), not its message (which may quote input) nor a traceback."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = "%s:%d" % (os.path.basename(tb.tb_frame.f_code.co_filename), tb.tb_lineno) if tb is not None else ""
    return {"error": type(err).__name__, "where": where}


AccessDenied = errors.AccessDenied  # the Core raises it too (init proof, eviction)


class AgentServerContext(atls.AttestedServerContext):
    """aTLS server context that remembers each connection's server-key hash on the connection's
    SSLContext, so in-band proofs (admin auth, join attestation) can bind to this connection."""

    def certificate_for(self, nonce: bytes):
        key, cert = super().certificate_for(nonce)
        key.context.atls_spki_hash = key.spki_hash
        return key, cert


class Connection:
    """One connection as a handler sees it. ``recv_owed`` reads a message the caller owes inside a request."""

    def __init__(self, sock: socket.socket, peer: Tuple[str, int], server_spki_hash: Optional[bytes],
                 awaiting: Optional[Callable[[bool], bool]] = None):
        self.sock = sock
        self.peer = peer
        self.peer_ip = peer[0]
        self.stream = FrameStream(sock)
        self.server_spki_hash = server_spki_hash
        self.admin = False
        self.coordinator = False  # set by AdminAuth (role coordinator): the caller proved the Coordinators' key
        self.vpn_peer_pub_key: Optional[str] = None  # set by PeerAuth: the registered peer's key the caller proved
        # Who the server authenticated for the current request, as its declaration asks (``access.authorise``): the
        # handler reads who called from it.
        self.caller = access.Caller(self.peer_ip)
        self._awaiting = awaiting or (lambda waiting: True)  # the server's view: waiting on the client or busy

    @property
    def authenticated_peer(self) -> bool:
        """The caller proved a registered peer's WireGuard key (PeerAuth)."""
        return self.vpn_peer_pub_key is not None

    @property
    def authenticated(self) -> bool:
        return bool(self.admin or self.coordinator or self.authenticated_peer)

    def recv_owed(self, what: str, timeout: float = OWED_TIMEOUT, replaceable: bool = True) -> Dict[str, Any]:
        """The next message, which the caller owes now (a signed challenge, a proof, its attestation): on a
        connection that has not authenticated it must arrive within ``timeout`` seconds (not the long read
        timeout), and while the server waits for it the connection counts as waiting, not busy, so a newer
        connection may take its slot (``replaceable``: False where the caller already proved something the
        Core checked, e.g. the init secret). An authenticated connection reads as always."""
        if self.authenticated:
            return self.stream.recv_msg(what)
        if replaceable and not self._awaiting(True):
            raise ConnectionClosed("the server closed the connection (%s)" % what)
        before = self.sock.gettimeout()
        self.sock.settimeout(timeout if before is None else min(timeout, before))
        try:
            message = self.stream.recv_msg(what)
        except ProtocolError as err:
            if "timed out" in str(err):
                raise ProtocolError("timed out waiting for the peer: %s did not arrive within %g s" % (what, timeout)) from None
            raise
        finally:
            try:
                self.sock.settimeout(before)
            except OSError:
                pass
        if replaceable and not self._awaiting(False):
            raise ConnectionClosed("the server closed the connection (%s)" % what)
        return message


PHASE_NEW = "new"  # accepted: handshake, then the first request
PHASE_IDLE = "idle"  # waiting for (or reading) the next request
PHASE_BUSY = "busy"  # in a handler
PHASE_AWAITING = "awaiting"  # in a handler, waiting for a message an unauthenticated caller owes (replaceable)


class _Slot:
    """The server's view of one connection: whose it is, what it does, since when. ``handle`` is a
    duplicate of the connection's descriptor: shutting it down ends the connection whatever object
    (plain or TLS) the connection thread holds, and its number is never reused while the slot lives."""

    __slots__ = ("peer_ip", "handle", "accepted", "last", "phase", "admin", "closed", "peer", "reserved")

    def __init__(self, peer_ip: str, handle: socket.socket, now: float, reserved: bool = False):
        self.peer_ip = peer_ip
        self.handle = handle
        self.accepted = now
        self.last = now
        self.phase = PHASE_NEW
        self.admin = False
        self.closed = ""  # why the server closed it (empty while open)
        self.peer = False  # in the authenticated peers' budget (never evicted)
        self.reserved = reserved  # in the Coordinators' reserved room (a stranger's connection never takes it)

    @property
    def evictable(self) -> bool:
        return not self.admin and not self.peer and self.phase != PHASE_BUSY


class FrameServer:
    def __init__(self, name: str, bind: Tuple[str, int], handlers: Dict[str, Handler],
                 tls: Optional[AgentServerContext] = None, log: Optional[Callable[..., None]] = None,
                 accept_check: Optional[Callable[[Tuple[str, int]], Optional[str]]] = None,
                 max_connections: int = MAX_CONNECTIONS, idle_timeout: float = IDLE_TIMEOUT,
                 apis: Optional[Tuple[str, ...]] = None, max_per_source: int = MAX_CONNECTIONS_PER_SOURCE,
                 first_request_timeout: float = FIRST_REQUEST_TIMEOUT,
                 unauthenticated_idle_timeout: float = UNAUTHENTICATED_IDLE_TIMEOUT, max_peer_connections: int = 0,
                 peer_view: Optional[access.PeerView] = None, insecure_skip_access_checks: bool = False,
                 reserved_for: Optional[Callable[[str], bool]] = None, reserved_connections: int = RESERVED_CONNECTIONS,
                 handshake_rate: Optional[Tuple[float, float]] = HANDSHAKE_RATE):
        self.name = name
        self.handlers = handlers
        self.apis = apis
        # Who may call each method in which states (schema.Method.access): checked before every handler, with
        # ``peer_view`` (the agent's state, its registry; agent/peer_view.py) where the declaration needs it.
        self.peer_view = peer_view
        self.insecure_skip_access_checks = insecure_skip_access_checks  # test doubles of a peer only
        if apis is not None:
            served = {m.name for m in schema.methods_of(*apis)}
            missing, extra = sorted(served - set(handlers)), sorted(set(handlers) - served)
            if missing or extra:
                raise ValueError("%s: handlers must match the schema's %s methods (missing %s, not in the table %s)"
                                 % (name, "/".join(apis), missing, extra))
        self.tls = tls
        self._log = log or (lambda event, **fields: None)
        self.accept_check = accept_check
        self.idle_timeout = idle_timeout
        self.max_connections = max(1, int(max_connections))
        self.max_per_source = max(1, min(int(max_per_source), self.max_connections))
        self.max_peer_connections = max(0, int(max_peer_connections))
        self.first_request_timeout = float(first_request_timeout)
        self.unauthenticated_idle_timeout = min(float(unauthenticated_idle_timeout), float(idle_timeout))
        self.reserved_for = reserved_for
        self.reserved_connections = max(0, int(reserved_connections)) if reserved_for is not None else 0
        # Each aTLS handshake costs a TPM quote: a token bucket per source IP, taken before the slot and the thread.
        self._handshakes = (RateLimit("aTLS handshake", handshake_rate, None)
                            if tls is not None and handshake_rate is not None else None)
        self._slots: Dict[int, _Slot] = {}  # open connections by id(slot), the general budget
        self._reserved_slots: Dict[int, _Slot] = {}  # the Coordinators' (reserved_for) room
        self._peer_slots: Dict[int, _Slot] = {}  # the authenticated peers' (promoted out of _slots)
        self._peers_of: Dict[str, int] = {}  # source IP -> its connections in _peer_slots
        self._reaped = 0.0
        self._threads_alive = 0
        self._log_lock = threading.Lock()
        self._log_marks: Dict[str, Tuple[float, int]] = {}
        self._stop = threading.Event()
        family = socket.AF_INET6 if ":" in bind[0] else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(bind)
        self.sock.listen(128)
        self.sock.settimeout(0.5)
        self.address = self.sock.getsockname()[:2]
        self._thread = threading.Thread(target=self._accept_loop, name="%s-accept" % name, daemon=True)
        self._conns_lock = threading.Lock()

    def start(self) -> "FrameServer":
        self._thread.start()
        self._log("listening", server=self.name, endpoint="%s:%d" % self.address)
        if self.insecure_skip_access_checks:
            self._log("insecure_skip_access_checks", level="warning", server=self.name,
                      message="every method is served to anyone, whatever its declaration says (a test double)")
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self.sock.close()
        except OSError:
            pass
        with self._conns_lock:
            for slot in self._all_slots():
                self._close_slot(slot, "server stopping")

    # -- connection limits (docs/agent.md, "Connection limits")
    @property
    def connection_count(self) -> int:
        with self._conns_lock:
            return len(self._slots) + len(self._peer_slots) + len(self._reserved_slots)

    def _all_slots(self) -> list:
        return list(self._slots.values()) + list(self._peer_slots.values()) + list(self._reserved_slots.values())

    def _drop(self, slot: _Slot) -> None:
        """The slot leaves its budget (caller holds ``_conns_lock``)."""
        self._slots.pop(id(slot), None)
        self._reserved_slots.pop(id(slot), None)
        if self._peer_slots.pop(id(slot), None) is not None:
            left = self._peers_of.get(slot.peer_ip, 1) - 1
            if left > 0:
                self._peers_of[slot.peer_ip] = left
            else:
                self._peers_of.pop(slot.peer_ip, None)

    def _close_slot(self, slot: _Slot, why: str) -> None:
        """Ends a connection from outside its thread (caller holds ``_conns_lock``): its slot is free
        at once; its thread sees the end of the stream and finishes."""
        self._drop(slot)
        if not slot.closed:
            slot.closed = why
            try:
                slot.handle.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _is_reserved(self, peer_ip: str) -> bool:
        if self.reserved_for is None:
            return False
        try:
            return bool(self.reserved_for(peer_ip))
        except Exception:  # pylint: disable=broad-except
            return False  # who the Coordinators are could not be told: a stranger's budget

    def _admit(self, raw: socket.socket, peer) -> Optional[_Slot]:
        """A slot for a new connection, or None (closed at once): see the module docstring. The cheap checks
        (the handshake rate of its source, a slot) come before any thread, handshake or quote."""
        logs: list = []
        try:
            if self._handshakes is not None:
                try:
                    self._handshakes.take(peer[0])
                except errors.RateLimited as err:
                    logs.append(dict(event="connection_refused", level="warning", server=self.name, peer=peer[0],
                                     reason=str(err)[:200]))
                    return None
            return self._admit_locked(raw, peer, self._is_reserved(peer[0]), logs)
        finally:
            for fields in logs:  # logged outside the lock
                self._log_limited(**fields)

    def _replace(self, candidates, peer_ip: str, why: str, logs: list) -> bool:
        """Closes one replaceable connection of ``candidates`` (caller holds ``_conns_lock``): of the new
        connection's source first, then the one waiting longest. False: none is replaceable."""
        idle = [s for s in candidates if s.evictable]
        if not idle:
            return False
        same = [s for s in idle if s.peer_ip == peer_ip]
        victim = min(same or idle, key=lambda s: s.last)
        logs.append(dict(event="connection_replaced", level="warning", server=self.name,
                         peer=victim.peer_ip, phase=victim.phase, reason=why))
        self._close_slot(victim, why)
        return True

    def _admit_locked(self, raw: socket.socket, peer, reserved: bool, logs: list) -> Optional[_Slot]:
        now = time.monotonic()
        with self._conns_lock:
            threads = self.max_connections + self.max_peer_connections + (self.reserved_connections if reserved else 0)
            if self._threads_alive >= MAX_THREADS_FACTOR * threads:
                logs.append(dict(event="connection_refused", level="warning", server=self.name, peer=peer[0],
                                 reason="too many connection threads still finishing"))
                return None
            budget = self._slots
            if reserved and self.reserved_connections:
                # A Coordinator's connection: its own room first, which only the Coordinators' connections use.
                if len(self._reserved_slots) < self.reserved_connections or self._replace(
                        self._reserved_slots.values(), peer[0], "replaced by a newer connection of the "
                        "Coordinators (at most %d in their room)" % self.reserved_connections, logs):
                    budget = self._reserved_slots
            if budget is self._slots:
                slots = list(self._slots.values())  # the general budget (the peers' connections: their own)
                same = [s for s in slots if s.peer_ip == peer[0] and not s.admin]
                if len(same) >= self.max_per_source:
                    replaced = self._replace(same, peer[0], "replaced by a newer connection of its source (at most "
                                             "%d per source)" % self.max_per_source, logs)
                elif len(slots) >= self.max_connections:
                    replaced = self._replace(slots, peer[0], "replaced by a newer connection (at most %d "
                                             "connections)" % self.max_connections, logs)
                else:
                    replaced = True
                if not replaced:
                    logs.append(dict(event="connection_refused", level="warning", server=self.name, peer=peer[0],
                                     reason="every slot is busy or authenticated"))
                    return None
            try:
                handle = raw.dup()
            except OSError:
                return None
            slot = _Slot(peer[0], handle, now, reserved=budget is self._reserved_slots)
            budget[id(slot)] = slot
            self._threads_alive += 1
            return slot

    def _reap(self) -> None:
        """Closes connections past their deadline: no request within ``first_request_timeout`` of the
        accept, or idle too long between requests (unauthenticated: the short limit)."""
        now = time.monotonic()
        if now - self._reaped < REAP_EVERY:  # the accept loop asks on every accept: thousands of slots
            return
        self._reaped = now
        logs = []
        with self._conns_lock:
            for slot in self._all_slots():
                if slot.phase == PHASE_NEW and now - slot.accepted > self.first_request_timeout:
                    why = "no request within %.0f s of connecting" % self.first_request_timeout
                elif slot.phase == PHASE_IDLE and now - slot.last > (  # a peer's: the short limit too
                        self.idle_timeout if slot.admin else self.unauthenticated_idle_timeout):
                    why = "idle for more than %.0f s" % (self.idle_timeout if slot.admin
                                                         else self.unauthenticated_idle_timeout)
                else:
                    continue
                logs.append(dict(event="connection_timed_out", server=self.name, peer=slot.peer_ip,
                                 phase=slot.phase, reason=why))
                self._close_slot(slot, why)
        for fields in logs:
            self._log_limited(**fields)

    def _log_limited(self, event: str, **fields: Any) -> None:
        """At most one line per event and second (a flood of connections is no flood of log lines);
        ``suppressed`` counts the lines left out since the last one."""
        now = time.monotonic()
        with self._log_lock:
            last, suppressed = self._log_marks.get(event, (0.0, 0))
            if now - last < 1.0:
                self._log_marks[event] = (last, suppressed + 1)
                return
            self._log_marks[event] = (now, 0)
        if suppressed:
            fields["suppressed"] = suppressed
        self._log(event, **fields)

    def _set_phase(self, slot: Optional[_Slot], phase: str, admin: bool = False, peer: bool = False) -> bool:
        """Records what the connection does now; False if the server closed it meanwhile."""
        if slot is None:
            return True
        with self._conns_lock:
            if slot.closed:
                return False
            slot.phase = phase
            slot.admin = slot.admin or admin
            slot.last = time.monotonic()
            if peer and not slot.peer:
                self._to_peer_budget(slot)
            return True

    def _to_peer_budget(self, slot: _Slot) -> None:
        """A connection that authenticated as a peer moves to the peers' budget if it has room (caller holds
        ``_conns_lock``); otherwise it stays where it was."""
        if (len(self._peer_slots) >= self.max_peer_connections
                or self._peers_of.get(slot.peer_ip, 0) >= MAX_PEER_CONNECTIONS_PER_SOURCE
                or self._slots.pop(id(slot), None) is None):
            return
        slot.peer = True
        self._peer_slots[id(slot)] = slot
        self._peers_of[slot.peer_ip] = self._peers_of.get(slot.peer_ip, 0) + 1

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            self._reap()
            try:
                raw, peer = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                continue
            slot = self._admit(raw, peer)
            if slot is None:
                # Rate limited, or full of busy or authenticated connections: this one is closed at once (never
                # waited for while holding it), the client sees a reset and tries again later.
                try:
                    raw.close()
                except OSError:
                    pass
                continue
            # Every exchange is request/answer of small frames: with Nagle's algorithm each would
            # wait for the peer's delayed ACK (~40 ms).
            try:
                raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            try:
                threading.Thread(target=self._serve, args=(raw, peer, slot), name="%s-conn" % self.name,
                                 daemon=True).start()
            except RuntimeError:  # cannot start a thread: give the slot back
                self._release(slot)
                raw.close()

    def _release(self, slot: _Slot) -> None:
        with self._conns_lock:
            self._drop(slot)
            slot.closed = slot.closed or "done"
            self._threads_alive -= 1
        try:
            slot.handle.close()
        except OSError:
            pass

    def _serve(self, raw: socket.socket, peer, slot: Optional[_Slot] = None) -> None:
        sock = raw
        try:
            refusal = self.accept_check(peer) if self.accept_check else None
            if refusal:
                raw.settimeout(5)
                FrameStream(raw).send_error(AccessDenied(refusal))
                self._log("refused", server=self.name, peer=peer[0], reason=refusal)
                return
            spki = None
            if self.tls is not None:
                try:
                    sock = self.tls.accept_handshake(raw, timeout=min(atls.HANDSHAKE_TIMEOUT, self.first_request_timeout),
                                                     priority=self._is_reserved(peer[0]))  # a Coordinator's: first
                except ConstellationError as err:
                    self._log("handshake_failed", server=self.name, peer=peer[0], error=str(err))
                    return
                spki = getattr(sock.context, "atls_spki_hash", None)
            sock.settimeout(self.idle_timeout)
            self._requests(Connection(sock, peer, spki, awaiting=lambda waiting: self._set_phase(
                slot, PHASE_AWAITING if waiting else PHASE_BUSY)), slot)
        except Exception as err:  # pylint: disable=broad-except
            # The last line of defence of a connection thread: one JSON log line, never a traceback
            # on stderr; the agent and its other connections go on.
            self._log("connection_crashed", level="error", server=self.name, peer=peer[0], **crash_fields(err))
        finally:
            for handle in (sock, raw):
                try:
                    handle.close()
                except OSError:
                    pass
            if slot is not None:
                self._release(slot)

    def _requests(self, conn: Connection, slot: Optional[_Slot] = None) -> None:
        while not self._stop.is_set():
            try:
                frame = conn.stream.recv()
            except ConnectionClosed:
                return
            except MalformedMessage as err:  # the frame was read whole: answer it and read on
                if not self._answer_error(conn, err):
                    return
                continue
            except ProtocolError as err:
                self._answer_error(conn, err)
                return
            if not self._set_phase(slot, PHASE_BUSY):
                return
            try:
                if frame.kind != KIND_MSG:
                    raise ProtocolError("expected a request, got a %s frame" % frame.kind_name)
                method, params = request_of(frame.message)
                if self.apis is not None:
                    schema.method(method, self.apis)  # InputError naming this server's methods
                handler = self.handlers.get(method)
                if handler is None:
                    raise InputError("method", "one of %s" % ", ".join(sorted(self.handlers)), method)
                self._log("request", server=self.name, method=method, peer=conn.peer_ip)
                self._authorise(conn, method)
                handler(conn, self._decode(conn, method, params))
            except ConnectionClosed:
                return
            except ProtocolError as err:
                self._answer_error(conn, err)
                return
            except Exception as err:  # pylint: disable=broad-except
                if not isinstance(err, ConstellationError):
                    self._log("internal_error", level="error", server=self.name, **crash_fields(err))
                if not self._answer_error(conn, err):
                    return
            if not self._set_phase(slot, PHASE_IDLE, conn.admin, conn.authenticated_peer):
                return

    def _authorise(self, conn: Connection, method: str) -> None:
        """The method's declaration (schema.Method.access, rpc/access.py), before the handler runs: StateError or
        AccessDenied naming the method and what it needs; otherwise ``conn.caller`` is the authenticated caller the
        handler gets. A refused method that streams stdin has it drained first (the client sends it whatever
        happens)."""
        spec = schema.METHODS.get(method)
        if spec is None or self.insecure_skip_access_checks:
            conn.caller = access.caller_of(conn)
            return
        try:
            conn.caller = access.authorise(method, spec.access, conn, self.peer_view)
        except ConstellationError as err:
            self._log_limited("access_denied", server=self.name, method=method, peer=conn.peer_ip, reason=str(err)[:200])
            if spec.stdin:
                conn.stream.recv_data_until_eof(CHANNEL_STDIN, lambda data: None)
            raise

    @staticmethod
    def _decode(conn: Connection, method: str, params: Dict[str, Any]):
        """The request's record (schema.py); a method outside the table gets its params as sent."""
        spec = schema.METHODS.get(method)
        if spec is None:
            return params
        try:
            return spec.request.decode(params)
        except InputError:
            if spec.stdin:  # the client sends its stdin and EOF whatever happens: take them first
                conn.stream.recv_data_until_eof(CHANNEL_STDIN, lambda data: None)
            raise

    def _answer_error(self, conn: Connection, err: BaseException) -> bool:
        try:
            conn.stream.send_error(err)
            return True
        except ConstellationError:
            return False
