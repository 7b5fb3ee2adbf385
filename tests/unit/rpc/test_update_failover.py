# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A Node asks the next Coordinator it knows when its own does not answer (#18): real vpnapi-style
servers on loopback, one of them gone."""

from __future__ import annotations

import io

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.agent.json_log import JSONLog
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import ask_in_turn
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import RemoteError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import FrameServer
from lab.etcd import free_ports


def _server(answer):
    def get_update(conn, request):
        if answer is None:
            raise ConstellationError("GetUpdate: refused by this Coordinator")
        conn.stream.send_result({"resource_version": answer})

    return FrameServer("vpnapi", ("127.0.0.1", 0), {"GetUpdate": get_update}, log=JSONLog(io.StringIO()),
                       insecure_skip_access_checks=True).start()


def _endpoint(server):
    return "%s:%d" % server.address


def test_the_next_coordinator_answers_when_the_first_is_gone():
    live = _server(7)
    (gone,) = free_ports(1)
    try:
        endpoint, answer = ask_in_turn(["127.0.0.1:%d" % gone, _endpoint(live)],
                                       lambda client: client.get_update(3), timeout=2)
        assert endpoint == _endpoint(live) and answer == {"resource_version": 7}
        # The first that answers is asked, the others not.
        endpoint, answer = ask_in_turn([_endpoint(live), "127.0.0.1:%d" % gone], lambda client: client.get_update(3), 2)
        assert endpoint == _endpoint(live)
    finally:
        live.stop()


def test_none_answering_is_the_last_connection_error():
    first, second = free_ports(2)
    with pytest.raises(ConstellationError) as info:
        ask_in_turn(["127.0.0.1:%d" % first, "127.0.0.1:%d" % second], lambda client: client.get_update(0), 2)
    assert "cannot connect to 127.0.0.1:%d" % second in str(info.value)
    with pytest.raises(ConstellationError, match="no Coordinator VPN IP is known"):
        ask_in_turn([], lambda client: client.get_update(0), 2)


def test_an_answered_error_is_not_passed_over():
    """A Coordinator that answers with an error (an evicted Node, say) is not a dead one: no failover."""
    refusing, live = _server(None), _server(9)
    try:
        with pytest.raises(RemoteError, match="refused by this Coordinator"):
            ask_in_turn([_endpoint(refusing), _endpoint(live)], lambda client: client.get_update(0), 2)
    finally:
        refusing.stop()
        live.stop()
