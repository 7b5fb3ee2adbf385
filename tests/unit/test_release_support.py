# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""tests/support/release.py: which commit the upgrade test takes as the previous release, on a repository made
here (the newest v* tag reachable from HEAD; the environment's override; without a tag, the commit of galaxy.yml's
version line), and its export with the collection link."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from tests.support.release import ENV, NoRelease, export, previous_release

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(repo, *args):
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.org", "PATH": "/usr/bin:/bin", "HOME": str(repo)}
    return subprocess.run(["git", "-C", str(repo)] + list(args), capture_output=True, check=True, env=env,
                          text=True).stdout.strip()


def _commit(repo, galaxy, message):
    (repo / "galaxy.yml").write_text(galaxy)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", message)
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    _git(tmp_path, "init", "-q")
    return tmp_path


def test_the_newest_tag_reachable_from_head(repo):
    first = _commit(repo, "namespace: c\nversion: 0.1.0\n", "0.1.0")
    _git(repo, "tag", "v0.1.0")
    second = _commit(repo, "namespace: c\nversion: 0.2.0\n", "0.2.0")
    _git(repo, "tag", "v0.2.0")
    _commit(repo, "namespace: c\nversion: 0.2.0\nname: x\n", "later work")
    assert previous_release(repo) == second != first


def test_without_a_tag_the_commit_of_the_version_line(repo):
    introduced = _commit(repo, "namespace: c\nversion: 0.2.0\n", "0.2.0")
    _commit(repo, "namespace: c\nversion: 0.2.0\nname: x\n", "later work")
    assert previous_release(repo) == introduced


def test_the_environment_overrides_and_a_bad_ref_is_named(repo, monkeypatch):
    first = _commit(repo, "namespace: c\nversion: 0.1.0\n", "0.1.0")
    _commit(repo, "namespace: c\nversion: 0.2.0\n", "0.2.0")
    monkeypatch.setenv(ENV, "HEAD~1")
    assert previous_release(repo) == first
    monkeypatch.setenv(ENV, "no-such-ref")
    with pytest.raises(NoRelease, match="CONSTELLATION_PREVIOUS_RELEASE=no-such-ref: expected a git ref"):
        previous_release(repo)


def test_no_release_at_all_is_a_clear_failure(repo):
    (repo / "README").write_text("x\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "no galaxy.yml")
    with pytest.raises(NoRelease, match="no previous release: no v\\* tag"):
        previous_release(repo)


def test_the_export_finds_its_own_collection(repo, tmp_path_factory):
    commit = _commit(repo, "namespace: c\nversion: 0.1.0\n", "0.1.0")
    dest = export(commit, tmp_path_factory.mktemp("export"), repo)
    assert (dest / "galaxy.yml").read_text() == "namespace: c\nversion: 0.1.0\n"
    assert (dest / "collections" / "ansible_collections" / "constellation" / "cluster" / "galaxy.yml").exists()
