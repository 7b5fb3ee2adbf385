# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Secret files: written atomically with mode 0600, inspected without reading them out."""

from __future__ import annotations

import os
import secrets
import stat
from typing import Dict, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_write


def write_secret_file(path: str, data: bytes, mode: int = 0o600, exclusive: bool = False) -> bool:
    """Writes a secret atomically (fileutil.atomic_write). With exclusive, an existing file is
    never replaced, even when another process wins a race; returns False then."""
    return atomic_write(path, data, mode, exclusive)


def secret_file_state(path: str, data: Optional[bytes], mode: int = 0o600) -> Dict[str, object]:
    """What a secret file looks like now, metadata only: exists, mode, size, and whether its
    content equals data (compared in constant time). Never returns the content."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return {"path": path, "exists": False}
    if not stat.S_ISREG(info.st_mode):
        raise InputError("dest", "a regular file or nothing", path)
    state: Dict[str, object] = {"path": path, "exists": True, "mode": "%04o" % stat.S_IMODE(info.st_mode),
                                "size": info.st_size}
    if data is not None:
        same = False
        if info.st_size == len(data):
            with open(path, "rb") as handle:
                same = secrets.compare_digest(handle.read(len(data) + 1), data)
        state["content_matches"] = same
        state["mode_matches"] = stat.S_IMODE(info.st_mode) == mode
    return state
