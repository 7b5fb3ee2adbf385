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


def _git(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root)] + list(args), capture_output=True, check=check)


def _commit(root: Path, ref: str) -> Optional[str]:
    proc = _git(root, "rev-parse", "--verify", "--quiet", "%s^{commit}" % ref, check=False)
    return proc.stdout.decode().strip() or None


def previous_release(root: Path = ROOT) -> str:
    """The previous release's commit in the repository ``root`` (a full hash); NoRelease with what was tried
    when there is none."""
    ref = os.environ.get(ENV, "").strip()
    if ref:
        commit = _commit(root, ref)
        if commit is None:
            raise NoRelease("%s=%s: expected a git ref of this repository (a tag, branch or commit)" % (ENV, ref))
        return commit
    tag = _git(root, "describe", "--tags", "--abbrev=0", "--match", "v*", "HEAD", check=False).stdout.decode().strip()
    if tag:
        return _commit(root, tag) or ""
    blame = _git(root, "blame", "--porcelain", "-L", "/^version:/,+1", "HEAD", "--", "galaxy.yml", check=False)
    first = blame.stdout.decode().split(" ", 1)[0] if blame.returncode == 0 else ""
    if len(first) == 40 and first.strip("0"):
        return first
    raise NoRelease("no previous release: no v* tag is reachable from HEAD, and galaxy.yml's version line has no "
                    "commit (%s); set %s to a git ref" % (blame.stderr.decode().strip() or "not committed", ENV))


def export(ref: str, dest: Path, root: Path = ROOT) -> Path:
    """The tree of ``ref`` at ``dest`` (``git archive``: tracked files only), with the link scripts/setup.sh makes
    (``collections/ansible_collections/constellation/cluster`` -> the tree) so that its ansible.cfg finds its
    own collection."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=_git(root, "archive", "--format=tar", ref).stdout, check=True)
    link = dest / "collections" / "ansible_collections" / "constellation" / "cluster"
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(Path("..") / ".." / "..")
    return dest


# The one-line change that stands for the next release's agent (a comment: it behaves the same, measures otherwise).
NEXT_LINE = "# the next release\n"
NEXT_FILE = Path("agent") / "daemon.py"


def next_release(dest: Path, source: Path = ROOT) -> Path:
    """The agent of ``source`` with one line more, standing for the next release: a tree of ``bin/`` and
    ``plugins/module_utils`` (what an export holds of the agent) at ``dest``."""
    import shutil

    dest = Path(dest)
    (dest / "bin").mkdir(parents=True)
    shutil.copy2(str(Path(source) / "bin" / "constellation-agent"), str(dest / "bin"))
    shutil.copytree(str(Path(source) / "plugins" / "module_utils"), str(dest / "plugins" / "module_utils"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    changed = dest / "plugins" / "module_utils" / NEXT_FILE
    changed.write_text(changed.read_text() + NEXT_LINE)
    return dest


def agent_archive(code: Path, dest: Path) -> str:
    """The agent code folder ``code`` (a ``plugins/module_utils``) as the node_agent role's archive holds it (its
    ``*.py`` files, relative paths) at ``dest``; returns the archive's SHA-256."""
    import gzip
    import hashlib
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for path in sorted(Path(code).rglob("*.py")):
            tar.add(str(path), arcname=str(path.relative_to(code)))
    Path(dest).write_bytes(gzip.compress(buf.getvalue(), mtime=0))
    return hashlib.sha256(Path(dest).read_bytes()).hexdigest()


def upgrade_documents(in_force: dict, old: dict, new: dict, default_set: dict) -> tuple:
    """The agent upgrade's two documents from the one in force (``in_force``; ``default_set``: its set where it is
    a plain policy): the running agent (its entry there, by the value of ``old``, else ``old`` named "previous")
    beside ``new`` named "next", its version raised; then "next" alone, raised again. Returns (the running agent's
    names, the upgrade document, the retirement's)."""
    named = "accepted" in in_force
    version = in_force.get("version", 0) if named else 0
    accepted = in_force["accepted"] if named else {"default": default_set}
    running = {name: entry for name, entry in in_force.get("agents", {}).items() if entry["value"] == old["value"]}
    running = running or {"previous": old}
    upgrade = {"version": version + 1, "accepted": accepted, "agents": dict(running, next=new)}
    retire = {"version": version + 2, "accepted": accepted, "agents": {"next": new}}
    return sorted(running), upgrade, retire
