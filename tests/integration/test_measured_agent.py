# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a node runs and keeps (docs/security.md, "At rest"), on a lab of three hosts: h1 the Coordinator, h2 and
h3 Nodes. A changed agent file and a changed agent configuration are refused at activation (PCR 13); an agent
changed after activation is evicted (it still unseals: the seal covers the boot chain's PCRs, not the agent's PCR 13,
which the host's root could replay, and GetState says host root is trusted there); a state folder copied to another
host and a tampered boot cannot unseal, and say so; a Node rebooted into its measured state comes back. A signed
document that accepts both agents (SetMeasurements) keeps a Node that rebooted into the changed agent, while a third
agent is still refused, and an agent replaced without a reboot is still evicted."""

from __future__ import annotations

import base64
import json
import shutil
import time

import pytest

from lab.agent import agent_dir, copy_agent, read_sealed, start_agent, tail_log
from lab.image import lab_measurements
from tests.support.cluster import lab_cluster
from tests.support.wait import until
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import RemoteError

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def cluster():
    with lab_cluster("magent", 3) as made:  # the default variant, qemu-vtpm-ek
        lab = made.lab
        made.start("h1", trust=True)
        with made.client("h1") as c:
            c.activate_as_coordinator(made.secret.to_uri(), made.salt, made.admin_pem,
                                      init_secret=base64.b64decode(lab.init_secret()))
        yield made


def _agent_copy(tmp_path_factory, comment):
    """The checkout's agent with a comment more in one file: it behaves the same, and measures otherwise."""
    root = copy_agent(tmp_path_factory.mktemp("agent"))
    path = root / "collections" / "ansible_collections" / "constellation" / "cluster" / "plugins" / "module_utils" / "agent" / "daemon.py"
    path.write_text(path.read_text() + "# %s\n" % comment)
    return root


@pytest.fixture(scope="module")
def changed_agent(tmp_path_factory):
    return _agent_copy(tmp_path_factory, "changed")


@pytest.fixture(scope="module")
def third_agent(tmp_path_factory):
    return _agent_copy(tmp_path_factory, "a third agent")


def _measured(cluster, name):
    return cluster.events(name, "agent_measured")[-1]


def _fresh(cluster, name):
    """A new machine: its agent stopped, its state folder gone, its TPM rebooted into the lab image."""
    if name in cluster.procs:
        cluster.stop(name)
    shutil.rmtree(str(agent_dir(cluster.hosts[name]) / "state"), ignore_errors=True)
    cluster.lab.reboot_tpm(name)


def _exits(cluster, name, **config):
    proc = start_agent(cluster.lab, cluster.hosts[name], wait=False, **config)
    proc.wait(timeout=30)
    assert proc.returncode == 2, tail_log(cluster.hosts[name])
    return cluster.events(name, "agent_failed")[-1]["error"]


def test_a_changed_agent_file_is_refused_at_activation(cluster, changed_agent):
    cluster.start("h2", trust=True, agent_root=changed_agent)
    genuine, changed = _measured(cluster, "h1"), _measured(cluster, "h2")
    assert changed["agent_code"] != genuine["agent_code"] and changed["agent_config"] == genuine["agent_config"]
    rows = cluster.activate("h1", nodes=("h2",))["nodes"]
    assert [r["ok"] for r in rows] == [False], rows
    assert "PCR 13: expected %s, found %s" % (genuine["value"], changed["value"]) in rows[0]["error"], rows
    assert cluster.state("h2")["state"] == "AcceptingInit"


def _another_ca(path):
    """A second EK root (a CA certificate of another 'vendor', PEM)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "another TPM vendor")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key()).serial_number(7)
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def test_a_changed_agent_configuration_is_refused_at_activation(cluster, tmp_path):
    _fresh(cluster, "h2")
    # The trust configuration is measured: here the agent also trusts the EK certificates of another CA.
    cluster.start("h2", trust=True, ek_ca=[str(cluster.lab.ek_ca_path), str(_another_ca(tmp_path / "other-ca.pem"))])
    genuine, changed = _measured(cluster, "h1"), _measured(cluster, "h2")
    assert changed["agent_code"] == genuine["agent_code"] and changed["agent_config"] != genuine["agent_config"]
    rows = cluster.activate("h1", nodes=("h2",))["nodes"]
    assert [r["ok"] for r in rows] == [False] and "PCR 13: expected %s" % genuine["value"] in rows[0]["error"], rows


def test_a_state_folder_copied_to_another_host_cannot_be_unsealed(cluster):
    _fresh(cluster, "h2")
    h1_state, h2_state = agent_dir(cluster.hosts["h1"]) / "state", agent_dir(cluster.hosts["h2"]) / "state"
    unsealed = json.loads(read_sealed(cluster.lab, cluster.hosts["h1"], "store.json"))  # h1's own TPM can
    kms_data = unsealed["items"]["KMSData"]
    assert cluster.secret.to_uri().encode() in base64.b64decode(kms_data)
    store = (h1_state / "store.json").read_bytes()
    assert store.startswith(b"CSEALED1") and kms_data.encode() not in store and b"KMSData" not in store
    shutil.copytree(str(h1_state), str(h2_state), ignore=shutil.ignore_patterns("etcd", "*.lock"))
    error = _exits(cluster, "h2", trust=True)
    assert "cannot be read here" in error and "sealed on another TPM" in error, error


def test_a_tampered_boot_cannot_unseal_and_the_measured_boot_comes_back(cluster):
    _fresh(cluster, "h2")
    cluster.start("h2", trust=True)
    rows = cluster.activate("h1", nodes=("h2",))["nodes"]
    assert [r["ok"] for r in rows] == [True], rows
    before = cluster.state("h2")
    cluster.stop("h2")
    cluster.lab.reboot_tpm("h2")
    cluster.lab.tamper("h2", 9)
    error = _exits(cluster, "h2", trust=True)
    assert "PCRs 4, 9, 11 differ" in error, error
    cluster.lab.reboot_tpm("h2")  # booted as measured again: it unseals, rejoins and keeps its VPN IP and key
    cluster.start("h2", trust=True)
    until(lambda: cluster.state("h2")["state"] == "IsNode", timeout=30, what="h2 rejoined",
          why=lambda: tail_log(cluster.hosts["h2"]))
    after = cluster.state("h2")
    assert (after["vpn_ip"], after["vpn_pub_key"]) == (before["vpn_ip"], before["vpn_pub_key"])
    assert cluster.disk_key("h2") == cluster.expected_disk_key("h2")


def test_an_agent_changed_after_activation_is_evicted_and_host_root_is_trusted(cluster, changed_agent):
    cluster.stop("h1")  # restarted (no reboot) to re-attest every second: a peer missing twice is evicted
    cluster.start("h1", trust=True, reattest_interval=1, reattest_unreachable_limit=2,
                  unverified_eviction_after=2)
    cluster.start("h3", trust=True)
    rows = cluster.activate("h1", nodes=("h3",))["nodes"]
    assert [r["ok"] for r in rows] == [True], rows
    state = cluster.state("h3")
    assert state["deployment_mode"] == "host" and state["host_root_trusted"] is True, state
    assert 13 not in state["secrets_at_rest"]["pcrs"], state
    assert cluster.events("h3", "host_root_trusted")[-1]["level"] == "warning"
    cluster.stop("h3")
    # Replaced, no reboot: it unseals (host root is trusted on this peer: the seal holds no PCR it could replay),
    # but PCR 13 now holds another measurement, and the Coordinator's re-attestation evicts it.
    cluster.start("h3", trust=True, agent_root=changed_agent)
    assert _measured(cluster, "h3")["outcome"] == "conflict"
    evicted = until(lambda: [e for e in cluster.events("h1", "peer_evicted") if e.get("public_ip") == cluster.hosts["h3"].public_ip],
                    timeout=30, what="h3 evicted", why=lambda: tail_log(cluster.hosts["h1"]))
    assert evicted


def _entry(measured):
    """A document's ``agents`` entry from an ``agent_measured`` record (as AgentMeasurement.to_dict writes it)."""
    return {"pcr": 13, "value": measured["value"],
            "events": [{"event": "agent_code", "digest": measured["agent_code"]},
                       {"event": "agent_config", "digest": measured["agent_config"]}]}


def _set_measurements(cluster, tmp_path, document):
    path = tmp_path / "measurements-agents.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    cluster.lab.sign_measurements(path)
    with cluster.client("h1") as c:
        c.admin_auth(cluster.admin_key)
        signature = (tmp_path / "measurements-agents.json.sig").read_text().strip() if document is not None else None
        return c.invoke("SetMeasurements", document=path.read_bytes() if document is not None else None,
                        signature=signature)


def _evictions(cluster, name):
    return [e for e in cluster.events("h1", "peer_evicted") if e.get("public_ip") == cluster.hosts[name].public_ip]


def test_a_document_that_accepts_both_agents_keeps_a_node_on_the_changed_one(cluster, changed_agent, third_agent,
                                                                             tmp_path):
    # The Coordinator h1 runs the genuine agent (re-attesting every second, from the test above), h2 too.
    genuine = _measured(cluster, "h1")
    h2_vpn_ip = cluster.state("h2")["vpn_ip"]
    # What the changed agent measures, read from the agent itself on h3 (a new machine).
    _fresh(cluster, "h3")
    cluster.start("h3", trust=True, agent_root=changed_agent)
    changed = _measured(cluster, "h3")
    assert changed["outcome"] == "measured" and changed["value"] != genuine["value"]
    cluster.stop("h3")
    document = {"version": 1, "accepted": {"lab": lab_measurements()},
                "agents": {"genuine": _entry(genuine), "changed": _entry(changed)}}
    answer = _set_measurements(cluster, tmp_path, document)
    assert answer["changed"] is True and answer["agents"][h2_vpn_ip] == "self", answer
    # h2 takes the document (GetUpdate says the version) before it reboots into the changed agent.
    until(lambda: [e for e in cluster.events("h2", "measurements_applied") if e.get("version") == 1], timeout=30,
          what="h2 applied the document", why=lambda: tail_log(cluster.hosts["h2"]))
    cluster.stop("h2")
    cluster.lab.reboot_tpm("h2")  # an agent upgrade reboots the host: PCR 13 starts from zero
    cluster.start("h2", trust=True, agent_root=changed_agent)
    assert _measured(cluster, "h2")["outcome"] == "measured"
    until(lambda: cluster.state("h2")["state"] == "IsNode", timeout=90, what="h2 rejoined on the changed agent",
          why=lambda: tail_log(cluster.hosts["h2"]))
    # Re-attested with the changed agent, round after round, and never evicted.
    until(lambda: _set_measurements(cluster, tmp_path, None)["agents"].get(h2_vpn_ip) == "changed", timeout=90,
          what="h2 re-attested on the changed agent", why=lambda: tail_log(cluster.hosts["h1"]))
    for _round in range(5):  # a second each: the Coordinator's re-attestation interval here
        time.sleep(1)
        assert cluster.state("h2")["state"] == "IsNode" and not _evictions(cluster, "h2"), tail_log(cluster.hosts["h1"])
    report = _set_measurements(cluster, tmp_path, None)
    assert report["agents"][cluster.state("h1")["vpn_ip"]] == "genuine" and report["agents"][h2_vpn_ip] == "changed"
    # A third agent is refused at activation, naming the value it showed and both accepted ones.
    _fresh(cluster, "h3")
    cluster.start("h3", trust=True, agent_root=third_agent)
    third = _measured(cluster, "h3")
    rows = cluster.activate("h1", nodes=("h3",))["nodes"]
    assert [r["ok"] for r in rows] == [False], rows
    assert "PCR 13 (the agent): expected one of genuine=%s, changed=%s, found %s" % (
        genuine["value"], changed["value"], third["value"]) in rows[0]["error"], rows
    # Retiring the agent h2 runs is refused, naming h2.
    retire = dict(document, version=2, agents={"genuine": _entry(genuine)})
    with pytest.raises(RemoteError) as err:
        _set_measurements(cluster, tmp_path, retire)
    assert "cannot retire the agent changed" in str(err.value) and "%s (changed=" % h2_vpn_ip in str(err.value)
    # An agent replaced without a reboot leaves PCR 13 at neither accepted value: evicted by re-attestation.
    cluster.stop("h2")
    cluster.start("h2", trust=True)
    assert _measured(cluster, "h2")["outcome"] == "conflict"
    until(lambda: _evictions(cluster, "h2"), timeout=30, what="h2 evicted", why=lambda: tail_log(cluster.hosts["h1"]))
