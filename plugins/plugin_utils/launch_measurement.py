# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The launch measurement an AMD SEV-SNP guest will report (docs/image.md, "Launch measurement"), computed
on the controller with virtee's sev-snp-measure from the firmware (OVMF), the directly booted kernel, initrd and
command line (or a UKI's parts) and the guest's vCPUs. The result is what a measurements document's
``snp.launchMeasurement`` takes.

Here, not in module_utils: sev-snp-measure is a controller requirement (requirements.txt), never installed on a
node, and everything under module_utils is what a node imports (the repository's test_node_packages.py). The
``sev_snp_launch_measurement`` filter is the adapter."""

from __future__ import annotations

import os
import tempfile
from typing import Optional

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.image_prediction import (
    MAX_UKI,
    stub_cmdline,
    uki_sections,
)

VMM_TYPES = ("qemu", "ec2", "gce")
MAX_VCPUS = 512  # KVM's limit per guest; a larger count is a typo


def _tool():
    """sev-snp-measure's modules, or a clear error naming the missing controller requirement."""
    try:
        from sevsnpmeasure import guest, vcpu_types, vmm_types  # pylint: disable=import-outside-toplevel
        from sevsnpmeasure.sev_mode import SevMode  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise ConstellationError("sev_snp_launch_measurement: the Python package sev-snp-measure is not installed "
                                 "on the controller (pip install -r requirements.txt)") from None
    return guest, vcpu_types, vmm_types, SevMode


def _file(path: object, field: str) -> str:
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise InputError(field, "the path of a file on the controller", path)
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise InputError(field, "an existing file on the controller", path)
    return path


def _vcpu_sig(vcpu_types, vmm: str, vcpu_type: Optional[str], vcpu_sig: Optional[int]) -> Optional[int]:
    if vcpu_type is not None and vcpu_sig is not None:
        raise InputError("vcpu_sig", "either vcpu_type or vcpu_sig, not both", vcpu_sig)
    if vcpu_type is not None:
        if vcpu_type not in vcpu_types.CPU_SIGS:
            raise InputError("vcpu_type", "one of QEMU's CPU models %s" % ", ".join(sorted(vcpu_types.CPU_SIGS)),
                             vcpu_type)
        return vcpu_types.CPU_SIGS[vcpu_type]
    if vcpu_sig is not None:
        if isinstance(vcpu_sig, bool) or not isinstance(vcpu_sig, int) or not 0 <= vcpu_sig < 1 << 32:
            raise InputError("vcpu_sig", "a 32-bit CPUID signature (CPUID Fn0000_0001_EAX)", vcpu_sig)
        return vcpu_sig
    if vmm == "qemu":
        raise InputError("vcpu_type", "the guest's CPU model (QEMU's -cpu, e.g. EPYC-Milan) or vcpu_sig", None)
    return None  # EC2's and GCE's VMSAs do not hold the signature


def launch_measurement(ovmf: str, vcpus: int, vcpu_type: Optional[str] = None, vcpu_sig: Optional[int] = None,
                       kernel: Optional[str] = None, initrd: Optional[str] = None, cmdline: Optional[str] = None,
                       uki: Optional[str] = None, guest_features: int = 0x1, vmm_type: str = "qemu") -> str:
    """The 48-byte SNP launch digest as 96 lower-case hex characters.

    ``ovmf``: the firmware file the VMM loads (it must carry OVMF's SEV metadata). ``kernel``/``initrd``/``cmdline``:
    a measured direct boot (QEMU's -kernel/-initrd/-append with kernel-hashes=on; the firmware must be edk2's AmdSev
    build, which has the kernel hashes page); ``uki``: the same from a UKI's .linux, .initrd and .cmdline sections.
    Without either, the guest boots from its disk and only the firmware is measured at launch. ``guest_features``:
    the VMSA's SEV_FEATURES (0x1, SNPActive, for Linux 6.8 and later under QEMU; 0x21 for older ones).
    """
    guest, vcpu_types, vmm_types, sev_mode = _tool()
    ovmf = _file(ovmf, "ovmf")
    if isinstance(vcpus, bool) or not isinstance(vcpus, int) or not 1 <= vcpus <= MAX_VCPUS:
        raise InputError("vcpus", "the guest's vCPU count, 1 to %d" % MAX_VCPUS, vcpus)
    if vmm_type not in VMM_TYPES:
        raise InputError("vmm_type", "one of %s" % ", ".join(VMM_TYPES), vmm_type)
    if isinstance(guest_features, bool) or not isinstance(guest_features, int) or not 0 <= guest_features < 1 << 64:
        raise InputError("guest_features", "the VMSA's 64-bit SEV_FEATURES (0x1 for Linux 6.8 and later)",
                         guest_features)
    sig = _vcpu_sig(vcpu_types, vmm_type, vcpu_type, vcpu_sig)
    vmm = {"qemu": vmm_types.VMMType.QEMU, "ec2": vmm_types.VMMType.ec2, "gce": vmm_types.VMMType.gce}[vmm_type]
    if uki is not None and (kernel is not None or initrd is not None or cmdline is not None):
        raise InputError("uki", "a UKI or kernel/initrd/cmdline, not both", uki)
    if kernel is None and (initrd is not None or cmdline is not None):
        raise InputError("kernel", "the kernel that initrd and cmdline are booted with", None)
    if cmdline is not None and not isinstance(cmdline, str):
        raise InputError("cmdline", "the kernel command line as text", cmdline)
    with tempfile.TemporaryDirectory(prefix="snp-measure-") as scratch:
        if uki is not None:
            kernel, initrd, cmdline = _uki_parts(_file(uki, "uki"), scratch)
        elif kernel is not None:
            kernel = _file(kernel, "kernel")
            initrd = _file(initrd, "initrd") if initrd is not None else None
        try:
            digest = guest.calc_launch_digest(sev_mode.SEV_SNP, vcpus, sig, ovmf, kernel, initrd, cmdline,
                                              guest_features, vmm_type=vmm)
        except RuntimeError as err:
            if "SNP_KERNEL_HASHES" in str(err):
                raise InputError("ovmf", "a firmware with a kernel hashes page (edk2's OvmfPkg/AmdSev build) for a "
                                 "measured direct boot", "%s has none" % ovmf) from None
            raise InputError("ovmf", "an OVMF build with AMD SEV metadata", "%s: %s" % (ovmf, err)) from None
        except (ValueError, IndexError, OSError) as err:  # a footer table or metadata that does not parse
            raise InputError("ovmf", "an OVMF build with AMD SEV metadata", "%s: %s" % (ovmf, err)) from None
    if len(digest) != 48:
        raise ConstellationError("sev-snp-measure returned %d bytes, not a 48-byte launch digest" % len(digest))
    return digest.hex()


def _uki_parts(path: str, scratch: str):
    """The UKI's kernel and initrd written to ``scratch`` (sev-snp-measure hashes files) and its command line
    (uki_sections requires the three)."""
    if os.path.getsize(path) > MAX_UKI:
        raise InputError("uki", "a UKI of at most %d bytes" % MAX_UKI, os.path.getsize(path))
    with open(path, "rb") as handle:
        sections = uki_sections(handle.read(), "uki")
    kernel = os.path.join(scratch, "linux")
    with open(kernel, "wb") as handle:
        handle.write(sections[".linux"])
    initrd = os.path.join(scratch, "initrd")
    with open(initrd, "wb") as handle:
        handle.write(sections[".initrd"])
    cmdline = stub_cmdline(sections[".cmdline"].rstrip(b"\x00"))
    return kernel, initrd, cmdline
