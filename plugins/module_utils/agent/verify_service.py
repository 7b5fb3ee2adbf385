# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Constellation's verification service, both sides (docs/verify.md).

Server (every node agent): gRPC ``verify.API/GetAttestation`` (``GetAttestationRequest{nonce = 2}``
-> ``GetAttestationResponse{attestation = 1}``) on port 9090 and HTTP ``GET /?nonce=<URL-safe
base64>`` -> ``{"data": <std base64>}`` on port 8080, both plain (no TLS, no aTLS), the document
issued for the user data ``VerifyService``, as ``verify/server/server.go`` serves them.

Client (``constellation_verify``): asks any endpoint that speaks it for a fresh random nonce and
validates the answer with our validator: nonce binding, quote, measurements, and the user data
``VerifyService``. The transport proves nothing; the attestation proves everything.

The message classes are built at run time from Constellation's proto definition (a descriptor
in a private pool, no generated code), so the same code runs on Debian 12's python3-protobuf
3.21 and on current protobuf. grpcio and protobuf are imported only when gRPC is used.
Bounded everywhere: nonce size, request size, answer size, concurrent requests, requests per source
(agent/verify_limit.py), timeouts.
"""

from __future__ import annotations

import base64
import binascii
import concurrent.futures
import hmac
import json
import os
import re
import socket
import socketserver
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, List, Optional, Tuple
from urllib.parse import parse_qs, urlencode, urlsplit

from ansible_collections.constellation.cluster.plugins.module_utils.encoding import (
    format_endpoint, load_json, parse_endpoint)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    AttestationError, ConstellationError, InputError)
from ansible_collections.constellation.cluster.plugins.module_utils.agent.verify_limit import (
    limited, rate_limit, source_ip)

VERIFY_USER_DATA = b"VerifyService"  # constants.ConstellationVerifyServiceUserData
GRPC_PORT = 9090  # constants.VerifyServicePortGRPC
HTTP_PORT = 8080  # constants.VerifyServicePortHTTP
TRANSPORTS = ("grpc", "http")
SERVICE_NAME = "verify.API"
METHOD_NAME = "GetAttestation"
METHOD_PATH = "/%s/%s" % (SERVICE_NAME, METHOD_NAME)
NONCE_SIZE = 32  # what the client sends (the CLI's crypto.RNGLengthDefault)
MAX_NONCE_SIZE = 64  # the server refuses longer nonces (Constellation's CLI sends 32 bytes)
MAX_REQUEST_SIZE = 1024  # a gRPC request message, an HTTP request line (a 64-byte nonce needs ~100)
MAX_HTTP_REQUEST = 8192  # an HTTP request line plus headers; the rest of a connection is not read
MAX_ATTESTATION_SIZE = 1 << 20  # the validators' bound of a document
MAX_ANSWER_SIZE = MAX_ATTESTATION_SIZE * 4 // 3 + 1024  # the base64 JSON of the largest document
MAX_CONCURRENT_REQUESTS = 8  # per transport; more are refused (gRPC) or closed (HTTP)
# TPM quotes at once for both transports: the agent's issuing pool (8, shared with its aTLS handshakes)
# keeps room for the chain of trust however hard anyone asks here.
MAX_CONCURRENT_QUOTES = 2
REQUEST_TIMEOUT = 10.0  # seconds an HTTP client may take to send its request
DEFAULT_TIMEOUT = 10.0
CONFIG_KEYS = ("verify_grpc_endpoint", "verify_http_endpoint")
_URL_B64 = re.compile(r"^(?:[A-Za-z0-9_-]{4})*(?:[A-Za-z0-9_-]{2}==|[A-Za-z0-9_-]{3}=)?$")

Issue = Callable[[bytes, bytes], bytes]
Log = Callable[..., None]


# --------------------------------------------------------------------------- messages


def _require_grpc():
    # gRPC's C core logs to stderr, where the agent writes JSON lines; failures reach the caller as errors.
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    try:
        import grpc  # pylint: disable=import-outside-toplevel
        from google.protobuf import descriptor_pb2  # noqa: F401 pylint: disable=import-outside-toplevel,unused-import
    except ImportError as err:
        raise ConstellationError("the verification service over gRPC needs the Python packages grpcio and protobuf "
                                 "(Debian: python3-grpcio python3-protobuf): %s" % err) from None
    return grpc


class Messages:
    """``GetAttestationRequest`` and ``GetAttestationResponse`` of ``verify/verifyproto/verify.proto``."""

    def __init__(self):
        _require_grpc()
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # pylint: disable=import-outside-toplevel

        proto = descriptor_pb2.FileDescriptorProto(name="verify/verifyproto/verify.proto", package="verify",
                                                   syntax="proto3")
        field = descriptor_pb2.FieldDescriptorProto
        for name, field_name, number in (("GetAttestationRequest", "nonce", 2),  # 1 (user_data) removed
                                         ("GetAttestationResponse", "attestation", 1)):
            message = proto.message_type.add(name=name)
            message.field.add(name=field_name, json_name=field_name, number=number, type=field.TYPE_BYTES,
                              label=field.LABEL_OPTIONAL)
        service = proto.service.add(name=SERVICE_NAME.split(".")[1])
        service.method.add(name=METHOD_NAME, input_type=".verify.GetAttestationRequest",
                           output_type=".verify.GetAttestationResponse")
        pool = descriptor_pool.DescriptorPool()  # private: never clashes with another verify.proto
        pool.AddSerializedFile(proto.SerializeToString())
        method = pool.FindServiceByName(SERVICE_NAME).FindMethodByName(METHOD_NAME)
        get_class = getattr(message_factory, "GetMessageClass", None)  # protobuf >= 4.22
        if get_class is None:  # Debian 12's 3.21
            get_class = message_factory.MessageFactory(pool).GetPrototype
        self.request = get_class(method.input_type)
        self.response = get_class(method.output_type)
        self.path = "/%s/%s" % (method.containing_service.full_name, method.name)


_MESSAGES: Optional[Messages] = None
_MESSAGES_LOCK = threading.Lock()


def messages() -> Messages:
    global _MESSAGES
    with _MESSAGES_LOCK:
        if _MESSAGES is None:
            _MESSAGES = Messages()
        return _MESSAGES


def nonce_problem(nonce: Any) -> Optional[str]:
    """Why the server refuses this nonce, or None."""
    if not isinstance(nonce, (bytes, bytearray)) or not nonce:
        return "nonce is required to issue attestation"
    if len(nonce) > MAX_NONCE_SIZE:
        return "nonce must be at most %d bytes, got %d" % (MAX_NONCE_SIZE, len(nonce))
    return None


def decode_url_nonce(text: str) -> bytes:
    """Go's ``base64.URLEncoding.DecodeString``: URL-safe alphabet, padded."""
    if len(text) > 4 * MAX_NONCE_SIZE or not _URL_B64.match(text):
        raise InputError("nonce", "URL-safe base64 with padding", text)
    return base64.urlsafe_b64decode(text)


# --------------------------------------------------------------------------- server


class GRPCVerifyServer:
    """``verify.API/GetAttestation`` over plain gRPC on ``bind`` (port 0: any free port). ``limit``: the requests'
    budget (``rate_limit()``; ``serve`` shares one between both transports)."""

    def __init__(self, bind: Tuple[str, int], issue: Issue, log: Optional[Log] = None, limit: Any = None):
        grpc = _require_grpc()
        self._grpc, self._issue, self._log = grpc, issue, log or (lambda event, **fields: None)
        self._limit = limit if limit is not None else rate_limit()
        proto = messages()
        self._response = proto.response
        self._server = grpc.server(
            concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="verify-grpc"),
            maximum_concurrent_rpcs=MAX_CONCURRENT_REQUESTS,
            options=[("grpc.so_reuseport", 0),  # a second agent on the port must fail, not share it
                     ("grpc.max_receive_message_length", MAX_REQUEST_SIZE),
                     ("grpc.max_send_message_length", MAX_ATTESTATION_SIZE + 64),
                     ("grpc.max_connection_idle_ms", 60000),
                     ("grpc.max_connection_age_ms", 300000),
                     ("grpc.keepalive_time_ms", 15000)])  # as Constellation's server
        handler = grpc.unary_unary_rpc_method_handler(self._get_attestation, request_deserializer=proto.request.FromString,
                                                      response_serializer=proto.response.SerializeToString)
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, {METHOD_NAME: handler}),))
        try:
            port = self._server.add_insecure_port(format_endpoint(*bind))
        except RuntimeError as err:  # newer grpcio raise, older ones return 0
            raise OSError("cannot listen on %s: %s" % (format_endpoint(*bind), err)) from None
        if not port:
            raise OSError("cannot listen on %s" % format_endpoint(*bind))
        self.address = (bind[0], port)

    def start(self) -> "GRPCVerifyServer":
        self._server.start()
        self._log("listening", server="verify-grpc", endpoint=format_endpoint(*self.address))
        return self

    def stop(self) -> None:
        self._server.stop(grace=1.0).wait(5)

    def _get_attestation(self, request, context):
        peer = context.peer()
        refused = limited(self._limit, source_ip(peer))
        if refused:
            self._log("verify_refused", level="warning", server="verify-grpc", peer=peer, reason=refused)
            context.abort(self._grpc.StatusCode.RESOURCE_EXHAUSTED, refused)
        problem = nonce_problem(request.nonce)
        if problem:
            self._log("verify_refused", level="warning", server="verify-grpc", peer=peer, reason=problem)
            context.abort(self._grpc.StatusCode.INVALID_ARGUMENT, problem)
        try:
            document = self._issue(VERIFY_USER_DATA, bytes(request.nonce))
        except Exception as err:  # pylint: disable=broad-except
            self._log("verify_failed", level="error", server="verify-grpc", peer=peer, error=str(err)[:300])
            context.abort(self._grpc.StatusCode.INTERNAL, "issuing attestation statement: %s" % err)
        self._log("verify_issued", server="verify-grpc", peer=peer)
        return self._response(attestation=document)


class _LimitedReader:
    """The request side of an HTTP connection, cut off after ``limit`` bytes."""

    def __init__(self, raw, limit: int):
        self._raw, self._left = raw, limit

    def readline(self, size: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        line = self._raw.readline(self._left if size is None or size < 0 else min(size, self._left))
        self._left -= len(line)
        return line

    def read(self, size: int = -1) -> bytes:
        if self._left <= 0:
            return b""
        data = self._raw.read(self._left if size is None or size < 0 else min(size, self._left))
        self._left -= len(data)
        return data

    def close(self) -> None:
        self._raw.close()


class _HTTPHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # one request per connection
    server_version = "constellation-verify"
    timeout = REQUEST_TIMEOUT

    def version_string(self):
        return self.server_version

    def setup(self):
        super().setup()
        self.rfile = _LimitedReader(self.rfile, MAX_HTTP_REQUEST)

    def do_GET(self):  # pylint: disable=invalid-name
        self.server.verify.answer(self)

    do_POST = do_GET  # Go's ServeMux answers any method; a body is never read

    def log_message(self, format, *args):  # pylint: disable=redefined-builtin
        pass  # the service logs JSON lines itself

    def send(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _BoundedHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, bind: Tuple[str, int], verify: "HTTPVerifyServer"):
        self.address_family = socket.AF_INET6 if ":" in bind[0] else socket.AF_INET
        self.verify = verify
        self._slots = threading.BoundedSemaphore(MAX_CONCURRENT_REQUESTS)
        super().__init__(bind, _HTTPHandler)

    def server_bind(self):
        socketserver.TCPServer.server_bind(self)  # no reverse DNS lookup (HTTPServer.server_bind does one)
        self.server_name, self.server_port = self.server_address[:2]

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # busy: the client may retry
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class HTTPVerifyServer:
    """``GET /?nonce=<URL-safe base64>`` -> ``{"data": <std base64 document>}`` on ``bind``; ``limit`` as gRPC's."""

    def __init__(self, bind: Tuple[str, int], issue: Issue, log: Optional[Log] = None, limit: Any = None):
        self._issue, self._log = issue, log or (lambda event, **fields: None)
        self._limit = limit if limit is not None else rate_limit()
        self._httpd = _BoundedHTTPServer(bind, self)
        self.address = self._httpd.server_address[:2]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="verify-http", daemon=True)

    def start(self) -> "HTTPVerifyServer":
        self._thread.start()
        self._log("listening", server="verify-http", endpoint=format_endpoint(*self.address))
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._httpd.shutdown()
        self._httpd.server_close()

    def answer(self, handler: _HTTPHandler) -> None:
        peer = format_endpoint(*handler.client_address[:2])
        refused = limited(self._limit, source_ip(str(handler.client_address[0])))
        if refused:
            return self._refuse(handler, peer, 429, refused)
        if len(handler.requestline) > MAX_REQUEST_SIZE:
            return self._refuse(handler, peer, 414, "request line longer than %d bytes" % MAX_REQUEST_SIZE)
        values = parse_qs(urlsplit(handler.path).query, keep_blank_values=True).get("nonce", [])
        if len(values) != 1 or not values[0]:
            return self._refuse(handler, peer, 400, "nonce parameter is required exactly once")
        try:
            nonce = decode_url_nonce(values[0])
        except InputError:
            return self._refuse(handler, peer, 400, "invalid base64 encoding for nonce: expected URL-safe base64 "
                                                    "with padding")
        problem = nonce_problem(nonce)
        if problem:
            return self._refuse(handler, peer, 400, problem)
        try:
            document = self._issue(VERIFY_USER_DATA, nonce)
        except Exception as err:  # pylint: disable=broad-except
            self._log("verify_failed", level="error", server="verify-http", peer=peer, error=str(err)[:300])
            return handler.send(500, ("issuing attestation statement: %s\n" % err).encode("utf-8", "replace"))
        self._log("verify_issued", server="verify-http", peer=peer)
        body = json.dumps({"data": base64.b64encode(document).decode("ascii")}, separators=(",", ":")) + "\n"
        return handler.send(200, body.encode("ascii"), "application/json")

    def _refuse(self, handler: _HTTPHandler, peer: str, status: int, message: str) -> None:
        self._log("verify_refused", level="warning", server="verify-http", peer=peer, reason=message)
        handler.send(status, (message + "\n").encode("utf-8"))


def serve(grpc_endpoint: Optional[str], http_endpoint: Optional[str], issue: Issue,
          log: Optional[Log] = None) -> List[Any]:
    """Starts the service on the endpoints that are set (``""``/None: off); each has ``stop()``.
    ``issue(user_data, nonce)`` is the agent's issuer (with its deadline)."""
    servers: List[Any] = []
    issue, limit = _bounded(issue), rate_limit()
    try:
        for name, endpoint, kind in (("verify_grpc_endpoint", grpc_endpoint, GRPCVerifyServer),
                                     ("verify_http_endpoint", http_endpoint, HTTPVerifyServer)):
            if not endpoint:
                continue
            address = parse_endpoint(endpoint, name)
            try:
                servers.append(kind(address, issue, log, limit).start())
            except InputError:
                raise
            except ConstellationError as err:
                raise ConstellationError("%s: %s; or set it to \"\" to turn this service off" % (name, err)) from None
            except OSError as err:
                raise ConstellationError("%s %s: %s" % (name, endpoint, err.strerror or err)) from None
    except ConstellationError:
        for server in servers:
            server.stop()
        raise
    return servers


def _bounded(issue: Issue) -> Issue:
    slots = threading.BoundedSemaphore(MAX_CONCURRENT_QUOTES)

    def bounded(user_data: bytes, nonce: bytes) -> bytes:
        if not slots.acquire(timeout=REQUEST_TIMEOUT):
            raise ConstellationError("busy: %d attestations are being issued" % MAX_CONCURRENT_QUOTES)
        try:
            return issue(user_data, nonce)
        finally:
            slots.release()

    return bounded


def config_endpoints(grpc_endpoint: Any, http_endpoint: Any, public_endpoint: str,
                     public_ip: Optional[str] = None) -> Tuple[str, str]:
    """The agent's ``verify_grpc_endpoint`` and ``verify_http_endpoint``: unset means the address of
    the public endpoint with port 9090 / 8080 (as Constellation): its host, or ``public_ip`` where
    ``public_endpoint`` binds all addresses (never 0.0.0.0 by default); ``""`` turns one off."""
    host = parse_endpoint(public_endpoint, "public_endpoint")[0]
    if host in ("0.0.0.0", "::") and public_ip:
        host = public_ip
    result = []
    for name, value, port in (("verify_grpc_endpoint", grpc_endpoint, GRPC_PORT),
                              ("verify_http_endpoint", http_endpoint, HTTP_PORT)):
        if value is None:
            value = format_endpoint(host, port)
        elif not isinstance(value, str):
            raise InputError(name, "host:port, or \"\" to turn it off", type(value).__name__)
        elif value:
            parse_endpoint(value, name)
        result.append(value)
    endpoints = [("public_endpoint", public_endpoint)] + [(n, v) for n, v in zip(CONFIG_KEYS, result) if v]
    seen: List[Tuple[str, str, int]] = []
    for name, value in endpoints:
        host, port = parse_endpoint(value, name)
        for other, other_host, other_port in seen:
            if port == other_port and (host == other_host or {host, other_host} & {"0.0.0.0", "::"}):
                raise InputError(name, "an endpoint other than %s's (%s)" % (other, format_endpoint(other_host, port)),
                                 value)
        seen.append((name, host, port))
    return result[0], result[1]


# --------------------------------------------------------------------------- client


def fetch_attestation(endpoint: str, nonce: bytes, transport: str = "grpc", timeout: float = DEFAULT_TIMEOUT) -> bytes:
    """The attestation document the service at ``endpoint`` issues for ``nonce`` (not yet validated)."""
    address = parse_endpoint(endpoint, "endpoint")
    if transport == "grpc":
        return _fetch_grpc(address, nonce, timeout)
    if transport == "http":
        return _fetch_http(address, nonce, timeout)
    raise InputError("transport", "one of %s" % ", ".join(TRANSPORTS), transport)


def _fetch_grpc(address: Tuple[str, int], nonce: bytes, timeout: float) -> bytes:
    grpc = _require_grpc()
    proto = messages()
    target = format_endpoint(*address)
    channel = grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", MAX_ATTESTATION_SIZE + 64),
                                                     ("grpc.enable_http_proxy", 0)])
    try:
        call = channel.unary_unary(proto.path, request_serializer=proto.request.SerializeToString,
                                   response_deserializer=proto.response.FromString)
        response = call(proto.request(nonce=nonce), timeout=timeout)
    except grpc.RpcError as err:
        code = err.code() if callable(getattr(err, "code", None)) else None
        details = err.details() if callable(getattr(err, "details", None)) else str(err)
        raise ConstellationError("verification service %s (gRPC %s): %s: %s" % (
            target, proto.path, getattr(code, "name", code), str(details)[:300])) from None
    finally:
        channel.close()
    if not response.attestation:
        raise AttestationError("verification service %s answered without an attestation" % target)
    return bytes(response.attestation)


def _fetch_http(address: Tuple[str, int], nonce: bytes, timeout: float) -> bytes:
    import http.client  # pylint: disable=import-outside-toplevel

    target = format_endpoint(*address)
    path = "/?" + urlencode({"nonce": base64.urlsafe_b64encode(nonce).decode("ascii")})
    conn = http.client.HTTPConnection(address[0], address[1], timeout=timeout)
    try:
        conn.request("GET", path, headers={"Accept": "application/json"})
        response = conn.getresponse()
        body = response.read(MAX_ANSWER_SIZE + 1)
        status, content_type = response.status, response.getheader("Content-Type", "")
    except (OSError, http.client.HTTPException) as err:
        raise ConstellationError("verification service %s (HTTP): %s: %s" % (target, type(err).__name__, err)) \
            from None
    finally:
        conn.close()
    if len(body) > MAX_ANSWER_SIZE:
        raise AttestationError("verification service %s (HTTP): the answer is larger than %d bytes"
                               % (target, MAX_ANSWER_SIZE))
    if status != 200:
        text = body[:300].decode("utf-8", "replace").strip()
        raise ConstellationError("verification service %s (HTTP): status %d: %s" % (target, status, text))
    try:
        if not content_type.split(";")[0].strip().lower() == "application/json":
            raise InputError("Content-Type", "application/json", content_type[:100])
        data = load_json(body, "answer", MAX_ANSWER_SIZE)
        if not isinstance(data, dict) or not isinstance(data.get("data"), str) or not data["data"]:
            raise InputError("answer", "a JSON object {\"data\": <base64 attestation>}")
        return base64.b64decode(data["data"], validate=True)
    except (InputError, binascii.Error, ValueError) as err:
        raise AttestationError("verification service %s (HTTP): %s" % (target, err)) from None


def check_attestation(validator: Any, document: bytes, nonce: bytes, timeout: float = 30.0):
    """Validates ``document`` for ``nonce`` (our validator: quote, nonce binding, measurements) and
    requires the user data ``VerifyService``. Returns the Validation; AttestationError otherwise
    (a measurements mismatch keeps its type and its per-PCR table)."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify-check")
    try:
        validation = pool.submit(validator.validate, document, nonce).result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        raise AttestationError("attestation validation timed out after %.1f s" % timeout) from None
    except AttestationError:
        raise
    except ConstellationError as err:
        raise AttestationError(str(err)) from None
    except Exception as err:  # pylint: disable=broad-except
        # A validator choking on hostile input is a refusal, not a crash of the caller.
        raise AttestationError("the document could not be validated: %s: %s" % (type(err).__name__, err)) from None
    finally:
        pool.shutdown(wait=False)
    if not hmac.compare_digest(bytes(validation.user_data), VERIFY_USER_DATA):
        raise AttestationError("the attestation is bound to the user data %r, not %r: not an answer of a "
                               "verification service" % (bytes(validation.user_data)[:64], VERIFY_USER_DATA))
    return validation
