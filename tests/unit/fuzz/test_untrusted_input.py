# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Foreign exceptions a parser could raise, one test each: documented errors naming the field,
with bounded nesting; a bad RPC frame gets an END error and the connection goes on; a crash in a
connection thread is one JSON log line."""

from __future__ import annotations

import base64
import io
import json
import socket

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils import encoding, kms
from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import AgentConfig
from ansible_collections.constellation.cluster.plugins.module_utils.agent.json_log import JSONLog
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import Measurements
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import load_policy_file
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError, InputError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import framing
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import FrameServer
from ansible_collections.constellation.cluster.tests.unit.fuzz.targets import KMS_KEY, KMS_SALT, NONCE

ZERO = "00" * 32
DEEP_JSON = "[" * 100000 + "]" * 100000


def _document_with(corpus, change) -> bytes:
    doc = json.loads(corpus.document)
    change(doc)
    return json.dumps(doc).encode()


def test_quote_hash_of_another_type_is_an_attestation_error(corpus):
    def change(doc):
        for quote in doc["Attestation"]["quotes"]:
            quote["pcrs"]["hash"] = [quote["pcrs"]["hash"]]

    with pytest.raises(AttestationError, match="no SHA-256 quote"):
        corpus.validator.validate(_document_with(corpus, change), NONCE)


@pytest.mark.parametrize("key", ["²", "٣", "1" * 5000, "04"])
def test_odd_pcr_keys_in_the_document_are_refused(corpus, key):
    def change(doc):
        pcrs = doc["Attestation"]["quotes"][-1]["pcrs"]
        pcrs["pcrs"][key] = pcrs["pcrs"].pop("4")

    sha256_last = _document_with(corpus, lambda doc: doc["Attestation"]["quotes"].sort(key=lambda q: q["pcrs"]["hash"] == 11))
    corpus_doc = json.loads(sha256_last)
    change(corpus_doc)
    with pytest.raises(AttestationError, match="PCR index"):
        corpus.validator.validate(json.dumps(corpus_doc).encode(), NONCE)


@pytest.mark.parametrize("data", [DEEP_JSON.encode(), b'{"a":' * 50000 + b"1" + b"}" * 50000, b"\xff\xfe{}", b"[NaN]", b"9" * 5000])
def test_hostile_json_documents_are_attestation_errors(corpus, data):
    with pytest.raises(AttestationError, match="attestation document"):
        corpus.validator.validate(data, NONCE)


@pytest.mark.parametrize("key", ["²", "٣", "1" * 5000, True, 4.0, None])
def test_measurements_refuse_odd_keys_with_an_input_error(key):
    with pytest.raises(InputError, match="PCR index"):
        Measurements.from_dict({key: ZERO})


def test_measurements_unknown_keys_of_mixed_types():
    with pytest.raises(InputError, match="only the keys expected and warnOnly"):
        Measurements.from_dict({"4": {"expected": ZERO, True: 1, "x": 2}})


@pytest.mark.parametrize("content,expected", [
    (b"\xff\xfe\x00\x004: x", "UTF-8"),
    (b"[" * 5000, "nested at most"),
    (b"4: " + b"[" * 5000, "nested at most"),
    (("4: {expected: %s}\ntrue: {expected: %s}\n" % (ZERO, ZERO)).encode(), "keys that are strings or integers"),
    (b"a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     b"c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
     b"e: [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n", "elements"),
    (b"x" * (encoding.MAX_DOCUMENT + 1), "at most"),
])
def test_policy_files_refused_with_input_errors(tmp_path, content, expected):
    path = tmp_path / "policy.yml"
    path.write_bytes(content)
    with pytest.raises(InputError, match=expected) as err:
        load_policy_file(str(path))
    assert err.value.field == "measurements_file"


def test_policy_yaml_with_integer_pcr_keys_still_loads(tmp_path):
    path = tmp_path / "policy.yml"
    path.write_text("4: {expected: '%s'}\n'9': '%s'\n" % (ZERO, ZERO))
    assert sorted(load_policy_file(str(path)).pcrs) == [4, 9]


@pytest.mark.parametrize("content,expected", [
    (b"\xc3\x28state_dir: /x", "UTF-8"),
    (b"{" * 3000, "nested at most"),
    (b"state_dir: /x\ntrue: 1\n", "keys that are strings"),
    (b"state_dir: /x\nmeasurements: [1]\n", "measurements"),
    (b"state_dir: /x\ntcti: 5\n", "tcti"),
    (b"state_dir: /x\nek_ca: [a, 1]\n", "ek_ca"),
])
def test_agent_config_refused_with_input_errors(tmp_path, content, expected):
    path = tmp_path / "agent.yml"
    path.write_bytes(content)
    with pytest.raises(InputError, match=expected):
        AgentConfig.load(str(path))


@pytest.mark.parametrize("uri", [
    "kms:/cluster-kms?key={key}&salt={salt}",
    "kms://cluster-kms&key={key}&salt={salt}",
    "kms://cluster-kms?key={key}&{salt}",
    "kms://cluster-kms?key={key}&{key13}=1&salt={salt}",
    "kms://cluster-kms?{key}={salt}",
    "{key20}://cluster-kms?key={key}",
    "kms://{key20}?key={key}",
])
def test_kms_uri_errors_hold_no_key_material(uri):
    key, salt = (base64.urlsafe_b64encode(v).decode() for v in (KMS_KEY, KMS_SALT))
    uri = uri.format(key=key, salt=salt, key13=key[:13], key20=key[:20])
    with pytest.raises(InputError) as err:
        kms.open_kms(uri)
    text = str(err.value)
    for secret in (key, salt, key[:13], key[13:26], salt[:13]):
        assert secret not in text


# ----------------------------------------------------------------------------- RPC server


@pytest.fixture
def server():
    lines = io.StringIO()
    log = JSONLog(lines)

    def get_state(conn, _request):
        conn.stream.send_result({"state": "AcceptingInit", "state_code": 1, "role": "none"})

    srv = FrameServer("test", ("127.0.0.1", 0), {"GetState": get_state}, log=log).start()
    srv.lines = lines
    yield srv
    srv.stop()


def _connect(srv) -> framing.FrameStream:
    sock = socket.create_connection(srv.address, timeout=10)
    return framing.FrameStream(sock)


@pytest.mark.parametrize("payload", [DEEP_JSON[:framing.MAX_JSON // 2 * 2].encode()[:framing.MAX_JSON],
                                     b'{"method": "GetState", "params": ' + b"[" * 50000 + b"]" * 50000 + b"}",
                                     b"\xff\xfe", b"[1, 2]", b'{"n": 1' + b"0" * 5000 + b"}"])
def test_a_bad_msg_frame_gets_an_end_error_and_the_connection_goes_on(server, payload):
    stream = _connect(server)
    try:
        stream.sock.sendall(framing.encode_frame(framing.KIND_MSG, payload))
        with pytest.raises(framing.RemoteError) as err:
            stream.recv_end()
        assert err.value.kind == "MalformedMessage" and "MSG frame" in str(err.value)
        stream.send_request("GetState")
        assert stream.recv_end()["state"] == "AcceptingInit"
    finally:
        stream.sock.close()
    assert "connection_crashed" not in server.lines.getvalue()


def test_a_crash_in_a_connection_thread_is_one_json_log_line(capfd):
    lines = io.StringIO()

    def broken_check(peer):
        raise TypeError("an unexpected bug")

    srv = FrameServer("test", ("127.0.0.1", 0), {}, log=JSONLog(lines), accept_check=broken_check).start()
    try:
        sock = socket.create_connection(srv.address, timeout=10)
        assert sock.recv(1) == b""  # the server closed this connection
        sock.close()
        ok = socket.create_connection(srv.address, timeout=10)  # and still accepts the next one
        assert ok.recv(1) == b""
        ok.close()
    finally:
        srv.stop()
    crashes = [json.loads(line) for line in lines.getvalue().splitlines() if "connection_crashed" in line]
    assert len(crashes) == 2
    assert crashes[0]["error"] == "TypeError" and crashes[0]["level"] == "error" and "where" in crashes[0]
    assert "Traceback" not in capfd.readouterr().err
