# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The vpnapi trusts no source address alone, on real agents (swtpm, wireguard-go, namespaces), lab ``vpnauth``: an
unprivileged process on a Node (``setpriv`` to nobody, inside the Node's namespaces, so its packets
leave through the Node's WireGuard tunnel from the Node's VPN IP) asks the Coordinator's vpnapi for the
control-plane PKI, a certificate key, the Node's disk key, a data key and the peer list: every request
is refused and nothing secret reaches it; it cannot read the agent's WireGuard key either. The Nodes'
own agents, which prove their WireGuard key (PeerAuth) on each poll, keep converging."""

from __future__ import annotations

import base64
import json

import pytest
from lab.agent import agent_dir, agent_vpn_priv_key, tail_log
from tests.support import ROOT
from tests.support.cluster import lab_cluster
from tests.support.wait import until
from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import access, schema

pytestmark = pytest.mark.lab

# Every vpnapi method that needs PeerAuth, from the schema (a new one is attacked too), with the most one could ask.
PARAMS = {"GetJoinArgs": {"is_control_plane": True}, "GetDataKey": {"data_key_id": "app"},
          "GetUpdate": {"resource_version": -1}}
ATTACKS = [(m.name, PARAMS.get(m.name, {})) for m in schema.methods_of(schema.VPNAPI) if m.access.caller in access.PEER_CALLERS]

# Runs as nobody inside the Node's namespaces: raw frames to the Coordinator's vpnapi, then the agent's key file.
ATTACKER = r"""
import json, socket, sys
sys.path[:0] = [sys.argv[1] + "/collections", sys.argv[1]]
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import FrameStream, KIND_END
out = {"answers": []}
sock = socket.create_connection((sys.argv[2], 9027), timeout=10)
stream = FrameStream(sock)
for method, params in json.loads(sys.argv[3]):
    stream.send_request(method, params)
    frame = stream.recv()
    while frame.kind != KIND_END:
        frame = stream.recv()
    out["answers"].append(frame.message)
try:
    with open(sys.argv[4]) as handle:
        out["key_file"] = "read: " + handle.read()
except OSError as err:
    out["key_file"] = err.strerror
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def cluster():
    with lab_cluster("vpnauth", 3, variant="qemu-vtpm") as made:
        lab = made.lab
        for name in ("h1", "h2", "h3"):
            made.start(name, trust=True, reattest_interval=0)
        with made.client("h1") as c:
            c.activate_as_coordinator(made.secret.to_uri(), made.salt, made.admin_pem,
                                      init_secret=base64.b64decode(lab.init_secret()))
        rows = made.activate("h1", nodes=("h2", "h3"))["nodes"]
        assert [r["ok"] for r in rows] == [True, True], rows
        yield made


def test_an_unprivileged_process_on_a_node_gets_nothing_from_the_vpnapi(cluster):
    node = cluster.hosts["h2"]
    coordinator_vpn_ip = cluster.state("h1")["vpn_ip"]
    key_file = agent_dir(node) / "state" / "store.json"  # the sealed store: the agent keeps its key nowhere else
    proc = node.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"] + cluster.lab.host_python()
                    + ["-c", ATTACKER, str(ROOT), coordinator_vpn_ip, json.dumps(ATTACKS), str(key_file)],
                    check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    for (method, _params), answer in zip(ATTACKS, result["answers"]):
        assert answer.get("error", {}).get("kind") == "AccessDenied", (method, answer)
        assert "PeerAuth first" in answer["error"]["message"], (method, answer)
    assert result["key_file"] == "Permission denied", result["key_file"][:40]
    # Nothing secret in what it received: not the node's disk key, not a data key, not the CA key.
    disk_key = cluster.disk_key("h2")
    master = kms.ClusterKMS(cluster.secret)
    for secret in (disk_key, master.derive_key("app", 32),
                   master.derive_key("peer/%s/app" % cluster.state("h2")["vpn_pub_key"], 32)):
        assert base64.b64encode(secret).decode() not in proc.stdout
    key = agent_vpn_priv_key(cluster.lab, node)
    assert key not in proc.stdout
    # Nor from the interface: only root reads it there (kubeadm_join's way to the key without vpn_priv_key_file).
    assert node.run(["wg", "show", "wg0", "private-key"]).stdout.strip() == key
    denied = node.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "wg", "show", "wg0",
                       "private-key"], check=False)
    assert denied.returncode != 0 and key not in denied.stdout + denied.stderr


def test_the_nodes_agents_prove_their_key_and_converge(cluster):
    keys = {n: cluster.state(n)["vpn_pub_key"] for n in ("h1", "h2", "h3")}
    # Each Node learns the other from its GetUpdate polls (PeerAuth on each connection).
    until(lambda: keys["h3"] in cluster.wg_peers("h2") and keys["h2"] in cluster.wg_peers("h3"), timeout=30,
          what="the nodes list each other", why=lambda: tail_log(cluster.hosts["h2"]))
    for name in ("h2", "h3"):
        errors = [e for e in cluster.events(name, "loop_error") if "PeerAuth" in e.get("error", "")]
        assert errors == [], errors
    text = (agent_dir(cluster.hosts["h1"]) / "agent.log").read_text(errors="replace")
    assert agent_vpn_priv_key(cluster.lab, cluster.hosts["h2"]) not in text
