# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pubapi + admin channel listener on loopback (dummy attestation, real swtpm for the node lock)."""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import sys
import time
import zipfile

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.module_utils.agent.execution.warm import WarmUnavailable, content_digest
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import DummyIssuer, DummyValidator
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import RemoteError
from ansible_collections.constellation.cluster.plugins.module_utils.agent.remote_exec import RemoteExec
from ansible_collections.constellation.cluster.plugins.module_utils.agent.wiring import admin_handlers, pubapi_handlers
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import AgentServerContext, FrameServer
from ansible_collections.constellation.cluster.tests.support.core_fakes import pubapi_server
from ansible_collections.constellation.cluster.plugins.module_utils.agent.peer_view import CorePeerView


@pytest.fixture
def agent(swtpm, make_core):
    c, _vpn = make_core(swtpm)
    c.recovery.load()
    with pubapi_server(c) as server:
        yield "127.0.0.1:%d" % server.address[1], c


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


# --------------------------------------------------------------------------- ExecModule (warm interpreters)

PYTHON = sys.executable

# A stand-in for the module_utils of an AnsiballZ zip: it notes in which process it was imported.
FAKE_BASIC = b"import os\nIMPORTED_IN = os.getpid()\ncounter = 0\n"
PAYLOAD_BODY = r'''
_ANSIBALLZ_WRAPPER = True
import base64, json, os, sys, tempfile, zipfile, shutil
def _main(zip_data, body):
    tmp = tempfile.mkdtemp()
    try:
        path = os.path.join(tmp, "payload.zip")
        with open(path, "wb") as handle:
            handle.write(base64.b64decode(zip_data))
        sys.path.insert(0, path)
        from ansible.module_utils import basic
        exec(body, {"basic": basic})
    finally:
        shutil.rmtree(tmp)
if __name__ == "__main__":
    _main(
zip_data=%r,
body=%r,
)
'''


def make_payload(body: str, interpreter: str = PYTHON, basic: bytes = FAKE_BASIC,
                 built=(2026, 1, 1, 0, 0, 0)) -> bytes:
    """``built``: the entries' timestamp (Ansible stamps every build of the zip with its time)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in (("ansible/__init__.py", b""), ("ansible/module_utils/__init__.py", b""),
                           ("ansible/module_utils/basic.py", basic)):
            z.writestr(zipfile.ZipInfo(name, date_time=built), data)
    zip_data = base64.b64encode(buf.getvalue()).decode()
    return ("#!%s\n" % interpreter + PAYLOAD_BODY % (zip_data, body)).encode()


REPORT = r'''
import json, os, sys
basic.counter += 1
main = sys.modules["__main__"]
print(json.dumps({"argv": sys.argv, "name": main.__name__, "file": main.__file__, "spec": main.__spec__,
                  "cwd": os.getcwd(), "x": os.environ.get("X_WARM"), "stdin": sys.stdin.read(),
                  "counter": basic.counter, "path0": sys.path[0].endswith("payload.zip"),
                  "sid": os.getsid(0) == os.getpgid(0)}, sort_keys=True))
print("to stderr", file=sys.stderr)
'''
BODIES = {
    "report": REPORT,
    "exit 3": "import sys\nprint('{\"failed\": true}')\nsys.exit(3)\n",
    "exit msg": "import sys\nsys.exit('fatal: message')\n",
    "exception": "raise ValueError('boom')\n",
    "name error": "print(undefined_name)\n",
    "big output": "import sys\nsys.stdout.write('x' * 300000)\n",
    "atexit": "import atexit\natexit.register(print, 'at exit')\nprint('body')\n",
}


@pytest.fixture
def admin_agent(swtpm, make_core):
    c, _vpn = make_core(swtpm)
    c.recovery.load()
    events = []

    def log(event, **fields):
        events.append((event, fields))

    admin = admin_handlers(c, log=log)
    remote_exec = RemoteExec(c.context.state_dir, log=log)
    handlers = dict(pubapi_handlers(c, DummyValidator()).handlers())
    handlers.update(admin.handlers(), **remote_exec.handlers())
    tls = AgentServerContext(DummyIssuer(), key_pool_size=0)
    server = FrameServer("pubapi", ("127.0.0.1", 0), handlers, tls=tls, peer_view=CorePeerView(c)).start()
    key, pem = keypair()
    client = connect("127.0.0.1:%d" % server.address[1])
    client.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), pem)
    client.admin_auth(key)
    yield client, remote_exec, events
    client.close()
    server.stop()
    tls.close()
    remote_exec.close()


def _both(client, payload, interpreter=PYTHON, cmd=None, env=None):
    cmd = cmd or "%s && sleep 0" % interpreter
    warm = client.exec_module(cmd, interpreter, payload, env=env)
    plain = client.exec_command("%s%s" % ("".join("%s=%s " % kv for kv in (env or {}).items()), cmd), stdin=payload)
    return warm, plain


@pytest.mark.parametrize("name", sorted(BODIES))
def test_exec_module_gives_what_a_plain_run_gives(admin_agent, name):
    client, _remote_exec, _events = admin_agent
    payload = make_payload(BODIES[name])
    for _round in range(2):  # the first starts the fork server, the second uses it
        warm, plain = _both(client, payload, env={"X_WARM": "yes"})
        assert warm.warm and not plain.warm
        assert (warm.exit_code, warm.stdout) == (plain.exit_code, plain.stdout)
        # Tracebacks name the same lines; only the frames of the fork server itself may differ.
        assert warm.stderr.splitlines()[-1:] == plain.stderr.splitlines()[-1:]
    if name == "report":
        report = json.loads(warm.stdout)
        assert report["argv"] == [""] and report["name"] == "__main__" and report["file"] == "<stdin>"
        assert report["x"] == "yes" and report["stdin"] == "" and report["sid"] and report["path0"]


def test_exec_module_children_share_no_state_but_reuse_the_import(admin_agent):
    client, remote_exec, _events = admin_agent
    body = "import os, json\nbasic.counter += 1\nprint(json.dumps([basic.counter, basic.IMPORTED_IN != os.getpid()]))\n"
    payload = make_payload(body)
    results = [client.exec_module(PYTHON, PYTHON, payload) for _round in range(3)]
    assert [json.loads(r.stdout) for r in results[1:]] == [[1, True], [1, True]]  # imported before the fork
    # Another zip (another ansible version) never meets the first one's modules.
    other = make_payload(body, basic=FAKE_BASIC + b"counter = 10\n")
    assert json.loads(client.exec_module(PYTHON, PYTHON, other).stdout) == [11, True]
    assert len(remote_exec.warm.servers()) == 2


def test_exec_module_a_rebuilt_zip_of_the_same_content_finds_its_server_warm(admin_agent):
    # The next playbook run builds the same module zip with other timestamps: same server.
    client, remote_exec, events = admin_agent
    body = "import os\nprint(basic.IMPORTED_IN)\n"
    first = client.exec_module(PYTHON, PYTHON, make_payload(body, built=(2026, 1, 1, 0, 0, 0)))
    rebuilt = make_payload(body, built=(2026, 11, 24, 13, 30, 10))
    assert rebuilt != make_payload(body, built=(2026, 1, 1, 0, 0, 0))
    again = client.exec_module(PYTHON, PYTHON, rebuilt)
    assert first.warm and again.warm and first.stdout == again.stdout  # imported in the same server
    assert len(remote_exec.warm.servers()) == 1
    assert [e for e, _f in events].count("warm_server_started") == 1
    # One byte of module_utils more is another content: another server.
    other = client.exec_module(PYTHON, PYTHON, make_payload(body, basic=FAKE_BASIC + b"\n"))
    assert other.warm and other.stdout != first.stdout and len(remote_exec.warm.servers()) == 2


def test_exec_module_reads_a_zip_once_per_distinct_bytes(admin_agent, monkeypatch):
    # Every task of a run sends the same bytes: the zip is read (for its content digest) once.
    from ansible_collections.constellation.cluster.plugins.module_utils.agent.execution import warm as warm_module

    client, _remote_exec, _events = admin_agent
    reads = []
    monkeypatch.setattr(warm_module, "content_digest", lambda data: reads.append(data) or content_digest(data))
    payload = make_payload("print(basic.IMPORTED_IN)\n")
    results = [client.exec_module(PYTHON, PYTHON, payload) for _round in range(3)]
    assert all(r.warm for r in results) and len({r.stdout for r in results}) == 1
    assert len(reads) == 1


def test_content_digest_reads_names_and_bytes_and_refuses_a_broken_zip():
    def zipped(entries, built=(2026, 1, 1, 0, 0, 0)):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
            for name, data in entries:
                z.writestr(zipfile.ZipInfo(name, date_time=built), data)
        return buf.getvalue()

    base = zipped([("a.py", b"x = 1\n"), ("b.py", b"")])
    rebuilt = zipped([("a.py", b"x = 1\n"), ("b.py", b"")], built=(2030, 2, 3, 4, 5, 6))
    assert rebuilt != base and content_digest(rebuilt) == content_digest(base)
    # Length prefixes: moving a byte from one entry's name to its data is another content.
    assert content_digest(zipped([("ab", b"c")])) != content_digest(zipped([("a", b"bc")]))
    assert content_digest(base) != content_digest(zipped([("a.py", b"x = 2\n"), ("b.py", b"")]))
    with pytest.raises(WarmUnavailable, match="does not read"):
        content_digest(b"PK\x03\x04 not a zip")
    stored = io.BytesIO()
    with zipfile.ZipFile(stored, "w") as z:
        z.writestr("a.py", b"x = 1\n")
    broken = bytearray(stored.getvalue())
    broken[broken.index(b"x = 1")] ^= 0xFF  # a flipped byte of an entry: its CRC does not match
    with pytest.raises(WarmUnavailable, match="CRC"):
        content_digest(bytes(broken))


def test_exec_module_falls_back_to_plain_exec(admin_agent, tmp_path):
    client, _remote_exec, events = admin_agent
    body = "print('ran')\n"
    # A payload for another interpreter path than the one asked for: plain.
    other = "/usr/bin/python3" if PYTHON != "/usr/bin/python3" else "/usr/local/bin/python3"
    res = client.exec_module(PYTHON, PYTHON, make_payload(body, interpreter=other))
    assert (res.exit_code, res.stdout, res.warm) == (0, b"ran\n", False)
    # Not an AnsiballZ payload: plain.
    res = client.exec_module("%s -" % PYTHON, PYTHON, ("#!%s\nprint('plain script')\n" % PYTHON).encode())
    assert (res.stdout, res.warm) == (b"plain script\n", False)
    # An interpreter that does not exist: exactly what Exec says.
    missing = str(tmp_path / "python9")
    warm, plain = _both(client, make_payload(body, interpreter=missing), interpreter=missing)
    assert not warm.warm and warm.exit_code == plain.exit_code == 127 and warm.stderr == plain.stderr
    # An interpreter that is no Python at all (it exits at once): plain.
    fake = tmp_path / "python-fake"
    fake.write_text("#!/bin/sh\necho fake $#\n")
    fake.chmod(0o755)
    res = client.exec_module(str(fake), str(fake), make_payload(body, interpreter=str(fake)))
    assert (res.exit_code, res.stdout, res.warm) == (0, b"fake 0\n", False)
    assert [f.get("warm") for e, f in events if e == "exec_module"] == [False, False, False, False]
    with pytest.raises(RemoteError, match="interpreter: expected the absolute path"):
        client.exec_module(PYTHON, "python3", make_payload(body))
    assert client.exec_command("true").exit_code == 0  # in sync after errors


def test_exec_module_restarts_a_dead_fork_server(admin_agent):
    client, remote_exec, _events = admin_agent
    payload = make_payload("import os\nprint(os.getppid())\n")
    first = client.exec_module(PYTHON, PYTHON, payload)
    (server_pid,) = remote_exec.warm.servers()
    assert first.warm and int(first.stdout) == server_pid
    os.kill(server_pid, signal.SIGKILL)
    for _attempt in range(50):  # bounded: the reader notices the closed socket
        if not remote_exec.warm.servers():
            break
        time.sleep(0.05)
    again = client.exec_module(PYTHON, PYTHON, payload)
    (new_pid,) = remote_exec.warm.servers()
    assert again.warm and again.exit_code == 0 and new_pid != server_pid and int(again.stdout) == new_pid


def test_exec_module_timeout_kills_the_child_and_logs_no_payload(admin_agent):
    client, _remote_exec, events = admin_agent
    secret = "s3cr3t-%s" % os.urandom(8).hex()
    payload = make_payload("import time\nsecret = %r\ntime.sleep(30)\n" % secret)
    res = client.exec_module(PYTHON, PYTHON, payload, env={"TOKEN": secret}, timeout=0.5)
    assert res.warm and res.exit_code == -signal.SIGKILL
    assert secret not in repr(events)


def test_exec_module_keeps_at_most_max_servers(admin_agent):
    client, remote_exec, _events = admin_agent
    remote_exec.warm.max_servers = 1
    first, second = make_payload("print(1)\n"), make_payload("print(2)\n", basic=FAKE_BASIC + b"# other\n")
    assert client.exec_module(PYTHON, PYTHON, first).stdout == b"1\n"
    (first_pid,) = remote_exec.warm.servers()
    assert client.exec_module(PYTHON, PYTHON, second).stdout == b"2\n"
    (second_pid,) = remote_exec.warm.servers()  # the least recently used one stopped
    assert second_pid != first_pid
    for _attempt in range(50):  # bounded: the stopped server is reaped
        if not os.path.exists("/proc/%d" % first_pid):
            break
        time.sleep(0.05)
    assert not os.path.exists("/proc/%d" % first_pid)
    again = client.exec_module(PYTHON, PYTHON, first)
    assert again.warm and again.stdout == b"1\n"
