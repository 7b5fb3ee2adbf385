# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The module planner: which commands are Ansible's pipelined module execution, so that the agent
may run them in a pre-warmed interpreter (``ExecModule``); everything else goes to ``Exec``."""

from __future__ import annotations

import os
import re
import shlex
from typing import Dict, Optional

from ansible.module_utils.common.text.converters import to_bytes


_SHELLS = ("/bin/sh", "/bin/bash", "/bin/dash", "/usr/bin/sh", "/usr/bin/bash", "/usr/bin/dash")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def pipelined_module(cmd: str, in_data: Optional[bytes]):
    """(interpreter, env) when ``cmd``/``in_data`` is Ansible's pipelined module execution
    (``/bin/sh -c '[NAME=value ...] /path/python [&& sleep 0]'`` with the payload on stdin), else None.

    Only that exact shape qualifies; anything else (become, a shell construct, expansions) is left
    to Exec, and the agent runs ``cmd`` itself whenever it cannot run the payload warm."""
    if not in_data or not in_data.startswith(b"#!"):
        return None
    try:
        outer = shlex.split(cmd)
    except ValueError:
        return None
    if len(outer) != 3 or outer[0] not in _SHELLS or outer[1] != "-c":
        return None
    inner = outer[2]
    if any(c in inner for c in "$`\\;|<>(){}*?[]~\n"):
        return None
    try:
        words = shlex.split(inner)
    except ValueError:
        return None
    env: Dict[str, str] = {}
    while words and "=" in words[0]:
        name, _eq, value = words.pop(0).partition("=")
        if not _ENV_NAME.match(name):
            return None
        env[name] = value
    if words[1:] not in ([], ["&&", "sleep", "0"]) or not words:
        return None
    interpreter = words[0]
    if not os.path.isabs(interpreter) or not os.path.basename(interpreter).startswith("python"):
        return None
    if in_data.split(b"\n", 1)[0] != b"#!" + to_bytes(interpreter):
        return None
    return interpreter, env
