# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The RPC schema: one table of methods from which the server dispatch, the clients, the relay
and docs/protocol.md come; a toy method added through the table alone works end to end."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import schema
from ansible_collections.constellation.cluster.plugins.module_utils.agent.admin import AdminHandlers
from ansible_collections.constellation.cluster.plugins.module_utils.agent.remote_exec import RemoteExec
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import (
    AgentClient,
    PubAPIClient,
    VPNAPIClient,
)
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import RemoteError
from ansible_collections.constellation.cluster.plugins.module_utils.agent.pubapi import PubAPI
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import FrameServer
from ansible_collections.constellation.cluster.plugins.module_utils.agent.vpnapi import VPNAPI
from ansible_collections.constellation.cluster.plugins.plugin_utils.atls import relay

ROOT = Path(__file__).resolve().parents[3]


def test_docs_method_tables_are_the_generated_ones():
    """Every generated block of docs/protocol.md (the method table, the listeners' table) is what the schema makes
    now, and no hand-written table row there names a method (it would be a list the schema does not keep)."""
    text = (ROOT / "docs" / "protocol.md").read_text()
    documented = text.split("<!-- methods:begin -->\n", 1)[1].split("<!-- methods:end -->", 1)[0]
    assert documented == schema.markdown_table()
    assert text == schema.render_markdown(text), "docs/protocol.md: regenerate its tables (schema.render_markdown)"
    hand_written = text
    for name in schema.MARKDOWN_BLOCKS:
        head, rest = hand_written.split("<!-- %s:begin -->" % name, 1)
        hand_written = head + rest.split("<!-- %s:end -->" % name, 1)[1]
    rows = [line for line in hand_written.splitlines() if line.startswith("|")]
    listing = [row for row in rows if row.split("|")[1].strip().strip("`") in schema.METHODS]
    assert not listing, listing


def test_the_generated_docs_follow_the_schema():
    """A method added to the schema appears in every generated table, and a stale copy is refused."""
    text = (ROOT / "docs" / "protocol.md").read_text()
    schema.register(schema.Method("Echo", schema.VPNAPI, schema.Empty, schema.Empty, schema.STREAMS_NONE, "a test method",
                                  access=schema.Access(schema.CALLER_PEER, schema.SERVED_COORDINATOR)))
    try:
        fresh = schema.render_markdown(text)
        assert fresh != text
        assert "`GetMeasurements`, `Echo` |" in schema.markdown_listeners() and "| `Echo` | vpnapi |" in fresh
    finally:
        schema.unregister("Echo")
    with pytest.raises(ValueError, match="no generated block listeners"):
        schema.render_markdown(text.replace("<!-- listeners:begin -->", ""))


def test_every_api_handler_set_equals_the_table():
    served = {"pubapi": set(PubAPI().handlers()), "vpnapi": set(VPNAPI().handlers()),
              "admin": set(AdminHandlers().handlers()) | set(RemoteExec(warm_interpreters=False).handlers())}
    for api, names in served.items():
        assert names == {m.name for m in schema.methods_of(api)}, api


def test_relay_passes_on_what_the_table_says():
    relayed, with_stdin = relay.relayed_methods()
    assert set(relayed) == {"Exec", "ExecModule", "PutFile", "FetchFile", "GetState"}  # an allowlist: no new method by default
    assert set(with_stdin) == {"Exec", "ExecModule", "PutFile"}


def test_server_refuses_to_start_when_handlers_and_table_differ():
    with pytest.raises(ValueError, match="missing"):
        FrameServer("vpnapi", ("127.0.0.1", 0), {"GetUpdate": lambda c, r: None}, apis=(schema.VPNAPI,))


def test_records_decode_strictly_and_never_echo_values():
    with pytest.raises(InputError, match="^kms_uri: expected a value"):
        schema.RecoverRequest.decode({})
    with pytest.raises(InputError) as err:
        schema.ActivateAsCoordinatorRequest.decode({"kms_uri": ["kms://cluster-kms?key=SECRETSECRET"],
                                                    "measurement_salt": "A" * 44, "admin_pub_key": "k"})
    assert str(err.value) == "kms_uri: expected a string, got 'list'"
    with pytest.raises(InputError, match="resource_version: expected an integer, got 'bool'"):
        schema.GetUpdateRequest.decode({"resource_version": True})
    with pytest.raises(InputError, match="node_vpn_pub_key: expected standard base64 of 32 bytes"):
        schema.IssueJoinTicketRequest.decode({"disk_uuid": "u", "node_vpn_pub_key": "AAAA"})
    record = schema.GetDataKeyRequest.decode({"data_key_id": "x", "unknown": 1})
    assert record == schema.GetDataKeyRequest("x", None) and record.encode() == {"data_key_id": "x"}


# ------------------------------------------------------------------ a toy method, through the table only


@dataclass(frozen=True)
class EchoRequest(schema.Record):
    text: str = schema.wire("str", True)
    blob: bytes = schema.wire("b64", False, 4)


@dataclass(frozen=True)
class EchoAnswer(schema.Record):
    text: str = schema.wire("str", True)
    size: int = schema.wire("int", True)


@pytest.fixture
def echo_method():
    method = schema.register(schema.Method("Echo", schema.VPNAPI, EchoRequest, EchoAnswer, schema.STREAMS_NONE,
                                           "a test method", access=schema.Access(schema.CALLER_ANYONE,
                                                                                 schema.SERVED_ALWAYS)))
    yield method
    schema.unregister("Echo")


@pytest.fixture
def vpn_server(echo_method):
    def echo(conn, request: EchoRequest):
        conn.stream.send_result(EchoAnswer(request.text.upper(), len(request.blob or b"")).encode())

    def get_update(conn, request: schema.GetUpdateRequest):
        conn.stream.send_result({"resource_version": request.resource_version})

    handlers = dict(dict.fromkeys(m.name for m in schema.methods_of(schema.VPNAPI)), Echo=echo, GetUpdate=get_update)
    # A stand-in vpnapi without a Core: its GetUpdate answers anyone.
    server = FrameServer("vpnapi", ("127.0.0.1", 0), handlers, apis=(schema.VPNAPI,), insecure_skip_access_checks=True).start()
    yield "127.0.0.1:%d" % server.address[1]
    server.stop()


def test_toy_method_registered_in_the_table_is_served_and_called(vpn_server):
    with VPNAPIClient(socket.create_connection(("127.0.0.1", int(vpn_server.split(":")[1])), timeout=5)) as client:
        assert client.invoke("Echo", text="hi", blob=b"1234") == {"text": "HI", "size": 4}
        with pytest.raises(RemoteError, match="blob: expected standard base64 of 4 bytes") as err:
            client.call("Echo", {"text": "hi", "blob": "AA=="})  # decoded by the server before the handler
        assert err.value.kind == "InputError"
        assert client.get_update(7) == {"resource_version": 7}  # the connection goes on
    assert "`Echo` | vpnapi" in schema.markdown_table()


def test_server_refuses_other_apis_methods_naming_its_own(vpn_server):
    with AgentClient.connect_plain(vpn_server, timeout=5) as client:
        with pytest.raises(RemoteError) as err:
            client.get_state()
        assert err.value.kind == "InputError"
        assert ("method: expected one of Echo, GetCertificateKey, GetDataKey, GetJoinArgs, GetMeasurements, "
                "GetStateDiskKey, GetUpdate, PeerAuth") in str(err.value)


def test_client_refuses_a_method_of_another_api(vpn_server):
    with PubAPIClient(socket.create_connection(("127.0.0.1", int(vpn_server.split(":")[1])), timeout=5)) as client:
        with pytest.raises(InputError, match="method: expected one of"):
            client.invoke("GetUpdate", resource_version=1)


def test_one_declaration_makes_a_methods_records():
    request, answer = schema.declare("Echo", schema.VPNAPI, schema.STREAMS_NONE,
                                     schema.Access(schema.CALLER_PEER, schema.SERVED_COORDINATOR), "a test method",
                                     request=schema.spec("text str!: what to echo", "blob b64(4)"),
                                     answer=schema.GetMeasurementsAnswer)
    try:
        assert (request.__name__, answer) == ("EchoRequest", schema.GetMeasurementsAnswer)
        assert schema.METHODS["Echo"].request is request
        assert request.describe() == "`text` str, `blob?` b64(4)"
        assert request.decode({"text": "hi", "blob": "AAAAAA=="}) == request("hi", bytes(4))
        with pytest.raises(InputError, match="^text: expected a value"):
            request.decode({"blob": "AAAAAA=="})
    finally:
        schema.unregister("Echo")
    with pytest.raises(ValueError, match="field 'text: a string' is not"):
        schema.record("Bad", schema.spec("text: a string"))
