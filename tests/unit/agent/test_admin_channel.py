# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pubapi + admin channel listener on loopback (dummy attestation, real swtpm for the node lock)."""

from __future__ import annotations

import io
import os

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import DummyIssuer, DummyValidator
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.admin import AdminHandlers
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import RemoteError
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.pubapi import PubAPI
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import AgentServerContext, FrameServer


@pytest.fixture
def agent(swtpm, make_core):
    c, _vpn = make_core(swtpm)
    c.load()
    admin = AdminHandlers(c)
    handlers = dict(PubAPI(c, DummyValidator(), admin=admin).handlers())
    handlers.update(admin.handlers())
    tls = AgentServerContext(DummyIssuer(), key_pool_size=0)
    server = FrameServer("pubapi", ("127.0.0.1", 0), handlers, tls=tls).start()
    yield "127.0.0.1:%d" % server.address[1], c
    server.stop()
    tls.close()


def keypair():
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                        serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return key, pem


def connect(endpoint):
    return AgentClient.connect(endpoint, [DummyValidator()])


def test_admin_channel_refused_before_activation(agent):
    endpoint, _core = agent
    key, _pem = keypair()
    with connect(endpoint) as c:
        with pytest.raises(RemoteError, match="only after activation") as info:
            c.admin_auth(key)
        assert info.value.kind == "StateError"
        with pytest.raises(RemoteError, match="only after activation"):
            c.exec_command("true")
        assert c.get_state()["state"] == "AcceptingInit"  # the connection is still usable


def test_exec_put_fetch_after_admin_auth(agent, tmp_path):
    endpoint, _core = agent
    key, pem = keypair()
    with connect(endpoint) as c:
        c.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), pem)
        with pytest.raises(RemoteError) as info:
            c.exec_command("true")
        assert info.value.kind == "AccessDenied"
        assert c.admin_auth(key) == {"authenticated": True}
        res = c.exec_command("cat; echo out; echo err >&2; exit 7", stdin=b"in\n" * 50000)
        assert (res.exit_code, res.stdout, res.stderr) == (7, b"in\n" * 50000 + b"out\n", b"err\n")
        assert c.exec_command(argv=["/bin/echo", "a b"]).stdout == b"a b\n"
        assert c.exec_command("sleep 5", timeout=0.3).exit_code == -9
        data = os.urandom(300000)
        target = str(tmp_path / "f.bin")
        put = c.put_file(io.BytesIO(data), target, mode=0o640)
        assert put["size"] == len(data) and open(target, "rb").read() == data
        assert oct(os.stat(target).st_mode & 0o777) == "0o640"
        sink = io.BytesIO()
        assert c.fetch_file(target, sink)["size"] == len(data) and sink.getvalue() == data
        with pytest.raises(RemoteError, match="readable file"):
            c.fetch_file(str(tmp_path / "missing"), io.BytesIO())
        with pytest.raises(RemoteError, match="existing directory"):
            c.put_file(b"x", str(tmp_path / "no" / "dir"))
        assert c.exec_command("true").exit_code == 0  # still in sync after errors


def test_wrong_admin_key_and_foreign_signature_are_refused(agent):
    endpoint, _core = agent
    key, pem = keypair()
    other, _unused = keypair()
    with connect(endpoint) as c:
        c.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), pem)
        with pytest.raises(RemoteError, match="does not verify") as info:
            c.admin_auth(other)
        assert info.value.kind == "AccessDenied"
    # A signature made for another connection (other server key) does not verify here.
    with connect(endpoint) as c1, connect(endpoint) as c2:
        c2.server_spki_hash = c1.server_spki_hash
        with pytest.raises(RemoteError, match="does not verify"):
            c2.admin_auth(key)
        assert c1.admin_auth(key)["authenticated"]


def test_unknown_method_and_second_activation_name_the_problem(agent):
    endpoint, _core = agent
    _key, pem = keypair()
    with connect(endpoint) as c:
        with pytest.raises(RemoteError, match="method: expected one of"):
            c.call("Shutdown")
        c.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), pem)
        with pytest.raises(RemoteError, match="AcceptingInit; this node is ActivatingNodes"):
            c.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), pem)
