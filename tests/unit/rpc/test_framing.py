# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Frames: round trips, bounds, versions, explicit EOF/END."""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.rpc import framing
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import (
    CHANNEL_STDIN, CHANNEL_STDOUT, KIND_DATA, KIND_END, KIND_EOF, KIND_MSG, FrameStream, ProtocolError, RemoteError)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import StateError


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    a.settimeout(5)
    b.settimeout(5)
    yield FrameStream(a), FrameStream(b)
    a.close()
    b.close()


def test_round_trip_of_every_kind(pair):
    left, right = pair

    def send():
        left.send_request("Exec", {"cmd": "true"})
        left.send_data(CHANNEL_STDIN, b"x" * (framing.DATA_CHUNK + 5))
        left.send_eof(CHANNEL_STDIN)
        left.send_result({"exit_code": 3})

    sender = threading.Thread(target=send)
    sender.start()
    frame = right.recv()
    assert (frame.kind, frame.message) == (KIND_MSG, {"method": "Exec", "params": {"cmd": "true"}})
    got = []
    assert right.recv_data_until_eof(CHANNEL_STDIN, got.append) == framing.DATA_CHUNK + 5
    assert [len(c) for c in got] == [framing.DATA_CHUNK, 5]
    assert right.recv_end() == {"exit_code": 3}
    sender.join(5)


def test_error_end_raises_remote_error_with_kind_and_message(pair):
    left, right = pair
    left.send_error(StateError("ActivateAsCoordinator: node is in state ActivatingNodes, expected AcceptingInit"))
    with pytest.raises(RemoteError) as info:
        right.recv_end()
    assert info.value.kind == "StateError"
    assert "expected AcceptingInit" in str(info.value)


def test_internal_errors_do_not_leak_their_text(pair):
    left, right = pair
    left.send_error(KeyError("secret-material"))
    with pytest.raises(RemoteError) as info:
        right.recv_end()
    assert "secret-material" not in str(info.value)
    assert info.value.kind == "InternalError"


def test_other_version_is_refused_by_name(pair):
    left, right = pair
    left.sock.sendall(struct.pack(">2sBBI", b"CL", 2, KIND_MSG, 2) + b"{}")
    with pytest.raises(ProtocolError, match="unsupported protocol version 2"):
        right.recv()


def test_bad_magic_is_refused(pair):
    left, right = pair
    left.sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
    with pytest.raises(ProtocolError, match="magic"):
        right.recv()


def test_oversized_json_header_is_refused_before_reading_payload(pair):
    left, right = pair
    left.sock.sendall(struct.pack(">2sBBI", b"CL", 1, KIND_MSG, framing.MAX_JSON + 1))
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        right.recv()


def test_oversized_data_header_is_refused(pair):
    left, right = pair
    left.sock.sendall(struct.pack(">2sBBI", b"CL", 1, KIND_DATA, framing.MAX_PAYLOAD + 1))
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        right.recv()


def test_sender_refuses_oversized_json():
    with pytest.raises(ProtocolError):
        framing.encode_json({"x": "a" * framing.MAX_JSON})


def test_non_object_json_and_unknown_channel_are_refused(pair):
    left, right = pair
    left.sock.sendall(framing.encode_frame(KIND_MSG, b"[1]"))
    with pytest.raises(ProtocolError, match="JSON object"):
        right.recv()
    left.sock.sendall(framing.encode_frame(KIND_EOF, b"\x07"))
    with pytest.raises(ProtocolError, match="unknown channel"):
        right.recv()


def test_truncated_frame_is_a_protocol_error_and_clean_close_is_connection_closed(pair):
    left, right = pair
    left.sock.sendall(framing.encode_frame(KIND_END, b'{"result":{}}')[:-3])
    left.sock.shutdown(socket.SHUT_WR)
    with pytest.raises(ProtocolError, match="middle of a frame"):
        right.recv()
    a, b = socket.socketpair()
    a.close()
    with pytest.raises(framing.ConnectionClosed):
        FrameStream(b).recv()
    b.close()


def test_data_on_wrong_channel_is_refused(pair):
    left, right = pair
    left.send_data(CHANNEL_STDOUT, b"x")
    with pytest.raises(ProtocolError, match="channel 0"):
        right.recv_data_until_eof(CHANNEL_STDIN, lambda _d: None)


def test_end_without_result_or_error_is_refused(pair):
    left, right = pair
    left.sock.sendall(framing.encode_frame(KIND_END, b"{}"))
    with pytest.raises(ProtocolError):
        right.recv_end()


def test_b64d_checks_size_and_alphabet():
    assert framing.b64d(framing.b64e(b"a" * 32), "k", 32) == b"a" * 32
    with pytest.raises(Exception, match="32 bytes"):
        framing.b64d(framing.b64e(b"a" * 31), "k", 32)
    with pytest.raises(Exception, match="base64"):
        framing.b64d("***", "k")


def test_error_reason_travels_with_the_end_frame():
    import socket as socket_mod

    from ansible_collections.constellation.cluster.plugins.module_utils.errors import StateError
    from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import (
        FrameStream, RemoteError, raise_for_end)

    left, right = socket_mod.socketpair()
    try:
        FrameStream(left).send_error(StateError("not now").with_reason("not_waiting_for_recovery"))
        frame = FrameStream(right).recv()
        with pytest.raises(RemoteError) as err:
            raise_for_end(frame.message)
        assert err.value.kind == "StateError" and err.value.reason == "not_waiting_for_recovery"
        assert str(err.value) == "not now"
    finally:
        left.close()
        right.close()
