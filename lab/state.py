# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's record of what it built: ``<state dir>/state.json``, read once by ``Lab`` and written whole.

The file format is the one labs were always written with (a JSON object, these keys, indent 2), so that
``python -m lab status`` and ``down`` work on a lab built by an older checkout; a key missing from an old
file takes the default the lab had before the key existed."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from ansible_collections.constellation.cluster.plugins.module_utils import fileutil
from lab.image import LAB_IMAGE
from lab.names import LAB_VARIANT

STATE_FILE = "state.json"


@dataclass
class LabState:
    phase: str = ""  # "building" while up/grow runs, "up" once done; "" for no lab
    hosts: int = 0
    tpm: bool = False
    image: str = LAB_IMAGE
    agents: bool = False  # the lab starts an agent on each host (`up --agents`)
    variant: str = LAB_VARIANT
    store: str = "file"
    # The agents the lab starts itself are provisioned with the lab's init secret hash and signed policy.
    trust: bool = False
    coordinators: int = 1
    # An sshd per host and no agent (`up --bare`): bare hosts for playbooks/bootstrap.yml (lab/ssh.py).
    sshd: bool = False
    # Hosts rebooted into another image than ``image`` (`lab reimage`): host name -> image name.
    host_images: dict = dataclasses.field(default_factory=dict)

    def image_of(self, host: str) -> str:
        """The image host ``host`` booted last."""
        return self.host_images.get(host, self.image)

    @classmethod
    def load(cls, state_dir: Path) -> "LabState":
        """The record in ``state_dir``; an empty one (phase "") when there is none or it is unreadable."""
        try:
            data = json.loads((Path(state_dir) / STATE_FILE).read_text())
        except (OSError, ValueError):
            return cls()
        if not isinstance(data, dict):
            return cls()
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def save(self, state_dir: Path) -> None:
        fileutil.atomic_write(str(Path(state_dir) / STATE_FILE),
                              json.dumps(dataclasses.asdict(self), indent=2).encode("utf-8"), 0o644)

    def same_build(self, other: "LabState") -> bool:
        """Whether ``other`` asks for the lab this record describes (phase aside)."""
        mine, theirs = dataclasses.asdict(self), dataclasses.asdict(other)
        for key in ("phase", "trust", "host_images"):
            mine.pop(key)
            theirs.pop(key)
        return mine == theirs
