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

``host`` (the default): the agent is installed on an ordinary host (the ``node_agent`` role, the lab). Nothing
earlier than userspace measures the agent, so PCR 13 - which the agent extends itself - is replayable by root, as
are 16 and 23. The storage key is therefore sealed to the boot chain's PCRs only, and host root is trusted on this
peer: it can read the peer's secrets in that boot.

``image``: the agent runs inside the measured, immutable node image (docs/security.md, "Deployment modes"): a
UKI whose command line carries the dm-verity root hash, measured by the boot chain into PCRs 4, 9 and 11 before
userspace runs, and no login. The agent's code and its trust configuration are part of the verity-protected root,
so the boot chain already proves them: the agent does NOT extend PCR 13 (it stays 32 zero bytes, which the
image's measurement set enforces: attestation/agent_measurement.py ``enforce_agent_pcr``). PCR 13's genuine value
there is what any code running as root reaches by doing nothing, and 16 and 23 are resettable: they stay
replayable and are never sealed to. But no one can log in as root, and whatever runs as root was measured before
it ran: a changed root file system fails dm-verity, a changed UKI or command line changes PCR 4/9/11. Host root is
therefore not trusted on an image peer, and the storage key is sealed to the boot-chain PCRs of each accepted set
(core/at_rest.py ``sealed_pcrs``).
"""

from __future__ import annotations

from typing import FrozenSet

from ansible_collections.constellation.cluster.plugins.module_utils.constants import PCR_INDEX_AGENT
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError

HOST = "host"
IMAGE = "image"  # only the node image's baked agent config sets it (the node_agent role refuses it)
MODES = (HOST, IMAGE)
DEFAULT = HOST
# PCRs root can reset to zero within a boot (locality 0 on a PC-client platform).
RESETTABLE_PCRS = frozenset({16, 23})

HOST_ROOT_WARNING = ("deployment_mode host: host root is trusted on this peer (the agent runs on an ordinary host: "
                     "nothing before userspace measures it, so root can replay PCR %d and read this peer's secrets "
                     "in a genuine boot)" % PCR_INDEX_AGENT)


def check_mode(mode) -> str:
    """``mode`` if it is a deployment mode this agent supports, else InputError naming the key."""
    if mode not in MODES:
        raise InputError("deployment_mode", "one of %s (host: an ordinary host; image: the measured node image)"
                         % ", ".join(MODES), mode)
    return mode


def replayable_pcrs(mode: str = DEFAULT) -> FrozenSet[int]:
    """The PCRs root can bring to any genuine value in the same boot under ``mode``: those nothing earlier than
    userspace measures or caps and the resettable ones. PCR 13 in both modes: on an ordinary host the agent extends
    it from userspace with public digests; in the image its genuine value is zero, what it holds when nothing
    extends it, so any code running as root reaches it by doing nothing."""
    check_mode(mode)
    return frozenset({PCR_INDEX_AGENT}) | RESETTABLE_PCRS


def extends_agent_pcr(mode: str = DEFAULT) -> bool:
    """Whether the agent measures itself into PCR 13 at start: on an ordinary host only (in the image the boot
    chain's PCR 11 and dm-verity cover the agent's code and trust configuration)."""
    return check_mode(mode) == HOST


def host_root_trusted(mode: str = DEFAULT) -> bool:
    """Whether root of the host can read this peer's secrets: on an ordinary host, where the agent is measured
    from userspace (PCR 13 replayable by root); not in the image, which has no login and whose every executable the
    boot chain measured (PCR 11 covers the verity root hash)."""
    return check_mode(mode) == HOST


def warning(mode: str = DEFAULT) -> str:
    """What every agent start and every verify.yml run says about ``mode`` ("" when nothing)."""
    return HOST_ROOT_WARNING if host_root_trusted(mode) else ""
