# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The previous release, for the upgrade tests: ``previous_release()`` names its commit, ``export(ref, dest)``
writes its tree (``git archive``) to a folder, where its playbooks run with its own collection
(``ANSIBLE_COLLECTIONS_PATH=<dest>/collections``) and its agent is installed on lab hosts.

The previous release is the newest ``v*`` tag reachable from HEAD; ``CONSTELLATION_PREVIOUS_RELEASE`` (any git
ref) overrides it. Without a tag, the commit that introduced galaxy.yml's current ``version:`` line stands for
it (the release the version names)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Optional

from tests.support import ROOT

ENV = "CONSTELLATION_PREVIOUS_RELEASE"


class NoRelease(RuntimeError):
    """No previous release can be found."""


def _git(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT)] + list(args), capture_output=True, check=check)


def _commit(ref: str) -> Optional[str]:
    proc = _git("rev-parse", "--verify", "--quiet", "%s^{commit}" % ref, check=False)
    return proc.stdout.decode().strip() or None


def previous_release() -> str:
    """The previous release's commit (a full hash); NoRelease with what was tried when there is none."""
    ref = os.environ.get(ENV, "").strip()
    if ref:
        commit = _commit(ref)
        if commit is None:
            raise NoRelease("%s=%s: expected a git ref of this repository (a tag, branch or commit)" % (ENV, ref))
        return commit
    tag = _git("describe", "--tags", "--abbrev=0", "--match", "v*", "HEAD", check=False).stdout.decode().strip()
    if tag:
        return _commit(tag) or ""
    blame = _git("blame", "--porcelain", "-L", "/^version:/,+1", "HEAD", "--", "galaxy.yml", check=False)
    first = blame.stdout.decode().split(" ", 1)[0] if blame.returncode == 0 else ""
    if len(first) == 40 and first.strip("0"):
        return first
    raise NoRelease("no previous release: no v* tag is reachable from HEAD, and galaxy.yml's version line has no "
                    "commit (%s); set %s to a git ref" % (blame.stderr.decode().strip() or "not committed", ENV))


def export(ref: str, dest: Path) -> Path:
    """The tree of ``ref`` at ``dest`` (``git archive``: tracked files only), with the link scripts/setup.sh makes
    (``collections/ansible_collections/constellation/cluster`` -> the tree) so that its ansible.cfg finds its
    own collection."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=_git("archive", "--format=tar", ref).stdout, check=True)
    link = dest / "collections" / "ansible_collections" / "constellation" / "cluster"
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(Path("..") / ".." / "..")
    return dest
