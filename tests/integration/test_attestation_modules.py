# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Real ansible-playbook runs of attestation_info and verify_attestation against local aTLS
servers backed by swtpm: one booted as the policy says, one "tampered" (PCR 4 differs)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils import atls
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError

pytestmark = pytest.mark.slow

if not shutil.which("swtpm"):  # pragma: no cover - the environment has it
    pytest.skip("swtpm is not installed", allow_module_level=True)

vtpm = pytest.importorskip("ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm")
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import agent_measurement, tpm  # noqa: E402
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (  # noqa: E402
    Measurements, extend_digest)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import DummyIssuer  # noqa: E402
from lab.swtpm import SwTPM, free_port  # noqa: E402
from tests.support import ROOT  # noqa: E402
from tests.support.loopback import LoopbackServer  # noqa: E402
from tests.support.playbook import run_tasks  # noqa: E402

VENV_BIN = os.path.join(ROOT, ".venv", "bin")
PYTHON = os.path.join(VENV_BIN, "python") if os.path.exists(os.path.join(VENV_BIN, "python")) else sys.executable

IMAGE_DIGEST = hashlib.sha256(b"lab image kernel+initrd").digest()
TAMPERED_DIGEST = hashlib.sha256(b"modified kernel").digest()
PCR4 = extend_digest(bytes(32), IMAGE_DIGEST)


class Server(LoopbackServer):
    """aTLS server on 127.0.0.1 in a thread; records bytes received after each handshake."""

    def __init__(self, issuer):
        self.ctx = atls.AttestedServerContext(issuer)
        self.received = []
        self.handshakes = 0
        super().__init__()

    def serve(self, sock):
        try:
            tls = self.ctx.accept_handshake(sock)
        except AttestationError:
            return
        self.handshakes += 1
        data = b""
        tls.settimeout(5)
        try:
            while True:
                chunk = tls.recv(4096)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
        tls.close()
        self.received.append(data)

    def close(self):
        super().close()
        self.ctx.close()


def _start_tpm(path, digest):
    last = None
    for _attempt in range(5):
        swtpm = SwTPM(str(path), free_port())
        try:
            swtpm.start()
            break
        except Exception as err:  # pylint: disable=broad-except
            last = err
    else:
        raise last
    tpm.extend_pcr(swtpm.tcti, 4, digest)
    with tpm.open_tpm(swtpm.tcti) as dev:  # as this collection's agent measures itself (qemu-vtpm, no pinned key)
        agent_measurement.measure(dev, agent_measurement.AgentMeasurement.of("qemu-vtpm"))
    return swtpm


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    os.environ.setdefault("TSS2_LOG", "all+none")
    started = []
    try:
        good_tpm = _start_tpm(tmp_path_factory.mktemp("good"), IMAGE_DIGEST)
        started.append(good_tpm)
        bad_tpm = _start_tpm(tmp_path_factory.mktemp("tampered"), TAMPERED_DIGEST)
        started.append(bad_tpm)
        issuers = [vtpm.VTPMIssuer(t.tcti, event_log_path=None) for t in (good_tpm, bad_tpm)]
        servers = [Server(i) for i in issuers] + [Server(DummyIssuer())]
        yield {"good_tpm": good_tpm, "good": servers[0], "tampered": servers[1], "dummy": servers[2]}
        for server in servers:
            server.close()
        for issuer in issuers:
            issuer.close()
    finally:
        for swtpm in started:
            swtpm.stop()


def run_playbook(tmp_path, tasks, *extra):
    # These hosts attest with qemu-vtpm (no EK certificates): chosen explicitly, with its acknowledgement.
    defaults = {"group/constellation.cluster.attestation": {"variant": "qemu-vtpm", "insecure_trust_any_ak": True},
                "constellation.cluster.attestation_info": {"variant": "qemu-vtpm"}}
    return run_tasks(tmp_path, tasks, extra, play={"hosts": "all", "module_defaults": defaults}, python=PYTHON,
                     env={"TSS2_LOG": "all+none"}, cwd=tmp_path)


def dump(name, path):
    return {"name": "dump " + name, "ansible.builtin.copy": {
        "content": "{{ %s | to_json }}" % name, "dest": str(path), "mode": "0600"}, "check_mode": False}


def test_attestation_info_and_verify_attestation(hosts, tmp_path):
    policy = {"4": {"expected": PCR4.hex(), "warnOnly": False}, "8": "00" * 32,
              "14": {"expected": "11" * 32, "warnOnly": True}}
    (tmp_path / "measurements.json").write_text(json.dumps(policy))
    nonce = bytes(range(32))
    tasks = [
        {"name": "info", "constellation.cluster.attestation_info": {
            "tcti": hosts["good_tpm"].tcti, "nonce": nonce.hex(), "user_data": "VerifyService",
            "event_log_file": str(tmp_path / "no-event-log")}, "register": "info"},
        dump("info", tmp_path / "info.json"),
        {"name": "verify from file", "constellation.cluster.verify_attestation": {
            "endpoint": hosts["good"].endpoint, "measurements_file": "measurements.json"}, "register": "verified"},
        dump("verified", tmp_path / "verified.json"),
        {"name": "verify inline", "constellation.cluster.verify_attestation": {
            "endpoint": hosts["good"].endpoint, "measurements": {"4": PCR4.hex()}}, "register": "inline"},
        dump("inline", tmp_path / "inline.json"),
    ]
    proc = run_playbook(tmp_path, tasks)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    info = json.loads((tmp_path / "info.json").read_text())
    assert info["changed"] is False
    assert info["pcrs"]["4"] == PCR4.hex() and len(info["pcrs"]) == 24
    assert info["initialized"] is False and info["oid"] == "1.3.9900.5.1"
    # The document really is a qemu-vtpm attestation for our nonce and user data.
    validation = vtpm.VTPMValidator(Measurements.from_dict({"4": PCR4.hex()})).validate(
        info["document"].encode(), nonce)
    assert validation.user_data == b"VerifyService"
    with pytest.raises(AttestationError):
        vtpm.VTPMValidator(Measurements.from_dict({"4": PCR4.hex()})).validate(info["document"].encode(), b"x" * 32)

    verified = json.loads((tmp_path / "verified.json").read_text())
    assert verified["changed"] is False and verified["oid"] == "1.3.9900.5.1"
    assert [(r["index"], r["ok"], r["warn_only"]) for r in verified["pcrs"]] == [
        (4, True, False), (8, True, False), (13, True, False), (14, False, True)]  # 13: the agent's, always enforced
    assert verified["pcrs"][0]["found"] == PCR4.hex()
    assert verified["measurements"]["4"] == PCR4.hex()
    assert any("PCR 14" in w for w in verified["warnings"])
    assert "[WARNING]" in proc.stdout and "PCR 14" in proc.stdout  # shown as a warning
    inline = json.loads((tmp_path / "inline.json").read_text())
    assert [r["index"] for r in inline["pcrs"]] == [4, 13]
    # verify_attestation sends nothing over the channel
    assert hosts["good"].received and all(data == b"" for data in hosts["good"].received)


def test_tampered_host_fails_with_pcr_named(hosts, tmp_path):
    before = len(hosts["tampered"].received)
    tasks = [{"name": "verify tampered", "constellation.cluster.verify_attestation": {
        "endpoint": hosts["tampered"].endpoint, "measurements": {"4": PCR4.hex(), "8": "00" * 32}}}]
    proc = run_playbook(tmp_path, tasks)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "PCR 4: expected %s, found %s" % (PCR4.hex(), extend_digest(bytes(32), TAMPERED_DIGEST).hex()) in out
    assert proc.counts("localhost")["failed"] == 1
    assert len(hosts["tampered"].received) > before
    assert all(data == b"" for data in hosts["tampered"].received)


def test_check_mode_and_bad_input(hosts, tmp_path):
    tasks = [
        {"name": "info check mode", "constellation.cluster.attestation_info": {"tcti": hosts["good_tpm"].tcti},
         "register": "info"},
        dump("info", tmp_path / "info.json"),
        {"name": "bad nonce", "constellation.cluster.attestation_info": {
            "tcti": hosts["good_tpm"].tcti, "nonce": "not a nonce!"}, "register": "bad_nonce", "ignore_errors": True},
        dump("bad_nonce", tmp_path / "bad_nonce.json"),
        {"name": "no policy", "constellation.cluster.verify_attestation": {"endpoint": hosts["good"].endpoint},
         "register": "no_policy", "ignore_errors": True},
        dump("no_policy", tmp_path / "no_policy.json"),
        {"name": "bad endpoint", "constellation.cluster.verify_attestation": {
            "endpoint": "127.0.0.1", "measurements": {"4": PCR4.hex()}}, "register": "bad_endpoint",
         "ignore_errors": True},
        dump("bad_endpoint", tmp_path / "bad_endpoint.json"),
    ]
    (tmp_path / "policy.yml").write_text("'4':\n  expected: %s\n  warnOnly: false\n" % PCR4.hex())
    tasks += [
        {"name": "base64 nonce", "constellation.cluster.attestation_info": {
            "tcti": hosts["good_tpm"].tcti, "nonce": "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
            "variant": "dummy"}, "register": "b64"},
        dump("b64", tmp_path / "b64.json"),
        {"name": "yaml policy", "constellation.cluster.verify_attestation": {
            "endpoint": hosts["good"].endpoint, "measurements_file": "policy.yml"}, "register": "yaml_policy"},
        dump("yaml_policy", tmp_path / "yaml_policy.json"),
        {"name": "dummy variant", "constellation.cluster.verify_attestation": {
            "endpoint": hosts["dummy"].endpoint, "variant": "dummy"}, "register": "dummy"},
        dump("dummy", tmp_path / "dummy.json"),
        {"name": "dummy host under qemu-vtpm", "constellation.cluster.verify_attestation": {
            "endpoint": hosts["dummy"].endpoint, "measurements": {"4": PCR4.hex()}}, "register": "dummy_refused",
         "ignore_errors": True},
        dump("dummy_refused", tmp_path / "dummy_refused.json"),
    ]
    proc = run_playbook(tmp_path, tasks, "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "info.json").read_text())["pcrs"]["4"] == PCR4.hex()
    b64 = json.loads((tmp_path / "b64.json").read_text())
    assert b64["nonce"] == bytes(range(32)).hex()
    assert json.loads(b64["document"])["Nonce"] == "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
    assert [(r["index"], r["ok"]) for r in json.loads((tmp_path / "yaml_policy.json").read_text())["pcrs"]] == [
        (4, True), (13, True)]
    dummy = json.loads((tmp_path / "dummy.json").read_text())
    assert dummy["oid"] == "1.3.9900.1.1" and dummy["pcrs"] == [] and not dummy.get("failed")
    refused = json.loads((tmp_path / "dummy_refused.json").read_text())
    assert refused["failed"] and "1.3.9900.1.1" in refused["msg"] and "1.3.9900.5.1" in refused["msg"]
    assert "nonce: expected a non-empty hex or standard base64 string" in json.loads(
        (tmp_path / "bad_nonce.json").read_text())["msg"]
    assert "measurements: expected a measurements policy" in json.loads(
        (tmp_path / "no_policy.json").read_text())["msg"]
    assert "endpoint: expected host:port" in json.loads((tmp_path / "bad_endpoint.json").read_text())["msg"]
