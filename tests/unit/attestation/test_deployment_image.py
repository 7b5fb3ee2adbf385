# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node image's deployment mode (attestation/deployment.py ``image``; docs/security.md, "Deployment modes"):
what host root is trusted with in each mode, the one PCR 13 rule that keeps an image set's explicit zero (so a host
peer never passes an image set and an image peer never passes a host set, in one document), and the real agent in
image mode (agent/wiring.py, the real Core, a real swtpm): it does not extend PCR 13, seals its storage key to the
boot-chain PCRs of its set, says ``image`` and ``host_root_trusted: false`` in GetState and warns about nothing."""

from __future__ import annotations

import hashlib
import io
import json

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from lab.swtpm import free_port
from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import AgentConfig
from ansible_collections.constellation.cluster.plugins.module_utils.agent.json_log import JSONLog
from ansible_collections.constellation.cluster.plugins.module_utils.agent.wiring import build_agent
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import agent_measurement as am
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import deployment, signature, tpm
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    MeasurementsMismatch, parse_policy)
from ansible_collections.constellation.cluster.plugins.module_utils.core.at_rest import sealed_pcr_sets, seal_predictions
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError

ZERO = bytes(32)
HOST_BOOT = {4: b"\x01" * 32, 9: b"\x02" * 32}
IMAGE_BOOT = {4: b"\x21" * 32, 7: b"\x27" * 32, 9: b"\x22" * 32, 11: b"\x2b" * 32}
AGENT = am.AgentMeasurement(hashlib.sha256(b"code").digest(), hashlib.sha256(b"config").digest())


def _set(values, **extra):
    out = {str(i): {"expected": v.hex(), "warnOnly": False} for i, v in values.items()}
    out.update(extra)
    return out


def _mixed_doc(**agents):
    """One signed document for both deployments: a host set (no PCR 13: the agents' values go there) and an image
    set (PCR 13 = 32 zero bytes, enforced)."""
    doc = {"version": 1, "accepted": {"host-v1": _set(HOST_BOOT),
                                      "image-v1": _set(IMAGE_BOOT, **{"13": {"expected": "00" * 32, "warnOnly": False}})}}
    if agents:
        doc["agents"] = agents
    return doc


def test_each_mode_says_what_host_root_can_do():
    assert deployment.MODES == ("host", "image") and deployment.DEFAULT == "host"
    assert deployment.host_root_trusted("host") is True and deployment.extends_agent_pcr("host") is True
    assert "host root is trusted" in deployment.warning("host")
    # The image: no login, the boot chain measured everything that runs; the agent extends nothing.
    assert deployment.host_root_trusted("image") is False and deployment.extends_agent_pcr("image") is False
    assert deployment.warning("image") == ""
    # PCR 13 (zero in the image: what any code reaches by doing nothing) and 16/23 stay replayable in both modes.
    assert deployment.replayable_pcrs("image") == deployment.replayable_pcrs("host") == frozenset({13, 16, 23})
    for bad in ("vm", "", None, "IMAGE"):
        with pytest.raises(InputError, match="^deployment_mode: expected one of host, image"):
            deployment.check_mode(bad)


def test_an_image_set_is_sealed_to_its_boot_chain_pcrs_never_13_nor_16_23():
    doc = _mixed_doc()
    doc["accepted"]["image-v1"].update({"16": "44" * 32, "23": "55" * 32, "15": "00" * 32})
    policy = parse_policy(doc)
    assert sealed_pcr_sets(policy, "image") == {"host-v1": [4, 9], "image-v1": [4, 7, 9, 11]}
    enforced = am.enforce_agent_pcr(policy, AGENT.value)
    predictions = seal_predictions(enforced, "image")
    assert predictions["image-v1"] == ([4, 7, 9, 11], IMAGE_BOOT)


@pytest.mark.parametrize("agents", [{}, {"a1": AGENT.to_dict()}], ids=["own-agent", "listed-agents"])
def test_a_host_peer_never_passes_an_image_set_and_an_image_peer_never_passes_a_host_set(agents):
    """The attack: a host peer (its root can do anything there) presents the image's boot values, its PCR 13 holding
    the agent it extended; an image peer presents a host set's boot values. Each is refused, naming PCR 13 and what
    was expected; each genuine peer passes its own set of the same document."""
    policy = am.enforce_agent_pcr(parse_policy(_mixed_doc(**agents)), AGENT.value)
    assert policy.match({**HOST_BOOT, 13: AGENT.value})[0] == "host-v1"
    name, checks, _warnings = policy.match({**IMAGE_BOOT, 13: ZERO})
    assert name == "image-v1"
    assert am.matched_agent(checks) == am.IMAGE_AGENT  # an image's agent measures nothing into PCR 13
    with pytest.raises(MeasurementsMismatch) as refused:
        policy.match({**IMAGE_BOOT, 13: AGENT.value})  # a host agent on a host that replays the image's boot PCRs
    assert "set image-v1: PCR 13 (%s): expected %s, found %s" % (am.IMAGE_AGENT_LABEL, ZERO.hex(), AGENT.value.hex()) \
        in str(refused.value)
    with pytest.raises(MeasurementsMismatch) as refused:
        policy.match({**HOST_BOOT, 13: ZERO})  # an agent that did not measure itself, on a host's boot chain
    assert "set host-v1: PCR 13" in str(refused.value) and "found %s" % ZERO.hex() in str(refused.value)


def test_only_an_enforced_all_zero_pcr_13_makes_an_image_set():
    """Constellation's images list PCR 13 as reserved, zero, warn-only: that is no image set, the agent's value
    replaces it (as does any other enforced value a set gives PCR 13)."""
    for entry in ({"expected": "00" * 32, "warnOnly": True}, {"expected": "33" * 32, "warnOnly": False}):
        policy = am.enforce_agent_pcr(parse_policy({"version": 1, "accepted": {"v1": _set(HOST_BOOT, **{"13": entry})}}),
                                      AGENT.value)
        assert policy.match({**HOST_BOOT, 13: AGENT.value})[0] == "v1"
        with pytest.raises(MeasurementsMismatch):
            policy.match({**HOST_BOOT, 13: ZERO})


# ---------------------------------------------------------------- the real agent in image mode (swtpm)

def _boot(tcti, values=None):
    """A measured boot: each boot PCR extended once from zeros (the image's set predicts exactly that)."""
    with tpm.open_tpm(tcti) as dev:
        for pcr, digest in (values or _IMAGE_DIGESTS).items():
            dev.pcr_extend(pcr, digest)


_IMAGE_DIGESTS = {pcr: hashlib.sha256(b"image/%d" % pcr).digest() for pcr in (4, 7, 9, 11)}


def _image_set(digests):
    out = {str(pcr): {"expected": hashlib.sha256(ZERO + d).hexdigest(), "warnOnly": False} for pcr, d in digests.items()}
    out["13"] = {"expected": "00" * 32, "warnOnly": False}
    return out


class ImageHost:
    """An image's agent files: the signed document with the image's set, the pinned key, the baked config."""

    def __init__(self, tmp_path, swtpm):
        self.dir, self.swtpm = tmp_path, swtpm
        key = ec.generate_private_key(ec.SECP256R1())
        document = json.dumps({"version": 1, "accepted": {"image-v1": _image_set(_IMAGE_DIGESTS)}}).encode()
        (tmp_path / "measurements.json").write_bytes(document)
        (tmp_path / "measurements.json.sig").write_text(signature.sign_blob(key, document) + "\n")
        (tmp_path / "measurements.pub").write_bytes(key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))

    def config(self, **extra) -> AgentConfig:
        data = {"state_dir": str(self.dir / "state"), "public_endpoint": "127.0.0.1:%d" % free_port(),
                "tcti": self.swtpm.tcti, "variant": "qemu-vtpm", "insecure_trust_any_ak": True,
                "measurements": str(self.dir / "measurements.json"),
                "measurements_pub_key": str(self.dir / "measurements.pub"), "init_secret_hash": "ab" * 32,
                "verify_grpc_endpoint": "", "verify_http_endpoint": "", "reattest_interval": 0,
                "deployment_mode": "image"}
        data.update(extra)
        return AgentConfig.from_mapping(data)


def test_the_image_agent_extends_no_pcr_13_seals_to_its_boot_chain_and_trusts_no_host_root(tmp_path, fresh_swtpm):
    _boot(fresh_swtpm.tcti)
    host = ImageHost(tmp_path, fresh_swtpm)
    for start in range(2):  # the first start seals a new key; the restart unseals it and finds the secret
        log = io.StringIO()
        agent = build_agent(host.config(), JSONLog(stream=log)).start()
        try:
            if start == 0:
                agent.store.put("kmsData", b"kms://secret")
            assert agent.store.get("kmsData") == b"kms://secret"
            state = agent.core.status.get_state()
        finally:
            agent.stop()
        assert tpm.read_pcrs(fresh_swtpm.tcti)[13] == ZERO  # nothing extended the agent's PCR
        assert state["deployment_mode"] == "image" and state["host_root_trusted"] is False
        assert state["agent_measurement"] is None
        assert state["secrets_at_rest"]["pcrs"] == [4, 7, 9, 11]
        events = [json.loads(line) for line in log.getvalue().splitlines()]
        assert not [e for e in events if e.get("event") in ("host_root_trusted", "agent_measured")]
        assert [e for e in events if e.get("event") == "agent_not_measured"]
    # Another boot chain (a changed UKI or command line): the storage key does not unseal, the agent does not start.
    fresh_swtpm.stop(orderly=True)
    fresh_swtpm.start()
    _boot(fresh_swtpm.tcti, {**_IMAGE_DIGESTS, 9: hashlib.sha256(b"another command line").digest()})
    with pytest.raises(StateError):
        build_agent(host.config(), JSONLog(stream=io.StringIO()))


def test_the_verify_table_shows_each_peers_deployment_mode():
    """playbooks/templates/cluster_table.j2 (verify.yml): a host peer and an image peer side by side; only the host
    peer is listed as one whose host root is trusted."""
    import os

    import jinja2

    root = os.path.join(os.path.dirname(__file__), "..", "..", "..", "playbooks", "templates")
    row = {"endpoint": "192.0.2.1:9000", "state": "IsNode", "membership": "ours", "state_disk": {"encrypted": False},
           "pcrs": [{"index": 13, "expected": "00" * 32, "found": "00" * 32, "ok": True, "warn_only": False}]}
    hostvars = {"h1": {"constellation_peer": dict(row, deployment_mode="host", host_root_trusted=True),
                       "constellation_problems": []},
                "img": {"constellation_peer": dict(row, deployment_mode="image", host_root_trusted=False),
                        "constellation_problems": []}}
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(root), trim_blocks=True)  # as Ansible's template lookup
    table = env.get_template("cluster_table.j2").render(verify_peers=["h1", "img"], hostvars=hostvars)
    lines = [line for line in table.splitlines() if line.strip()]
    assert lines[0].split() == ["peer", "endpoint", "PCR", "expected", "found", "match", "verdict", "disk", "mode",
                                "root", "tcb", "launch", "podnet", "state"]
    assert lines[1].split()[7:10] == ["plain", "host", "trusted"] and lines[2].split()[7:10] == ["plain", "image", "no"]
    assert "host root is trusted on this peer: h1 (host)" in table and "img (image)" not in table
