# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The SEV-SNP launch measurement (docs/image.md, "Launch measurement"): sev-snp-measure's own known answers
for edk2's firmware (testdata/sev_snp_measure/README.md), a UKI's parts measured as the same direct boot, Debian's
OVMF, and the filter's errors naming the argument."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.constellation.cluster.plugins.filter.launch_measurement import sev_snp_launch_measurement
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.plugin_utils.launch_measurement import launch_measurement

from ansible_collections.constellation.cluster.tests.unit.attestation import ukis

DATA = Path(__file__).parent / "testdata" / "sev_snp_measure"
AMDSEV = str(DATA / "ovmf_AmdSev_suffix.bin")
OVMFX64 = str(DATA / "ovmf_OvmfX64_suffix.bin")
DEBIAN_OVMF = "/usr/share/OVMF/OVMF_CODE_4M.fd"
CMDLINE = "console=ttyS0 loglevel=7"


@pytest.fixture(name="empty")
def fixture_empty(tmp_path):
    """An empty kernel and initrd (the tool's tests pass /dev/null: the same SHA-256)."""
    path = tmp_path / "empty"
    path.write_bytes(b"")
    return str(path)


# sev-snp-measure's own expectations for these firmware files (testdata/sev_snp_measure/README.md): the firmware,
# vCPUs, VMM, CPU model, a direct boot's command line (null: no direct boot; the kernel and initrd are empty) and
# SEV_FEATURES -> the launch measurement
KNOWN_ANSWERS = json.loads((DATA / "known_answers.json").read_text())


@pytest.mark.parametrize("case", KNOWN_ANSWERS, ids=lambda case: "%(ovmf)s-%(vcpus)d-%(vmm_type)s" % case)
def test_the_tools_own_known_answers(empty, case):
    boot = {} if case["cmdline"] is None else {"kernel": empty, "initrd": empty, "cmdline": case["cmdline"]}
    assert launch_measurement(str(DATA / case["ovmf"]), case["vcpus"], vcpu_type=case["vcpu_type"],
                              guest_features=case["guest_features"], vmm_type=case["vmm_type"],
                              **boot) == case["launch_measurement"]


def test_the_filter_gives_the_same_answer_from_playbook_style_arguments(empty):
    assert sev_snp_launch_measurement(AMDSEV, "1", vcpu_sig="0x800f12", kernel=empty, initrd=empty, cmdline=CMDLINE,
                                      guest_features="0x21") == KNOWN_ANSWERS[0]["launch_measurement"]


def test_the_launch_measurement_changes_with_what_is_booted(empty, tmp_path):
    other = tmp_path / "other-kernel"
    other.write_bytes(b"\x00")
    base = launch_measurement(AMDSEV, 1, vcpu_type="EPYC-Milan", kernel=empty, initrd=empty, cmdline=CMDLINE)
    changed = {
        launch_measurement(AMDSEV, 1, vcpu_type="EPYC-Milan", kernel=str(other), initrd=empty, cmdline=CMDLINE),
        launch_measurement(AMDSEV, 1, vcpu_type="EPYC-Milan", kernel=empty, initrd=str(other), cmdline=CMDLINE),
        launch_measurement(AMDSEV, 1, vcpu_type="EPYC-Milan", kernel=empty, initrd=empty, cmdline=CMDLINE + " x"),
        launch_measurement(AMDSEV, 2, vcpu_type="EPYC-Milan", kernel=empty, initrd=empty, cmdline=CMDLINE),
        launch_measurement(AMDSEV, 1, vcpu_type="EPYC-Genoa", kernel=empty, initrd=empty, cmdline=CMDLINE),
    }
    assert base not in changed and len(changed) == 5


@ukis.skip_without_stub[0]
@ukis.skip_without_stub[1]
def test_a_ukis_parts_measure_as_the_same_direct_boot(tmp_path):
    uki = ukis.build_uki(tmp_path)
    linux, initrd = tmp_path / "linux", tmp_path / "initrd"
    linux.write_bytes(ukis.kernel())
    initrd.write_bytes(ukis.INITRD)
    from_parts = launch_measurement(AMDSEV, 2, vcpu_type="EPYC-Milan", kernel=str(linux), initrd=str(initrd),
                                    cmdline=ukis.CMDLINE)
    assert launch_measurement(AMDSEV, 2, vcpu_type="EPYC-Milan", uki=uki) == from_parts


@pytest.mark.skipif(not os.path.exists(DEBIAN_OVMF), reason="Debian's ovmf package is not installed")
def test_debians_ovmf_has_the_sev_metadata_but_no_kernel_hashes_page(empty):
    """Debian 12's OVMF is edk2's OvmfPkgX64 build: it measures for a guest booting its disk, and a measured direct
    boot is refused naming the firmware (it needs the AmdSev build)."""
    value = launch_measurement(DEBIAN_OVMF, 2, vcpu_type="EPYC-Milan")
    assert len(value) == 96 and int(value, 16) and value == value.lower()
    assert launch_measurement(DEBIAN_OVMF, 4, vcpu_type="EPYC-Milan") != value
    with pytest.raises(InputError, match=r"^ovmf: expected a firmware with a kernel hashes page .*has none"):
        launch_measurement(DEBIAN_OVMF, 2, vcpu_type="EPYC-Milan", kernel=empty, initrd=empty, cmdline="")


def test_a_direct_boot_with_a_firmware_without_kernel_hashes_is_refused(empty):
    with pytest.raises(InputError, match=r"^ovmf: expected a firmware with a kernel hashes page"):
        launch_measurement(OVMFX64, 1, vcpu_type="EPYC-v4", kernel=empty)


@pytest.mark.parametrize("args,kwargs,message", [
    (("/nonexistent/OVMF.fd", 1), {"vcpu_type": "EPYC-v4"}, r"ovmf: expected an existing file on the controller"),
    ((AMDSEV, 0), {"vcpu_type": "EPYC-v4"}, r"vcpus: expected the guest's vCPU count, 1 to 512, got 0"),
    ((AMDSEV, 1), {}, r"vcpu_type: expected the guest's CPU model"),
    ((AMDSEV, 1), {"vcpu_type": "Pentium"}, r"vcpu_type: expected one of QEMU's CPU models .*got 'Pentium'"),
    ((AMDSEV, 1), {"vcpu_type": "EPYC", "vcpu_sig": 1}, r"vcpu_sig: expected either vcpu_type or vcpu_sig"),
    ((AMDSEV, 1), {"vcpu_sig": 1 << 32}, r"vcpu_sig: expected a 32-bit CPUID signature"),
    ((AMDSEV, 1), {"vcpu_type": "EPYC", "vmm_type": "xen"}, r"vmm_type: expected one of qemu, ec2, gce, got 'xen'"),
    ((AMDSEV, 1), {"vcpu_type": "EPYC", "cmdline": "x"}, r"kernel: expected the kernel that initrd and cmdline"),
    ((AMDSEV, 1), {"vcpu_type": "EPYC", "guest_features": -1}, r"guest_features: expected the VMSA's 64-bit"),
    ((AMDSEV, 1), {"vcpu_type": "EPYC", "uki": AMDSEV, "kernel": AMDSEV}, r"uki: expected a UKI or kernel"),
    ((AMDSEV, 1), {"vcpu_type": "EPYC", "uki": AMDSEV}, r"uki: expected "),
])
def test_bad_arguments_are_refused_naming_the_argument(args, kwargs, message):
    with pytest.raises(InputError, match="^" + message):
        launch_measurement(*args, **kwargs)
    with pytest.raises(AnsibleFilterError, match="^sev_snp_launch_measurement: " + message):
        sev_snp_launch_measurement(*args, **kwargs)


@pytest.mark.parametrize("content", [b"", b"\xff" * 4096, os.urandom(8192)])
def test_a_file_that_is_no_sev_firmware_is_refused_naming_ovmf(tmp_path, content):
    path = tmp_path / "not-ovmf.fd"
    path.write_bytes(content)
    with pytest.raises(InputError, match=r"^ovmf: expected an OVMF build with AMD SEV metadata"):
        launch_measurement(str(path), 1, vcpu_type="EPYC-v4")


def test_a_number_the_filter_cannot_read_is_refused():
    with pytest.raises(AnsibleFilterError, match=r"^sev_snp_launch_measurement: vcpus: expected a number, got 'four'"):
        sev_snp_launch_measurement(AMDSEV, "four", vcpu_type="EPYC")
