# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A small threaded frame server: accept, (aTLS) handshake, then requests one after another.

Dispatch comes from the RPC schema (``schema.py``): a server built for some APIs refuses any other
method (naming the ones it has), checks at start that it has a handler for every method of its
APIs and none without a table entry, and decodes every request into its record before the
handler runs (a bad request of a method that streams stdin is drained first, so the connection
stays in step).

Bounded: at most ``max_connections`` connections are served at once (others wait in the
listen backlog); every connection has an idle timeout. Handlers get a ``Connection`` and the
request's params and must finish the answer with exactly one END (``send_result``); any
exception they raise becomes an END error naming what was wrong.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any, Callable, Dict, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils import atls, errors
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import schema
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import (
    CHANNEL_STDIN,
    KIND_MSG,
    ConnectionClosed,
    FrameStream,
    MalformedMessage,
    ProtocolError,
    request_of,
)

IDLE_TIMEOUT = 300.0
MAX_CONNECTIONS = 64

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
    def __init__(self, sock: socket.socket, peer: Tuple[str, int], server_spki_hash: Optional[bytes]):
        self.sock = sock
        self.peer = peer
        self.peer_ip = peer[0]
        self.stream = FrameStream(sock)
        self.server_spki_hash = server_spki_hash
        self.admin = False


class FrameServer:
    def __init__(self, name: str, bind: Tuple[str, int], handlers: Dict[str, Handler],
                 tls: Optional[AgentServerContext] = None, log: Optional[Callable[..., None]] = None,
                 accept_check: Optional[Callable[[Tuple[str, int]], Optional[str]]] = None,
                 max_connections: int = MAX_CONNECTIONS, idle_timeout: float = IDLE_TIMEOUT,
                 apis: Optional[Tuple[str, ...]] = None):
        self.name = name
        self.handlers = handlers
        self.apis = apis
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
        self._slots = threading.BoundedSemaphore(max_connections)
        self._stop = threading.Event()
        family = socket.AF_INET6 if ":" in bind[0] else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(bind)
        self.sock.listen(128)
        self.sock.settimeout(0.5)
        self.address = self.sock.getsockname()[:2]
        self._thread = threading.Thread(target=self._accept_loop, name="%s-accept" % name, daemon=True)
        self._conns: set = set()
        self._conns_lock = threading.Lock()

    def start(self) -> "FrameServer":
        self._thread.start()
        self._log("listening", server=self.name, endpoint="%s:%d" % self.address)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self.sock.close()
        except OSError:
            pass
        with self._conns_lock:
            conns = list(self._conns)
        for sock in conns:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                raw, peer = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                continue
            while not self._slots.acquire(timeout=0.5):
                if self._stop.is_set():
                    raw.close()
                    return
            # Every exchange is request/answer of small frames: with Nagle's algorithm each would
            # wait for the peer's delayed ACK (~40 ms).
            try:
                raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            threading.Thread(target=self._serve, args=(raw, peer), name="%s-conn" % self.name, daemon=True).start()

    def _serve(self, raw: socket.socket, peer) -> None:
        try:
            with self._conns_lock:
                self._conns.add(raw)
            refusal = self.accept_check(peer) if self.accept_check else None
            if refusal:
                raw.settimeout(5)
                FrameStream(raw).send_error(AccessDenied(refusal))
                self._log("refused", server=self.name, peer=peer[0], reason=refusal)
                return
            sock, spki = raw, None
            if self.tls is not None:
                try:
                    sock = self.tls.accept_handshake(raw)
                except ConstellationError as err:
                    self._log("handshake_failed", server=self.name, peer=peer[0], error=str(err))
                    return
                spki = getattr(sock.context, "atls_spki_hash", None)
            sock.settimeout(self.idle_timeout)
            self._requests(Connection(sock, peer, spki))
        except Exception as err:  # pylint: disable=broad-except
            # The last line of defence of a connection thread: one JSON log line, never a traceback
            # on stderr; the agent and its other connections go on.
            self._log("connection_crashed", level="error", server=self.name, peer=peer[0], **crash_fields(err))
        finally:
            with self._conns_lock:
                self._conns.discard(raw)
            try:
                raw.close()
            except OSError:
                pass
            self._slots.release()

    def _requests(self, conn: Connection) -> None:
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
