# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Attested TLS (docs/atls.md, "Wire format") on Python's ``ssl`` and ``cryptography``.

Server side: the client's 32-byte nonce arrives as SNI (std base64). For every connection the
server takes a fresh ECDSA P-256 key, asks its issuer for an attestation document binding
SHA-256(SubjectPublicKeyInfo) to that nonce, puts the document into a self-signed certificate
and swaps a per-connection SSLContext with that certificate in, all inside ``sni_callback``.

Client side: a fresh nonce per connection, the handshake without stdlib verification, then
the whole certificate check (validity, self-signature, attestation, key binding) *before* the
caller gets the socket, so no application byte is ever sent to an unverified peer.

Only the server is attested. The mutual mode (server nonce carried in the acceptable-CA list)
cannot be built on the stdlib; see docs/atls.md, "Mutual aTLS and the join flow", for how the join flow binds the
node's attestation to the connection instead.
"""

from __future__ import annotations

import base64
import binascii
import concurrent.futures
import datetime
import hashlib
import hmac
import os
import queue
import secrets
import socket
import ssl
import tempfile
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, List, Optional, Sequence, Tuple, TypeVar, Union

try:
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    HAS_CRYPTOGRAPHY = True
    CRYPTOGRAPHY_IMPORT_ERROR = None
except ImportError as _err:  # ansible-test's import sanity runs without third-party packages
    HAS_CRYPTOGRAPHY = False
    CRYPTOGRAPHY_IMPORT_ERROR = _err

from ansible_collections.constellation.cluster.plugins.module_utils import encoding, x509compat
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.quote_queue import QuoteQueue, connection_gone
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.variant import (
    Issuer, Validation, Validator, accepts)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    AttestationError, ConstellationError, InputError, MissingDependency, PeerUnreachable)

NONCE_SIZE = 32
ALPN_PROTOCOLS = ("http/1.1", "h2")
COMMON_NAME = "Constellation"
CERT_VALIDITY = datetime.timedelta(hours=2)
ATTESTATION_TIMEOUT = 30.0  # seconds, as Constellation's attestationTimeout
HANDSHAKE_TIMEOUT = 10.0  # seconds, connect and TLS handshake each
KEY_POOL_SIZE = 4

_T = TypeVar("_T")


# ---------------------------------------------------------------------------------------------
# Shared pieces


def require_cryptography() -> None:
    if not HAS_CRYPTOGRAPHY:
        raise MissingDependency("cryptography", "aTLS", CRYPTOGRAPHY_IMPORT_ERROR)


def encode_nonce(nonce: bytes) -> str:
    """The SNI form of a nonce: standard base64 with padding (44 characters for 32 bytes)."""
    return base64.b64encode(nonce).decode("ascii")


def decode_nonce(server_name: Optional[str]) -> bytes:
    """Inverse of :func:`encode_nonce`; refuses anything that is not exactly 32 bytes."""
    if not server_name:
        raise AttestationError("client sent no nonce (SNI is empty)")
    if len(server_name) != 44:
        raise AttestationError("client nonce (SNI) must be 44 base64 characters, got %d" % len(server_name))
    try:
        nonce = base64.b64decode(server_name.encode("ascii"), validate=True)
    except (ValueError, binascii.Error):
        raise AttestationError("client nonce (SNI) is not standard base64") from None
    if len(nonce) != NONCE_SIZE:
        raise AttestationError("client nonce (SNI) must decode to %d bytes, got %d" % (NONCE_SIZE, len(nonce)))
    return nonce


def spki_hash(public_key) -> bytes:
    """SHA-256 of the DER SubjectPublicKeyInfo: the attestation user data of an aTLS certificate."""
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).digest()


def build_certificate(priv_key, extensions: Iterable[Tuple[str, bytes]],
                      not_before: datetime.datetime, not_after: datetime.datetime) -> x509.Certificate:
    """A self-signed ``CN=Constellation`` certificate carrying each (OID, value) as a
    non-critical extension (docs/atls.md, "Wire format"). Exposed so tests can build hostile certificates."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, COMMON_NAME)])
    builder = (x509.CertificateBuilder()
               .subject_name(name).issuer_name(name)
               .public_key(priv_key.public_key())
               .serial_number(secrets.randbelow(2 ** 128 - 1) + 1)
               .not_valid_before(not_before).not_valid_after(not_after))
    for oid, value in extensions:
        builder = builder.add_extension(x509.UnrecognizedExtension(x509.ObjectIdentifier(oid), value), critical=False)
    return builder.sign(priv_key, hashes.SHA256())


def _prefixed(err: ConstellationError, prefix: str) -> ConstellationError:
    err.args = (prefix + str(err),) + tuple(err.args[1:])
    err.__traceback__ = None
    return err


_EXECUTOR_LOCK = threading.Lock()
_EXECUTOR: Optional[concurrent.futures.ThreadPoolExecutor] = None


def _with_deadline(what: str, timeout: float, func: Callable[..., _T], *args, error=AttestationError) -> _T:
    """Runs func in a worker thread and gives up after timeout seconds (a hung TPM or a
    validator fetching remote collateral must not hang a handshake forever); ``error`` is raised then."""
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="atls")
    future = _EXECUTOR.submit(func, *args)
    try:
        return future.result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise error("%s timed out after %.1f s" % (what, timeout)) from None


# ---------------------------------------------------------------------------------------------
# Client side


@dataclass
class AttestedConnection:
    """A handshake-complete TLS socket whose peer passed attestation."""
    sock: ssl.SSLSocket
    validation: Validation
    variant_oid: str
    peer_certificate: bytes  # DER


def parse_endpoint(endpoint: Union[str, Tuple[str, int]], field: str = "endpoint") -> Tuple[str, int]:
    """``host:port``, ``[v6]:port`` or a (host, port) tuple (encoding.parse_endpoint)."""
    return encoding.parse_endpoint(endpoint, field)


_CLIENT_CONTEXT: Optional[ssl.SSLContext] = None


def client_context() -> ssl.SSLContext:
    """The client SSLContext. Shared: the nonce lives in each connection's SNI, not in the
    context, and the client never offers a session, so sharing cannot weaken freshness."""
    global _CLIENT_CONTEXT
    with _EXECUTOR_LOCK:
        if _CLIENT_CONTEXT is None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            # The stdlib checks nothing; verify_peer_certificate checks everything.
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            ctx.options |= ssl.OP_NO_TICKET
            ctx.set_alpn_protocols(list(ALPN_PROTOCOLS))
            _CLIENT_CONTEXT = ctx
        return _CLIENT_CONTEXT


def verify_peer_certificate(der: Optional[bytes], validators: Sequence[Validator], nonce: bytes,
                            now: Optional[datetime.datetime] = None,
                            attestation_timeout: float = ATTESTATION_TIMEOUT) -> Tuple[Validation, str]:
    """The checks of docs/atls.md "Client: verify before the first byte": returns (validation, variant OID) or raises AttestationError with the reason."""
    require_cryptography()
    if not der:
        raise AttestationError("peer presented no certificate")
    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError as err:
        raise AttestationError("peer certificate is not valid X.509: %s" % err) from None
    now = now or datetime.datetime.now(datetime.timezone.utc)
    if now < x509compat.not_valid_before(cert):
        raise AttestationError("peer certificate is not valid yet (not before %s, now %s)"
                               % (x509compat.not_valid_before(cert).isoformat(), now.isoformat(timespec="seconds")))
    if now > x509compat.not_valid_after(cert):
        raise AttestationError("peer certificate has expired (not after %s, now %s)"
                               % (x509compat.not_valid_after(cert).isoformat(), now.isoformat(timespec="seconds")))
    try:
        x509compat.verify_directly_issued_by(cert, cert)
    except (ValueError, TypeError, InvalidSignature) as err:
        raise AttestationError("peer certificate is not validly self-signed: %s" % (err or "bad signature")) from None
    expected_user_data = spki_hash(cert.public_key())
    try:
        extensions = list(cert.extensions)
    except (ValueError, x509.DuplicateExtension, x509.UnsupportedGeneralNameType) as err:
        raise AttestationError("peer certificate has malformed extensions: %s" % err) from None
    accepted = sorted({oid for v in validators for oid in (v.oid,) + tuple(getattr(v, "alias_oids", ()))})
    for ext in extensions:
        if not any(accepts(v, ext.oid.dotted_string) for v in validators):
            continue
        document = getattr(ext.value, "value", None)
        if not isinstance(document, bytes):
            raise AttestationError("attestation extension %s does not hold raw bytes" % ext.oid.dotted_string)
        validation = validate_document(ext.oid.dotted_string, document, validators, nonce, expected_user_data,
                                       attestation_timeout)
        return validation, ext.oid.dotted_string
    raise AttestationError("peer certificate carries no attestation of an accepted variant: found OIDs [%s], "
                           "accepted [%s]" % (", ".join(e.oid.dotted_string for e in extensions),
                                              ", ".join(accepted)))


def validate_document(oid: str, document: bytes, validators: Sequence[Validator], nonce: bytes,
                      expected_user_data: bytes, attestation_timeout: float = ATTESTATION_TIMEOUT) -> Validation:
    """An attestation document of variant ``oid`` over ``nonce``, validated by the matching validator,
    whose user data must be ``expected_user_data`` (the SHA-256 of the connection's certificate key):
    the check of a certificate's extension and of a fresh proof on a kept connection (``Attest``)."""
    validator = next((v for v in validators if accepts(v, oid)), None)
    if validator is None:
        raise AttestationError("attestation variant %s is not accepted (accepted: %s)"
                               % (str(oid)[:64], ", ".join(sorted(v.oid for v in validators))))
    try:
        if getattr(validator, "validate_inline", False) is True:
            # No I/O, bounded by the document's size (variant.Validator): a worker thread would only add
            # its wake-up (0.4 - 1.5 ms per handshake on a loaded 2-core host, docs/atls.md).
            validation = validator.validate(document, nonce)
        else:
            # Out of time is no verdict (the validator's own resources): the peer counts as unreachable.
            validation = _with_deadline("attestation validation", attestation_timeout, validator.validate, document,
                                        nonce, error=PeerUnreachable)
    except (PeerUnreachable, MissingDependency):  # no verdict on the peer: it could not be judged (or not here)
        raise
    except AttestationError as err:
        # Keep the type and its details (e.g. the PCR table of a measurements mismatch).
        raise _prefixed(err, "attestation refused: ")
    except ConstellationError as err:
        raise AttestationError("attestation refused: %s" % err) from None
    except Exception as err:  # pylint: disable=broad-except
        # A validator choking on hostile input is a refusal, not a crash of the caller.
        raise AttestationError("attestation refused: the %s document could not be validated: %s: %s"
                               % (oid, type(err).__name__, err)) from None
    if not hmac.compare_digest(bytes(validation.user_data), expected_user_data):
        raise AttestationError(
            "attestation is bound to another key: user data %s != SHA-256 of the certificate's public key %s"
            " (relayed attestation?)" % (bytes(validation.user_data).hex(), expected_user_data.hex()))
    return validation


def client_handshake(raw_sock: socket.socket, validators: Sequence[Validator], *,
                     timeout: float = HANDSHAKE_TIMEOUT,
                     attestation_timeout: float = ATTESTATION_TIMEOUT,
                     nonce: Optional[bytes] = None) -> AttestedConnection:
    """Runs the aTLS client handshake on a connected socket. On any failure the socket is
    closed (nothing but the handshake was sent) and says why: AttestationError when the peer's
    certificate arrived and was refused; PeerUnreachable when the handshake timed out, was reset
    or ended (or refused by the server) before any certificate arrived: no verdict on the peer."""
    if not validators:
        raise InputError("validators", "at least one attestation validator")
    nonce = os.urandom(NONCE_SIZE) if nonce is None else nonce
    if len(nonce) != NONCE_SIZE:
        raise InputError("nonce", "%d bytes" % NONCE_SIZE, len(nonce))
    raw_sock.settimeout(timeout)
    try:
        tls = client_context().wrap_socket(raw_sock, server_hostname=encode_nonce(nonce),
                                           do_handshake_on_connect=False)
    except (ssl.SSLError, OSError) as err:
        raw_sock.close()
        raise PeerUnreachable("aTLS handshake failed: %s" % err) from None
    try:
        try:
            tls.do_handshake()
        except (ssl.SSLError, OSError) as err:
            # The client checks nothing during the handshake (verify_mode CERT_NONE): a failure here
            # is a timeout, a reset, an EOF or the server's alert, before any attestation was judged.
            raise PeerUnreachable("aTLS handshake failed before the peer's attestation arrived: %s"
                                  % (err or type(err).__name__)) from None
        if tls.session_reused:
            raise AttestationError("peer resumed a TLS session: every connection must be attested afresh")
        validation, oid = verify_peer_certificate(tls.getpeercert(binary_form=True), validators, nonce,
                                                  attestation_timeout=attestation_timeout)
    except BaseException:
        tls.close()
        raise
    return AttestedConnection(sock=tls, validation=validation, variant_oid=oid,
                              peer_certificate=tls.getpeercert(binary_form=True))


def connect(endpoint: Union[str, Tuple[str, int]], validators: Sequence[Validator], *,
            timeout: float = HANDSHAKE_TIMEOUT,
            attestation_timeout: float = ATTESTATION_TIMEOUT) -> AttestedConnection:
    """Connects to an aTLS endpoint and returns only once the peer passed attestation."""
    require_cryptography()
    host, port = parse_endpoint(endpoint)
    try:
        raw_sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as err:
        raise PeerUnreachable("cannot connect to %s:%d: %s" % (host, port, err)) from None
    try:
        return client_handshake(raw_sock, validators, timeout=timeout, attestation_timeout=attestation_timeout)
    except (AttestationError, PeerUnreachable) as err:
        raise _prefixed(err, "%s:%d: " % (host, port))


# ---------------------------------------------------------------------------------------------
# Server side


@dataclass
class PooledKey:
    """A one-time server key with the work that does not depend on the nonce done ahead."""
    priv_key: ec.EllipticCurvePrivateKey
    priv_key_pem: bytes
    spki_hash: bytes
    context: ssl.SSLContext  # fresh, holds no certificate yet


def server_context() -> ssl.SSLContext:
    """A server SSLContext with aTLS's parameters and no certificate."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    # No session tickets and no resumption: each connection carries its own attestation.
    ctx.options |= ssl.OP_NO_TICKET
    ctx.num_tickets = 0
    ctx.set_alpn_protocols(list(ALPN_PROTOCOLS))
    return ctx


def new_key(priv_key: Optional[ec.EllipticCurvePrivateKey] = None) -> PooledKey:
    """A server key (fresh unless given) with its PEM, SPKI hash and a fresh SSLContext."""
    priv_key = priv_key or ec.generate_private_key(ec.SECP256R1())
    pem = priv_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())
    return PooledKey(priv_key, pem, spki_hash(priv_key.public_key()), server_context())


class _KeyPool:
    """Keeps a few ECDSA keys (and their SSLContexts) ready. Each is handed out once. ``make``: how an
    entry is made (default :func:`new_key`)."""

    def __init__(self, size: int, make: Optional[Callable[[], PooledKey]] = None):
        self._make = make or new_key
        self._queue: "queue.Queue[PooledKey]" = queue.Queue(maxsize=max(size, 0) or 1)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if size > 0:
            self._thread = threading.Thread(target=self._fill, name="atls-key-pool", daemon=True)
            self._thread.start()

    def _fill(self) -> None:
        while not self._stop.is_set():
            entry = self._make()
            while not self._stop.is_set():
                try:
                    self._queue.put(entry, timeout=0.5)
                    break
                except queue.Full:
                    continue

    def take(self) -> PooledKey:
        try:
            return self._queue.get_nowait()
        except queue.Empty:
            return self._make()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)


def _load_certificate(ctx: ssl.SSLContext, key: PooledKey, cert: x509.Certificate) -> None:
    """ssl only loads key material from a path: use an anonymous memory file, never the disk."""
    pem = key.priv_key_pem + cert.public_bytes(serialization.Encoding.PEM)
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None:
        fd = memfd_create("atls", getattr(os, "MFD_CLOEXEC", 0))
        try:
            os.write(fd, pem)
            ctx.load_cert_chain("/proc/self/fd/%d" % fd)
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory() as tmp:  # 0700, removed at once
        path = os.path.join(tmp, "cert.pem")
        with open(path, "wb") as f:
            f.write(pem)
        ctx.load_cert_chain(path)


class AttestedServerContext:
    """Server half of aTLS. ``context`` is the listening SSLContext; every handshake through it
    gets its own key, attestation document and certificate.

    ``issuer=None`` makes plain self-signed certificates without attestation (docs/atls.md, "Wire format": mode
    "server no issuer"). Subclasses may override :meth:`certificate_for` (tests build hostile
    servers that way).
    """

    def __init__(self, issuer: Optional[Issuer], *, key_pool_size: int = KEY_POOL_SIZE,
                 validity: datetime.timedelta = CERT_VALIDITY,
                 attestation_timeout: float = ATTESTATION_TIMEOUT):
        require_cryptography()
        self.issuer = issuer
        self.validity = validity
        self.attestation_timeout = attestation_timeout
        self._pool = _KeyPool(key_pool_size)
        self.quotes = QuoteQueue()
        self._handshake = threading.local()  # the connection this thread's ClientHello came on
        self.context = server_context()
        self.context.sni_callback = self._on_client_hello

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> "AttestedServerContext":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def issue(self, user_data: bytes, nonce: bytes) -> bytes:
        """A document from the issuer, through this context's quote queue (``QuoteQueue``): in a handshake, with
        the connection's priority, and never made once the connection is gone."""
        if self.issuer is None:
            raise AttestationError("this server has no issuer")
        sock = getattr(self._handshake, "sock", None)
        return self.quotes.run(
            lambda left: _with_deadline("attestation", left, self.issuer.issue, user_data, nonce),
            self.attestation_timeout, priority=bool(getattr(sock, "atls_priority", False)),
            gone=(lambda: connection_gone(sock)) if sock is not None else None)

    def certificate_for(self, nonce: bytes) -> Tuple[PooledKey, x509.Certificate]:
        """The key and certificate for one connection whose client sent nonce."""
        key = self._pool.take()
        now = datetime.datetime.now(datetime.timezone.utc)
        extensions: List[Tuple[str, bytes]] = []
        if self.issuer is not None:
            extensions.append((self.issuer.oid, self.issue(key.spki_hash, nonce)))
        return key, build_certificate(key.priv_key, extensions, now - self.validity, now + self.validity)

    def _on_client_hello(self, ssl_sock, server_name, _base_ctx):
        # Exceptions here would only surface as an unraisable-hook print: record the reason on
        # the socket for accept_handshake() and answer with an alert instead.
        try:
            nonce = decode_nonce(server_name)
        except AttestationError as err:
            ssl_sock.atls_refusal = str(err)
            return ssl.ALERT_DESCRIPTION_ILLEGAL_PARAMETER
        self._handshake.sock = ssl_sock
        try:
            key, cert = self.certificate_for(nonce)
            _load_certificate(key.context, key, cert)
            ssl_sock.context = key.context
        except Exception as err:  # pylint: disable=broad-except
            ssl_sock.atls_refusal = "cannot attest this connection: %s" % err
            return ssl.ALERT_DESCRIPTION_INTERNAL_ERROR
        finally:
            self._handshake.sock = None
        return None

    def accept_handshake(self, raw_sock: socket.socket, timeout: float = HANDSHAKE_TIMEOUT,
                         priority: bool = False) -> ssl.SSLSocket:
        """Server handshake on an accepted socket; closes it and raises AttestationError on failure.
        ``priority``: the connection comes from one of the Coordinators (its quote goes first)."""
        raw_sock.settimeout(timeout)
        try:
            tls = self.context.wrap_socket(raw_sock, server_side=True, do_handshake_on_connect=False)
        except (ssl.SSLError, OSError) as err:
            raw_sock.close()
            raise AttestationError("aTLS handshake failed: %s" % err) from None
        tls.atls_priority = priority
        try:
            tls.do_handshake()
        except (ssl.SSLError, OSError) as err:
            reason = getattr(tls, "atls_refusal", None)
            tls.close()
            raise AttestationError(reason or "aTLS handshake failed: %s" % (err or type(err).__name__)) from None
        return tls
