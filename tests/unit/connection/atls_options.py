# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The atls connection plugin's options as get_option gives them, for this room's tests."""

from __future__ import annotations

POLICY = {"4": {"expected": "aa" * 32, "warnOnly": False}, "9": {"expected": "bb" * 32, "warnOnly": True}}


def options(key_file, **changes):
    opts = {"host": "10.0.0.5", "port": 9000, "endpoint": None, "measurements": POLICY, "measurements_file": None,
            "attestation_variant": "qemu-vtpm", "admin_priv_key_file": key_file, "connect_timeout": 10,
            "attestation_timeout": 30, "command_timeout": 0, "persist": 60, "control_path_dir": "~/.ansible/cp",
            "netns": None, "warm_interpreter": True, "ek_ca_path": None, "amd_roots": None, "fresh_proof": True,
            "measurements_pub_key_file": None, "prestart": True, "admin_priv_key_passphrase": None,
            # These tests use qemu-vtpm on purpose (no EK CA needed): acknowledged, as the plugin requires.
            "insecure_trust_any_ak": True}
    opts.update(changes)
    return opts.__getitem__
