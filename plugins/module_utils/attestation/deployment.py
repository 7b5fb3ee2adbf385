# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How an agent is deployed, and what its TPM can prove against the host's root there (docs/attestation.md,
"What host root can write"; docs/security.md, "At rest").

On a TPM 2.0 PC-client platform, root (locality 0) can extend every PCR 0-23 and reset 16 and 23 within the
same boot. An extension never undoes what was measured before, so a PCR proves something against root only for
the events measured before root could act - firmware and boot loader (PCRs 0-7), the boot stub's 9, 11 and 12,
the kernel command line - and only when the genuine boot ends in a value that no later extension from the
expected start reaches. A PCR that nothing earlier than userspace measures or caps proves nothing against root:
root extends it with the same public digests as the genuine software would.

``host`` (the only mode today, the default): the agent is installed on an ordinary host (the ``node_agent`` role,
the lab). Nothing earlier than userspace measures the agent, so PCR 13 - which the agent extends itself - is
replayable by root, as are 16 and 23. The storage key is therefore sealed to the boot chain's PCRs only, and
host root is trusted on this peer: it can read the peer's secrets in that boot. A later image mode, where the
boot chain measures or caps PCR 13 before userspace runs, keeps PCR 13 in the seal; its rule goes here.
"""

from __future__ import annotations

from typing import FrozenSet

from ansible_collections.constellation.cluster.plugins.module_utils.constants import PCR_INDEX_AGENT
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError

HOST = "host"
MODES = (HOST,)
DEFAULT = HOST
# PCRs root can reset to zero within a boot (locality 0 on a PC-client platform).
RESETTABLE_PCRS = frozenset({16, 23})

HOST_ROOT_WARNING = ("deployment_mode host: host root is trusted on this peer (the agent runs on an ordinary host: "
                     "nothing before userspace measures it, so root can replay PCR %d and read this peer's secrets "
                     "in a genuine boot)" % PCR_INDEX_AGENT)


def check_mode(mode) -> str:
    """``mode`` if it is a deployment mode this agent supports, else InputError naming the key."""
    if mode not in MODES:
        raise InputError("deployment_mode", "one of %s (an image mode, where the boot chain measures the agent, "
                         "is not supported yet)" % ", ".join(MODES), mode)
    return mode


def replayable_pcrs(mode: str = DEFAULT) -> FrozenSet[int]:
    """The PCRs root can bring to any genuine value in the same boot under ``mode``: those nothing earlier than
    userspace measures or caps (the agent's own PCR 13 on an ordinary host) and the resettable ones."""
    check_mode(mode)
    return frozenset({PCR_INDEX_AGENT}) | RESETTABLE_PCRS


def host_root_trusted(mode: str = DEFAULT) -> bool:
    """Whether root of the host can read this peer's secrets (true wherever PCR 13 is replayable)."""
    return PCR_INDEX_AGENT in replayable_pcrs(mode)


def warning(mode: str = DEFAULT) -> str:
    """What every agent start and every verify.yml run says about ``mode`` ("" when nothing)."""
    return HOST_ROOT_WARNING if host_root_trusted(mode) else ""
