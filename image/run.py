# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The image build's process boundary: every tool runs through ``run`` (argv, no shell), a failure is an
ImageError naming the step and the tool's last output lines."""

from __future__ import annotations

import os
import subprocess
from typing import Dict, List, Optional


class ImageError(Exception):
    """A build or boot step failed; the message names the step."""


def run(argv: List[str], what: str, env: Optional[Dict[str, str]] = None, timeout: float = 1800.0,
        cwd: Optional[str] = None) -> str:
    """Runs ``argv``; returns its stdout. ImageError naming ``what`` when it fails or is missing."""
    full_env = dict(os.environ, LC_ALL="C.UTF-8")
    if env:
        full_env.update(env)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=full_env, timeout=timeout,
                              cwd=cwd)
    except FileNotFoundError:
        raise ImageError("%s: %s is not installed (scripts/setup.sh installs it)" % (what, argv[0])) from None
    except subprocess.TimeoutExpired:
        raise ImageError("%s: %s took longer than %.0f s" % (what, argv[0], timeout)) from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr + proc.stdout).strip().splitlines()[-15:])
        raise ImageError("%s: %s exited %d:\n%s" % (what, " ".join(argv[:3]), proc.returncode, tail))
    return proc.stdout
