# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one way the Core starts a program (wg, wireguard-go, ip, kubeadm): ``CommandRunner.run``
returns a ``CommandResult`` and raises ``ExternalCommandError`` naming the program, its exit code
and its stderr. Tests replace or prefix the runner at this process boundary (a lab host's
``nsenter`` prefix, the kubeadm test double on PATH)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Tuple, Union

from ansible_collections.constellation.cluster.plugins.module_utils.errors import ExternalCommandError


@dataclass(frozen=True)
class CommandResult:
    rc: int
    stdout: str
    stderr: str
    argv: Tuple[str, ...] = ()


class CommandRunner:
    """Runs programs. ``prefix`` is prepended to every argv (e.g. a lab host's
    ``nsenter --mount=... --net=...``); ``env`` is added to the environment; ``timeout`` is the
    default time limit in seconds."""

    def __init__(self, prefix: Sequence[str] = (), env: Optional[Mapping[str, str]] = None, timeout: float = 30.0):
        self.prefix = list(prefix)
        self.env = dict(env or {})
        self.timeout = timeout

    def run(self, argv: Sequence[str], check: bool = True, env: Optional[Mapping[str, str]] = None,
            stdin: Optional[Union[str, bytes]] = None, new_session: bool = False, timeout: Optional[float] = None) -> CommandResult:
        """Runs argv (after the prefix). ``check``: a non-zero exit raises ExternalCommandError.
        ``new_session``: start it in its own session, so a daemon it leaves behind is not killed
        with the caller's process group (Ansible's worker kills its group when it is terminated).
        ``stdin`` as bytes is passed as it is (a binary key: never on argv); the output is then decoded."""
        full = self.prefix + list(argv)
        run_env = dict(os.environ)
        run_env.update(self.env)
        run_env.update(env or {})
        limit = self.timeout if timeout is None else timeout
        binary = isinstance(stdin, bytes)
        try:
            proc = subprocess.run(full, input=stdin, capture_output=True, text=not binary, env=run_env,
                                  timeout=limit, check=False, start_new_session=new_session)
        except FileNotFoundError as err:
            raise ExternalCommandError(list(argv), 127, str(err)) from None
        except subprocess.TimeoutExpired:
            raise ExternalCommandError(list(argv), -1, "timed out after %ss" % limit) from None
        stdout, stderr = proc.stdout, proc.stderr
        if binary:
            stdout, stderr = stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace")
        result = CommandResult(proc.returncode, stdout, stderr, tuple(argv))
        if check and proc.returncode != 0:
            raise ExternalCommandError(list(argv), proc.returncode, stderr)
        return result


def run_command(argv: Sequence[str], timeout: float = 900.0, env: Optional[Mapping[str, str]] = None) -> CommandResult:
    """One program, no prefix, no exit-code check (the caller decides): the kubeadm seam."""
    return CommandRunner(env=env).run(argv, check=False, timeout=timeout)
