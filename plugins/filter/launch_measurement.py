# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter sev_snp_launch_measurement: a thin adapter over plugin_utils/launch_measurement.py.
Its documentation is in sev_snp_launch_measurement.yml next to this file."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
from ansible_collections.constellation.cluster.plugins.plugin_utils.launch_measurement import launch_measurement


def _number(value, name):
    """Jinja hands over numbers as int or, from a variable file, as text ("0x21", "4")."""
    if isinstance(value, str):
        try:
            return int(value, 0)
        except ValueError:
            raise AnsibleFilterError("sev_snp_launch_measurement: %s: expected a number, got %r"
                                     % (name, value)) from None
    return value


def sev_snp_launch_measurement(ovmf, vcpus, vcpu_type=None, vcpu_sig=None, kernel=None, initrd=None, cmdline=None,
                               uki=None, guest_features=0x1, vmm_type="qemu"):
    """ovmf_path | sev_snp_launch_measurement(vcpus=N, vcpu_type=..., ...) -> 96 hex characters."""
    try:
        return launch_measurement(
            ovmf, _number(vcpus, "vcpus"), vcpu_type=vcpu_type,
            vcpu_sig=None if vcpu_sig is None else _number(vcpu_sig, "vcpu_sig"), kernel=kernel, initrd=initrd,
            cmdline=cmdline, uki=uki, guest_features=_number(guest_features, "guest_features"), vmm_type=vmm_type)
    except ConstellationError as err:
        raise AnsibleFilterError("sev_snp_launch_measurement: %s" % err) from None


class FilterModule:
    """AMD SEV-SNP launch measurement filter."""

    def filters(self):
        return {"sev_snp_launch_measurement": sev_snp_launch_measurement}
