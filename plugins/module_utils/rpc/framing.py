# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Frames of the agent's wire protocol (docs/protocol.md).

Every frame is an 8-byte header and a payload::

    magic "CL" (2) | version (1) | kind (1) | payload length (4, big-endian)

Kinds: MSG (a JSON object: requests and intermediate steps), DATA (a channel byte and raw
bytes: file contents, stdin, stdout, stderr), EOF (a channel byte: that channel has ended;
closing a TLS stream cannot say this), END (a JSON object with ``result`` or ``error``: the
answer to a request is complete). Payloads are bounded (16 MiB; JSON 1 MiB) so a peer can
never make us allocate without limit. A frame of another version is refused with a message
naming both versions.

Binary values inside JSON are standard base64 with padding. Plain Python, blocking sockets;
one thread per connection uses a stream at a time.
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
from dataclasses import dataclass
from typing import Any, Dict, Optional

from ansible_collections.constellation.cluster.plugins.module_utils import encoding
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    ConnectionLost,
    ConstellationError,
    InputError,
)

MAGIC = b"CL"
VERSION = 1
HEADER = struct.Struct(">2sBBI")
MAX_PAYLOAD = 16 * 1024 * 1024
MAX_JSON = 1024 * 1024
DATA_CHUNK = 64 * 1024

KIND_MSG = 1
KIND_DATA = 2
KIND_EOF = 3
KIND_END = 4
KIND_NAMES = {KIND_MSG: "MSG", KIND_DATA: "DATA", KIND_EOF: "EOF", KIND_END: "END"}

CHANNEL_STDIN = 0  # also: file content sent by the client (PutFile)
CHANNEL_STDOUT = 1  # also: file content sent by the server (FetchFile)
CHANNEL_STDERR = 2
CHANNELS = (CHANNEL_STDIN, CHANNEL_STDOUT, CHANNEL_STDERR)


class ProtocolError(ConstellationError):
    """The peer broke the framing or the message sequence."""


class RemoteError(ConstellationError):
    """The peer answered a request with an error; ``kind`` is its error class name."""

    def __init__(self, kind: str, message: str):
        self.kind = kind
        super().__init__(message)


class MalformedMessage(ProtocolError):
    """A whole MSG or END frame was read, but its JSON was refused (not UTF-8 JSON, not an object,
    nested too deep): the stream is still in step, so a server answers it and reads on."""


class ConnectionClosed(ProtocolError, ConnectionLost):
    """The peer closed the connection at a frame boundary."""


@dataclass(frozen=True)
class Frame:
    kind: int
    channel: int = 0
    data: bytes = b""
    message: Optional[Dict[str, Any]] = None

    @property
    def kind_name(self) -> str:
        return KIND_NAMES.get(self.kind, str(self.kind))


def b64e(data: bytes) -> str:
    return encoding.b64encode(data)


def b64d(value: Any, field: str, size: Optional[int] = None, max_size: int = MAX_JSON) -> bytes:
    """Strict std-base64 of a JSON field, optionally of an exact size (encoding.b64decode)."""
    return encoding.b64decode(value, field, size, max_size)


def encode_frame(kind: int, payload: bytes) -> bytes:
    if kind not in KIND_NAMES:
        raise ProtocolError("unknown frame kind %r" % kind)
    if len(payload) > MAX_PAYLOAD:
        raise ProtocolError("frame payload of %d bytes exceeds the limit of %d" % (len(payload), MAX_PAYLOAD))
    return HEADER.pack(MAGIC, VERSION, kind, len(payload)) + payload


def encode_json(obj: Dict[str, Any]) -> bytes:
    data = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode("utf-8")
    if len(data) > MAX_JSON:
        raise ProtocolError("JSON message of %d bytes exceeds the limit of %d" % (len(data), MAX_JSON))
    return data


def decode_header(header: bytes):
    if len(header) != HEADER.size:
        raise ProtocolError("frame header must be %d bytes, got %d" % (HEADER.size, len(header)))
    magic, version, kind, length = HEADER.unpack(header)
    if magic != MAGIC:
        raise ProtocolError("not a constellation agent frame (magic %r, expected %r)" % (magic, MAGIC))
    if version != VERSION:
        raise ProtocolError("unsupported protocol version %d (this side speaks %d)" % (version, VERSION))
    if kind not in KIND_NAMES:
        raise ProtocolError("unknown frame kind %d" % kind)
    limit = MAX_JSON if kind in (KIND_MSG, KIND_END) else MAX_PAYLOAD
    if length > limit:
        raise ProtocolError("%s frame of %d bytes exceeds the limit of %d" % (KIND_NAMES[kind], length, limit))
    if kind == KIND_EOF and length != 1:
        raise ProtocolError("EOF frame must carry exactly one channel byte, got %d bytes" % length)
    if kind == KIND_DATA and length < 1:
        raise ProtocolError("DATA frame must carry a channel byte")
    return kind, length


def decode_payload(kind: int, payload: bytes) -> Frame:
    if kind in (KIND_MSG, KIND_END):
        try:
            message = encoding.load_json(bytes(payload), "%s frame" % KIND_NAMES[kind], MAX_JSON)
        except InputError as err:
            raise MalformedMessage("%s frame is not valid UTF-8 JSON within bounds: %s" % (KIND_NAMES[kind], err)) from None
        if not isinstance(message, dict):
            raise MalformedMessage("%s frame must hold a JSON object, got %s" % (KIND_NAMES[kind], type(message).__name__))
        return Frame(kind, message=message)
    if not payload:
        raise ProtocolError("%s frame must carry a channel byte" % KIND_NAMES.get(kind, kind))
    channel = payload[0]
    if channel not in CHANNELS:
        raise ProtocolError("unknown channel %d" % channel)
    return Frame(kind, channel=channel, data=bytes(payload[1:]))


class FrameStream:
    """Frames over one connected (TLS or plain) socket."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    # -- sending
    def _send(self, kind: int, payload: bytes) -> None:
        try:
            self.sock.sendall(encode_frame(kind, payload))
        except (OSError, ssl.SSLError) as err:
            raise ConnectionClosed("connection lost while sending: %s" % (err or type(err).__name__)) from None

    def send_msg(self, message: Dict[str, Any]) -> None:
        self._send(KIND_MSG, encode_json(message))

    def send_request(self, method: str, params: Optional[Dict[str, Any]] = None) -> None:
        self.send_msg({"method": method, "params": params or {}})

    def send_data(self, channel: int, data: bytes) -> None:
        """Sends data in chunks of at most DATA_CHUNK bytes (empty data sends nothing)."""
        if channel not in CHANNELS:
            raise ProtocolError("unknown channel %r" % channel)
        view = memoryview(data)
        for start in range(0, len(view), DATA_CHUNK):
            self._send(KIND_DATA, bytes([channel]) + bytes(view[start:start + DATA_CHUNK]))

    def send_eof(self, channel: int) -> None:
        self._send(KIND_EOF, bytes([channel]))

    def send_result(self, result: Optional[Dict[str, Any]] = None) -> None:
        self._send(KIND_END, encode_json({"result": result or {}}))

    def send_error(self, err: BaseException) -> None:
        kind = type(err).__name__ if isinstance(err, ConstellationError) else "InternalError"
        message = str(err) if isinstance(err, ConstellationError) else "internal error (%s)" % type(err).__name__
        if isinstance(err, RemoteError):
            kind = err.kind
        error = {"kind": kind, "message": message}
        if isinstance(err, ConstellationError) and isinstance(err.reason, str):
            error["reason"] = err.reason
        self._send(KIND_END, encode_json({"error": error}))

    # -- receiving
    def _recv_exact(self, size: int, at_boundary: bool) -> bytes:
        chunks = []
        remaining = size
        while remaining:
            try:
                chunk = self.sock.recv(min(remaining, 1 << 20))
            except socket.timeout:
                raise ProtocolError("timed out waiting for the peer") from None
            except (OSError, ssl.SSLError) as err:
                raise ConnectionClosed("connection lost while receiving: %s" % (err or type(err).__name__)) from None
            if not chunk:
                if at_boundary and remaining == size:
                    raise ConnectionClosed("peer closed the connection")
                raise ProtocolError("peer closed the connection in the middle of a frame")
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def recv(self) -> Frame:
        kind, length = decode_header(self._recv_exact(HEADER.size, True))
        return decode_payload(kind, self._recv_exact(length, False) if length else b"")

    def recv_msg(self, what: str = "message") -> Dict[str, Any]:
        """The next frame must be a MSG; an END with an error raises it as RemoteError."""
        frame = self.recv()
        if frame.kind == KIND_MSG:
            return frame.message
        if frame.kind == KIND_END:
            raise_for_end(frame.message)
            raise ProtocolError("expected %s, got the end of the answer" % what)
        raise ProtocolError("expected %s, got a %s frame" % (what, frame.kind_name))

    def recv_end(self) -> Dict[str, Any]:
        """The next frame must be END; returns its result or raises its error."""
        frame = self.recv()
        if frame.kind != KIND_END:
            raise ProtocolError("expected the end of the answer, got a %s frame" % frame.kind_name)
        return raise_for_end(frame.message)

    def recv_data_until_eof(self, channel: int, sink, limit: Optional[int] = None) -> int:
        """Reads DATA frames of one channel into sink(bytes) until its EOF; returns the size."""
        total = 0
        while True:
            frame = self.recv()
            if frame.kind == KIND_EOF and frame.channel == channel:
                return total
            if frame.kind == KIND_DATA and frame.channel == channel:
                total += len(frame.data)
                if limit is not None and total > limit:
                    raise ProtocolError("more than %d bytes on channel %d" % (limit, channel))
                sink(frame.data)
                continue
            if frame.kind == KIND_END:
                raise_for_end(frame.message)
            raise ProtocolError("expected DATA or EOF on channel %d, got a %s frame" % (channel, frame.kind_name))


def raise_for_end(message: Dict[str, Any]) -> Dict[str, Any]:
    if "error" in message:
        error = message.get("error") or {}
        kind = str(error.get("kind", "Error")) if isinstance(error, dict) else "Error"
        text = str(error.get("message", "")) if isinstance(error, dict) else str(error)
        reason = error.get("reason") if isinstance(error, dict) else None
        raise RemoteError(kind, text or kind).with_reason(reason if isinstance(reason, str) else None)
    result = message.get("result")
    if not isinstance(result, dict):
        raise ProtocolError("END frame holds neither result nor error")
    return result


def request_of(message: Dict[str, Any]):
    """(method, params) of a request MSG, validated."""
    method = message.get("method")
    params = message.get("params", {})
    if not isinstance(method, str) or not method:
        raise InputError("method", "a method name")
    if not isinstance(params, dict):
        raise InputError("params", "a JSON object", type(params).__name__)
    return method, params
