# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's simulated measured boot: each host's boot chain measures the same named image into PCRs 4, 9
and 11, as firmware, kernel and command line would; the policy is computed from the image, never read back
from the hosts (so a tampered host fails)."""

from __future__ import annotations

import hashlib
from typing import Dict, List

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import extend_digest

LAB_IMAGE = "constellation-lab-image-v1"
MEASURED_PCRS = (4, 9, 11)
# What `tamper` extends instead: a modified boot component.
TAMPERED_DIGEST = hashlib.sha256(b"tampered boot component").digest()


def image_digest(image: str, pcr: int) -> bytes:
    """The digest the boot chain of ``image`` extends into ``pcr``."""
    return hashlib.sha256(("%s/pcr%d" % (image, pcr)).encode()).digest()


def launch_measurement(image: str = LAB_IMAGE) -> bytes:
    """The SEV-SNP launch measurement of ``image`` on a lab platform (lab/snp_platform.py): a stand-in of 48 bytes
    derived from the image's name. A real one is the digest AMD's secure processor computes over the guest's
    initial memory (firmware, and with direct boot the kernel, initrd and command line), which an operator
    predicts with ``sev-snp-measure``; the lab boots no guest firmware, so its image names the value instead."""
    return hashlib.sha384(("%s/snp-launch" % image).encode()).digest()


def boot_digests(image: str) -> Dict[int, bytes]:
    """What the boot chain of ``image`` extends, by PCR."""
    return {pcr: image_digest(image, pcr) for pcr in MEASURED_PCRS}


def expected_pcr(digests: List[bytes]) -> bytes:
    """A SHA-256 PCR after extending each digest into the all-zero reset value."""
    value = bytes(32)
    for d in digests:
        value = extend_digest(value, d)
    return value


def lab_measurements(image: str = LAB_IMAGE) -> Dict[str, dict]:
    """The measurements policy of a lab image, computed from the image (never read back
    from the hosts, so a tampered host fails), in Constellation's JSON shape."""
    return {
        str(pcr): {"expected": expected_pcr([image_digest(image, pcr)]).hex(), "warnOnly": False}
        for pcr in MEASURED_PCRS
    }
