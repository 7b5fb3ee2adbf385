# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The SEV-SNP launch measurement (docs/image.md, "Launch measurement"): sev-snp-measure's own known answers
for edk2's firmware (testdata/sev_snp_measure/README.md), a UKI's parts measured as the same direct boot, Debian's
OVMF, and the filter's errors naming the argument."""

from __future__ import annotations

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


# (firmware, vcpus, vmm_type, direct boot with this command line or None, guest_features) -> the tool's answer
KNOWN_ANSWERS = [
    (AMDSEV, 1, "qemu", CMDLINE, 0x21,
     "803f691094946e42068aaa3a8f9e26a5c89f36f7b73ecfb2"
     "8c653360fe4b3aba7e534442e7e1e17895dfe778d0228977"),
    (AMDSEV, 1, "qemu", CMDLINE, 0x1,
     "6d287813eb5222d770f75005c664e34c204f385ce832cc2c"
     "e7d0d6f354454362f390ef83a92046c042e706363b4b08fa"),
    (AMDSEV, 1, "qemu", None, 0x21,
     "e1e1ca029dd7973ab9513295be68198472dcd4fc834bd9af"
     "9b63f6e8a1674dbf281a9278a4a2ebe0eed9f22adbcd0e2b"),
    (AMDSEV, 1, "qemu", None, 0x1,
     "19358ba9a7615534a9a1e2f0dfc29384dcd4dcb7062ff9c6"
     "013b26869a5fc6ecabe033c48dd6f6db5d6d76e7c5df632d"),
    (AMDSEV, 4, "qemu", "", 0x21,
     "4953b1fb416fa874980e8442b3706d345926d5f38879134e"
     "00813c5d7abcbe78eafe7b422907be0b4698e2414a631942"),
    (AMDSEV, 4, "qemu", "", 0x1,
     "5061fffb019493a903613d56d54b94912a1a2f9e4502385f"
     "5c194616753720a92441310ba6c4933de877c36e23046ad5"),
    (OVMFX64, 1, "qemu", None, 0x21,
     "28797ae0afaba4005a81e629acebfb59e6687949d6be4400"
     "7cd5506823b0dd66f146aaae26ff291eed7b493d8a64c385"),
    (OVMFX64, 1, "qemu", None, 0x1,
     "da0296de8193586a5512078dcd719eccecbd87e2b825ad41"
     "48c44f665dc87df21e5b49e21523a9ad993afdb6a30b4005"),
    (AMDSEV, 1, "ec2", "", 0x21,
     "0ce9ccc06bab55eebe8abc234f3df6514883977a68a591b7"
     "1052498ab52b2f1aa415db338033946ef93aa8278c0d67fb"),
    (AMDSEV, 1, "ec2", "", 0x1,
     "0883bd0eeb716e65b7b977a321c278d1e51b33b5c655fab9"
     "85443bbcc65c086b9c15e8a0bd8811050dec7e24964e5056"),
]


@pytest.mark.parametrize("ovmf,vcpus,vmm,cmdline,features,expected", KNOWN_ANSWERS)
def test_the_tools_own_known_answers(empty, ovmf, vcpus, vmm, cmdline, features, expected):
    boot = {} if cmdline is None else {"kernel": empty, "initrd": empty, "cmdline": cmdline}
    assert launch_measurement(ovmf, vcpus, vcpu_type="EPYC-v4", guest_features=features, vmm_type=vmm,
                              **boot) == expected


@pytest.mark.parametrize("vcpus,expected", [
    (1,
     "5da7106cf14cf46b1725ebab123eb9e53bd46a1e9f400cd0"
     "c08e7827b04b688ea8b4e403c8404efed4397ea5d5d0722e"),
    (4,
     "5c5debf100fc339f90276e761ee1f1658d08922c3b20e2a2"
     "e6c7a6c3370b2452a15a00eae11886a93d6fd1e7ab81e29d"),
])
def test_gce_needs_no_cpu_model(empty, vcpus, expected):
    assert launch_measurement(AMDSEV, vcpus, kernel=empty, initrd=empty, cmdline="", vmm_type="gce") == expected


def test_the_filter_gives_the_same_answer_from_playbook_style_arguments(empty):
    assert sev_snp_launch_measurement(AMDSEV, "1", vcpu_sig="0x800f12", kernel=empty, initrd=empty, cmdline=CMDLINE,
                                      guest_features="0x21") == KNOWN_ANSWERS[0][-1]


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
