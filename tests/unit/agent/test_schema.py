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


def test_docs_method_table_is_the_generated_one():
    text = (ROOT / "docs" / "protocol.md").read_text()
    documented = text.split("<!-- methods:begin -->\n", 1)[1].split("<!-- methods:end -->", 1)[0]
    assert documented == schema.markdown_table()


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

    handlers = {"Echo": echo, "GetUpdate": get_update, "PeerAuth": None, "GetJoinArgs": None, "GetCertificateKey": None,
                "GetDataKey": None, "GetStateDiskKey": None, "GetMeasurements": None}
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
