# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""TPM access, the lab's measured boot, PCR 15 and the swtpm helper, on real swtpm."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import tpm as tpm_mod
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    Measurement,
    Measurements,
    expected_pcr15,
    extend_digest,
)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import VTPMIssuer, VTPMValidator
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError, InputError
from lab.swtpm import SwTPM, free_port
from tests.support.procs import alive

CLUSTER_ID = bytes.fromhex("128c164378fe8767f998fbdfe4b4d6463ec5ae1b664ea5999bc27417607ae9b6")


def test_read_all_24_pcrs_of_each_bank(swtpm):
    with tpm_mod.open_tpm(swtpm.tcti) as tpm:
        assert tpm.allocated_banks() == [4, 11, 12, 13]
        for bank, size in (("sha1", 20), ("sha256", 32), ("sha384", 48), ("sha512", 64)):
            values = tpm.pcr_read(bank)
            assert sorted(values) == list(range(24))
            assert {len(v) for v in values.values()} == {size}


def test_measured_boot_extend(fresh_swtpm):
    before = tpm_mod.read_pcrs(fresh_swtpm.tcti)
    digest = hashlib.sha256(b"lab-image kernel").digest()
    tpm_mod.extend_pcr(fresh_swtpm.tcti, 4, digest)
    after = tpm_mod.read_pcrs(fresh_swtpm.tcti)
    assert after[4] == extend_digest(before[4], digest)
    assert {i: v for i, v in after.items() if i != 4} == {i: v for i, v in before.items() if i != 4}


def test_pcr15_node_lock_matches_spec_vector(fresh_swtpm):
    assert not tpm_mod.is_initialized(fresh_swtpm.tcti)
    with VTPMIssuer(fresh_swtpm.tcti, event_log_path=None) as issuer:
        fresh_policy = Measurements({15: Measurement(bytes(32))})
        VTPMValidator(fresh_policy).validate(issuer.issue(b"u", b"n"), b"n")
        tpm_mod.mark_initialized(fresh_swtpm.tcti, CLUSTER_ID)
        assert tpm_mod.is_initialized(fresh_swtpm.tcti)
        value = tpm_mod.read_pcrs(fresh_swtpm.tcti)[15]
        assert value == expected_pcr15(CLUSTER_ID)
        assert value.hex() == "23400370357e846478cce7cc0c76cdfe4da077cc57b36dee0f665ede2c8b3f2f"
        # an initialized node can never attest as fresh again
        with pytest.raises(AttestationError, match="PCR 15: expected 0{64}, found 2340"):
            VTPMValidator(fresh_policy).validate(issuer.issue(b"u", b"n"), b"n")
        initialized = Measurements({15: Measurement(expected_pcr15(CLUSTER_ID))})
        assert VTPMValidator(initialized).validate(issuer.issue(b"u", b"n"), b"n").user_data == b"u"


def test_bad_arguments_name_the_field(swtpm):
    with tpm_mod.open_tpm(swtpm.tcti) as tpm:
        with pytest.raises(InputError, match="pcr: expected PCR index in 0..23"):
            tpm.pcr_extend(24, bytes(32))
        with pytest.raises(InputError, match="digest: expected 32 bytes"):
            tpm.pcr_extend(4, b"short")
        with pytest.raises(InputError, match="bank"):
            tpm.pcr_read("md5")
    with pytest.raises(InputError, match="cluster_id"):
        tpm_mod.mark_initialized(swtpm.tcti, b"too short")


def test_unreachable_tpm_is_a_clear_error():
    with pytest.raises(AttestationError, match="cannot open TPM via TCTI"):
        tpm_mod.TPM("swtpm:host=127.0.0.1,port=%d" % free_port())


def test_missing_nv_index_is_reported(swtpm):
    with tpm_mod.open_tpm(swtpm.tcti) as tpm:
        with pytest.raises(AttestationError, match="0x01c00002 is not defined"):
            tpm.nv_read(0x01C00002)


def test_swtpm_start_stop_leaves_nothing(tmp_path):
    tpm = SwTPM(str(tmp_path / "state"), free_port())
    tpm.start()
    pid = int((tmp_path / "state" / "swtpm.pid").read_text())
    assert tpm_mod.read_pcrs(tpm.tcti)[0] == bytes(32)
    tpm.stop()
    assert not alive(pid)
    assert not (tmp_path / "state" / "swtpm.pid").exists()
    tpm.start()  # state survives a restart; PCRs are reset by startup-clear
    assert tpm_mod.read_pcrs(tpm.tcti)[0] == bytes(32)
    tpm.destroy()
    assert not (tmp_path / "state").exists()


def test_swtpm_ek_cert_needs_ca_dir(tmp_path):
    with pytest.raises(ValueError, match="ca_dir"):
        SwTPM(str(tmp_path), 1, ek_cert=True)


def test_swtpm_in_network_namespace(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root for ip netns")
    name = "ctpm-%d" % os.getpid()
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
        tpm = SwTPM(str(tmp_path / "state"), 2321, netns=name).start()
        try:
            probe = subprocess.run(
                ["ip", "netns", "exec", name, "tpm2_pcrread", "-T", tpm.tcti, "sha256:15"],
                capture_output=True, text=True, check=False, env=dict(os.environ, TSS2_LOG="all+none"))
            assert probe.returncode == 0, probe.stderr
            assert "15:0x" + "0" * 64 in probe.stdout.replace(" ", "").lower()
        finally:
            tpm.stop()
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)
