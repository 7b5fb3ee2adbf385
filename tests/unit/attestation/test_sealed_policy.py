# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Nothing unsigned decides what the storage key is sealed to. Offline edits of a host's disk, then a restart of
the real agent (agent/wiring.py, the real Core, a real swtpm): a set added to the policy file and signed
with a replaced pinned key, a set added to an unsigned file, the admin's own older signed document put back. The
agent seals nothing to the tampered sets (no blob; a reboot into that boot chain cannot unseal), refuses the older
version (its floor is kept sealed), refuses to start without a pinned key unless told so explicitly, and says in
GetState and on every start that host root is trusted on this peer (deployment_mode host)."""

from __future__ import annotations

import hashlib
import io
import json

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from lab.swtpm import free_port
from ansible_collections.constellation.cluster.plugins.module_utils.agent.daemon import Agent
from ansible_collections.constellation.cluster.plugins.module_utils.agent.wiring import build_agent
from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import AgentConfig
from ansible_collections.constellation.cluster.plugins.module_utils.agent.json_log import JSONLog
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import sealing, signature, tpm
from ansible_collections.constellation.cluster.plugins.module_utils.core.at_rest import SEALED_KEY_FILE
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError

SECRET = b"kms://cluster-kms?key=c2VjcmV0&salt=c2FsdA"
BOOT_PCRS = (4, 9, 11)


def _boot(tcti, image: bytes):
    """A measured boot of ``image`` (PCRs 4, 9, 11); the agent measures PCR 13 itself when it starts."""
    with tpm.open_tpm(tcti) as dev:
        for pcr in BOOT_PCRS:
            dev.pcr_extend(pcr, hashlib.sha256(image + b"/%d" % pcr).digest())


def _reboot(swtpm, image: bytes):
    swtpm.stop(orderly=True)
    swtpm.start()
    _boot(swtpm.tcti, image)


def _expected(image: bytes):
    return {str(pcr): {"expected": hashlib.sha256(bytes(32) + hashlib.sha256(image + b"/%d" % pcr).digest()).hexdigest(),
                       "warnOnly": False} for pcr in BOOT_PCRS}


def _document(version: int, *images: bytes) -> bytes:
    return json.dumps({"version": version, "accepted": {image.decode(): _expected(image) for image in images}},
                      indent=2).encode()


class Host:
    """A host's agent files: its config, policy file (+ .sig) and pinned key, as the node_agent role writes them."""

    def __init__(self, tmp_path, swtpm):
        self.dir = tmp_path
        self.swtpm = swtpm
        self.policy = tmp_path / "measurements.json"
        self.pub = tmp_path / "measurements.pub"
        self.key = ec.generate_private_key(ec.SECP256R1())  # the admin's measurements key

    def write(self, document: bytes, key=None) -> str:
        """The policy file and its detached signature (with ``key``, default the admin's); returns the signature."""
        sig = signature.sign_blob(key or self.key, document)
        self.policy.write_bytes(document)
        (self.dir / "measurements.json.sig").write_text(sig + "\n")
        return sig

    def pin(self, key=None) -> None:
        self.pub.write_bytes((key or self.key).public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))

    def config(self, **extra) -> AgentConfig:
        data = {"state_dir": str(self.dir / "state"), "public_endpoint": "127.0.0.1:%d" % free_port(),
                "tcti": self.swtpm.tcti, "variant": "qemu-vtpm", "insecure_trust_any_ak": True,
                "measurements": str(self.policy), "measurements_pub_key": str(self.pub), "init_secret_hash": "ab" * 32,
                "verify_grpc_endpoint": "", "verify_http_endpoint": "", "reattest_interval": 0}
        data.update(extra)
        return AgentConfig.from_mapping({k: v for k, v in data.items() if v is not None})

    def agent(self, **extra) -> Agent:
        """The agent as it comes up at a (re)start: measured, storage key unsealed, store open."""
        return build_agent(self.config(**extra), JSONLog(stream=io.StringIO()))

    def sealed_sets(self):
        return [blob["set"] for blob in json.loads((self.dir / "state" / SEALED_KEY_FILE).read_text())["blobs"]]

    def sealed_digests(self):
        return {blob["digest"] for blob in json.loads((self.dir / "state" / SEALED_KEY_FILE).read_text())["blobs"]}


def _digest(image: bytes) -> str:
    values = {pcr: bytes.fromhex(entry["expected"]) for pcr, entry in ((int(k), v) for k, v in _expected(image).items())}
    return sealing.pcr_digest(values, BOOT_PCRS).hex()


@pytest.fixture
def host(tmp_path, fresh_swtpm):
    _boot(fresh_swtpm.tcti, b"v1")
    h = Host(tmp_path, fresh_swtpm)
    h.pin()
    h.write(_document(1, b"v1"))
    agent = h.agent()
    agent.store.put("kmsData", SECRET)
    return h


def test_a_set_signed_with_a_replaced_pinned_key_gets_no_seal_and_its_boot_chain_unseals_nothing(host):
    """The attacker writes the disk offline: his own key in place of the pinned one, a policy that adds his boot
    chain, signed with his key. The agent restarts (the file verifies against the replaced key) but seals nothing
    to it; rebooted into that chain, the storage key does not unseal and the secret stays sealed."""
    attacker = ec.generate_private_key(ec.SECP256R1())
    host.pin(attacker)
    host.write(_document(2, b"v1", b"evil"), key=attacker)
    host.agent()  # the restart after the offline edit
    assert "evil" not in host.sealed_sets() and _digest(b"evil") not in host.sealed_digests()
    _reboot(host.swtpm, b"evil")
    with pytest.raises(StateError, match="cannot be read here"):
        host.agent()
    assert SECRET not in b"".join(p.read_bytes() for p in (host.dir / "state").iterdir() if p.is_file())


def test_an_older_signed_document_put_back_is_refused_and_its_sets_get_no_seal(host):
    """The admin's own older signed document (it still accepted the retired image ``old``) is put back on the disk
    after the agent applied a newer one over the API. The agent refuses to start with it (the version floor is
    kept sealed), an older document over the API is refused too, and a reboot into ``old`` unseals nothing."""
    older = _document(1, b"v1", b"old")
    older_sig = host.write(older)  # as it was on the disk before: the admin signed it
    newer = _document(2, b"v1", b"v2")
    agent = host.agent()
    newer_sig = signature.sign_blob(host.key, newer)
    assert agent.core.accepted_measurements.on_apply(newer, newer_sig) is True  # over the API: sealed ahead to v2
    assert "v2" in host.sealed_sets() and "old" not in host.sealed_sets()
    with pytest.raises(InputError, match="^version: expected a version of at least 2"):
        agent.core.accepted_measurements.on_apply(older, older_sig)
    host.write(older)  # the offline edit: the older signed document put back
    with pytest.raises(StateError, match="has version 1, older than version 2"):
        host.agent()
    assert "old" not in host.sealed_sets() and _digest(b"old") not in host.sealed_digests()
    _reboot(host.swtpm, b"old")
    with pytest.raises(StateError, match="cannot be read here"):
        host.agent()
    _reboot(host.swtpm, b"v2")  # the image the admin's document accepts: the key unseals there
    host.write(newer)
    assert host.agent().store.get("kmsData") == SECRET


def test_without_a_pinned_key_the_agent_refuses_to_start_and_an_unsigned_file_decides_no_seal(host):
    """The default refuses an unsigned policy file, naming the option; with the explicit opt-out the agent starts,
    warns on every start, and still seals nothing to a set added to the unsigned file."""
    with pytest.raises(InputError) as refused:
        host.config(measurements_pub_key=None)
    assert refused.value.field == "measurements_pub_key"
    assert "insecure_unsigned_measurements: true" in str(refused.value)
    host.policy.write_bytes(_document(2, b"v1", b"evil"))  # an unsigned file with the attacker's set
    for _start_again in range(2):
        log = io.StringIO()
        agent = build_agent(host.config(measurements_pub_key=None, insecure_unsigned_measurements=True),
                            JSONLog(stream=log)).start()
        agent.stop()
        events = [json.loads(line) for line in log.getvalue().splitlines()]
        unsigned = [e for e in events if e["event"] == "measurements_unsigned"]
        assert len(unsigned) == 1 and unsigned[0]["level"] == "warning"
        assert "insecure_unsigned_measurements" in unsigned[0]["message"]
    assert "evil" not in host.sealed_sets() and _digest(b"evil") not in host.sealed_digests()
    _reboot(host.swtpm, b"evil")
    with pytest.raises(StateError, match="cannot be read here"):
        host.agent(measurements_pub_key=None, insecure_unsigned_measurements=True)


def test_get_state_and_every_start_say_host_root_is_trusted_on_this_peer(host):
    """deployment_mode host (the default): GetState's details and a warning on every start say that the host's
    root is trusted here; an unknown mode is refused, naming the key."""
    for _start_again in range(2):
        log = io.StringIO()
        agent = build_agent(host.config(), JSONLog(stream=log)).start()
        try:
            state = agent.core.status.get_state()
        finally:
            agent.stop()
        assert state["deployment_mode"] == "host" and state["host_root_trusted"] is True
        assert 13 not in state["secrets_at_rest"]["pcrs"] and state["secrets_at_rest"]["pcrs"] == list(BOOT_PCRS)
        warned = [json.loads(line) for line in log.getvalue().splitlines() if '"host_root_trusted"' in line]
        assert len(warned) == 1 and warned[0]["level"] == "warning" and "host root is trusted" in warned[0]["message"]
    with pytest.raises(InputError, match="^deployment_mode: expected one of host, image"):
        host.config(deployment_mode="vm")
