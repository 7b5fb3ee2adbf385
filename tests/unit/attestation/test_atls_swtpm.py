# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""aTLS with the real qemu-vtpm issuer and validator on a swtpm (fixtures in conftest.py)."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils import atls
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError

vtpm = pytest.importorskip(
    "ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm")
measurements_mod = pytest.importorskip(
    "ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements")

from ansible_collections.constellation.cluster.tests.unit.attestation.atls_servers import (  # noqa: E402  pylint: disable=wrong-import-position
    RecordingServer, RelayingServer, ReplayingServer, NonceIgnoringServer, TamperingServer,
    exchange_ping, assert_refused_before_any_byte)

LAB_IMAGE_PCR4 = hashlib.sha256(b"constellation lab image: kernel").digest()


@pytest.fixture
def issuer(fresh_swtpm):
    with vtpm.VTPMIssuer(fresh_swtpm.tcti, event_log_path=None, banks=["sha256"]) as issuer:
        yield issuer


@pytest.fixture
def booted(fresh_swtpm, issuer):
    """The swtpm after a simulated measured boot: PCR 4 extended with the lab image digest."""
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation import tpm
    tpm.extend_pcr(fresh_swtpm.tcti, 4, LAB_IMAGE_PCR4)
    return measurements_mod.extend_digest(bytes(32), LAB_IMAGE_PCR4)


def policy(**pcrs):
    return measurements_mod.Measurements.from_dict(
        {str(k[3:]): v for k, v in pcrs.items()})


@pytest.fixture
def servers():
    started = []
    yield started
    for server in started:
        server.close()


def test_round_trip_swtpm(issuer, booted, servers):
    server = RecordingServer(atls.AttestedServerContext(issuer))
    servers.append(server)
    validator = vtpm.VTPMValidator(policy(pcr4=booted.hex(), pcr8="00" * 32,
                                          pcr15={"expected": "00" * 32, "warnOnly": False}))
    conn = atls.connect(server.endpoint, [validator])
    assert conn.variant_oid == "1.3.9900.5.1"
    assert conn.validation.pcrs[4] == booted
    assert set(conn.validation.pcrs) == set(range(24))
    assert [(c.index, c.ok) for c in conn.validation.checks] == [(4, True), (8, True), (15, True)]
    assert conn.validation.warnings == []
    exchange_ping(server, conn)


def test_warn_only_mismatch_connects_with_warning(issuer, booted, servers):
    server = RecordingServer(atls.AttestedServerContext(issuer))
    servers.append(server)
    validator = vtpm.VTPMValidator(policy(pcr4=booted.hex(), pcr14={"expected": "11" * 32, "warnOnly": True}))
    conn = atls.connect(server.endpoint, [validator])
    conn.sock.close()
    assert len(conn.validation.warnings) == 1 and "PCR 14" in conn.validation.warnings[0]


def test_refuses_wrong_enforced_pcr(issuer, booted, servers):
    server = RecordingServer(atls.AttestedServerContext(issuer))
    servers.append(server)
    wrong = hashlib.sha256(b"another image").hexdigest()
    validator = vtpm.VTPMValidator(policy(pcr4=wrong, pcr8="00" * 32))
    msg = assert_refused_before_any_byte(server, [validator], "PCR 4")
    assert wrong in msg and booted.hex() in msg


def test_refusal_keeps_pcr_table(issuer, booted, servers):
    server = RecordingServer(atls.AttestedServerContext(issuer))
    servers.append(server)
    validator = vtpm.VTPMValidator(policy(pcr4="22" * 32, pcr8="00" * 32))
    with pytest.raises(AttestationError) as caught:
        atls.connect(server.endpoint, [validator])
    checks = getattr(caught.value, "checks", None)
    assert checks is not None
    assert [(c.index, c.ok, c.found) for c in checks] == [(4, False, booted.hex()), (8, True, "00" * 32)]
    assert str(caught.value).startswith(server.endpoint + ": attestation refused")


def test_refuses_replayed_quote(issuer, booted, servers):
    server = RecordingServer(ReplayingServer(issuer))
    servers.append(server)
    assert_refused_before_any_byte(server, [vtpm.VTPMValidator(policy(pcr4=booted.hex()))], "extraData")


def test_refuses_relayed_quote(issuer, booted, servers):
    server = RecordingServer(RelayingServer(issuer))
    servers.append(server)
    assert_refused_before_any_byte(server, [vtpm.VTPMValidator(policy(pcr4=booted.hex()))],
                                   "bound to another key")


def test_refuses_quote_for_server_chosen_nonce(issuer, booted, servers):
    server = RecordingServer(NonceIgnoringServer(issuer))
    servers.append(server)
    assert_refused_before_any_byte(server, [vtpm.VTPMValidator(policy(pcr4=booted.hex()))], "extraData")


def test_dummy_document_refused_by_vtpm_client(booted, servers):
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import DummyIssuer
    server = RecordingServer(atls.AttestedServerContext(DummyIssuer()))
    servers.append(server)
    assert_refused_before_any_byte(server, [vtpm.VTPMValidator(policy(pcr4=booted.hex()))],
                                   "no attestation of an accepted variant")


def _edit(document, change):
    doc = json.loads(document)
    change(doc)
    return json.dumps(doc).encode()


def _flip_signature(document):
    doc = json.loads(document)
    sig = bytearray(base64.b64decode(doc["Attestation"]["quotes"][0]["raw_sig"]))
    sig[-1] ^= 1
    doc["Attestation"]["quotes"][0]["raw_sig"] = base64.b64encode(bytes(sig)).decode()
    return json.dumps(doc).encode()


@pytest.mark.parametrize("tamper", [
    lambda doc: doc[: len(doc) // 2],
    lambda doc: b"\x00garbage\xff",
    lambda doc: b"{}",
    lambda doc: _edit(doc, lambda d: d["Attestation"]["quotes"].insert(0, None)),
    lambda doc: _edit(doc, lambda d: d["Attestation"].update(ak_pub="AAAA")),
    _flip_signature,
], ids=["truncated", "garbage", "empty-object", "null-quote", "bad-ak", "bad-signature"])
def test_refuses_malformed_vtpm_document(issuer, booted, servers, tamper):
    server = RecordingServer(TamperingServer(issuer, lambda doc: (issuer.oid, tamper(doc))))
    servers.append(server)
    msg = assert_refused_before_any_byte(server, [vtpm.VTPMValidator(policy(pcr4=booted.hex()))],
                                         "attestation refused")
    assert "Traceback" not in msg
