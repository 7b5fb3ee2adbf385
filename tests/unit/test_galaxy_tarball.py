# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The built collection (``make build``: scripts/build-collection.sh, as a user or Galaxy gets it) stands on its own:

* its README (galaxy.yml's ``readme``: README.md at the root, the file galaxy-importer renders) is the installed
  collection's, not the repository's: it names no tool of the repository (``make``, the lab, the repository's
  ansible.cfg, scripts/, .venv): README.galaxy.md, which the build puts in place of the repository's README.md;
* no shipped text file cites a file the tarball lacks: every path it cites (the rules of tests/support/citations.py)
  that names a file of the repository names one the tarball contains too, unless the citation is the text of a
  link to that very file in the repository (galaxy.yml's ``repository``), which a reader can follow (the text
  may go on: ``tests/<file>.py::test_y``).
"""

from __future__ import annotations

import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from ansible_collections.constellation.cluster.tests.support import citations

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = ROOT / ".venv" / "bin"
GALAXY = yaml.safe_load((ROOT / "galaxy.yml").read_text())
# What the repository has and an installed collection has not: its tools, named as a reader would type them.
REPOSITORY_TOOLS = re.compile(r"\bmake\s+[a-z]|python3? -m (?:lab|image)\b|\bansible\.cfg\b|(?<![\w/])scripts/|\.venv/")


@pytest.fixture(scope="module")
def tarball(tmp_path_factory):
    """The collection as ``make build`` makes it (scripts/build-collection.sh), unpacked: the root of its files."""
    out = tmp_path_factory.mktemp("build")
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run(["sh", str(ROOT / "scripts" / "build-collection.sh"), str(out)],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    archive = out / ("%s-%s-%s.tar.gz" % (GALAXY["namespace"], GALAXY["name"], GALAXY["version"]))
    root = out / "collection"
    with tarfile.open(archive) as tar:
        tar.extractall(root, filter="data")
    return root


def test_the_readme_galaxy_shows_is_the_installed_collections(tarball):
    readme = GALAXY["readme"]
    # galaxy-importer renders README.md of the collection's root and refuses a collection without one.
    assert readme == "README.md" and (tarball / readme).is_file(), "galaxy.yml's readme: %s" % readme
    assert (tarball / readme).read_text(encoding="utf-8") == (ROOT / "README.galaxy.md").read_text(encoding="utf-8")
    assert not (tarball / "README.galaxy.md").exists()
    text = (tarball / readme).read_text(encoding="utf-8")
    tools = sorted(set(match.group(0) for match in REPOSITORY_TOOLS.finditer(text)))
    assert not tools, "%s names what only the repository has: %s" % (readme, tools)


def _linked(prose: str) -> str:
    """The prose without the links whose text begins with a path (``tests/<file>.py``, ``tests/<file>.py::test_y``) and
    whose target is that path in the repository."""
    repository = re.escape(GALAXY["repository"].rstrip("/"))
    pattern = re.compile(r"\[`?([^\]`]+)`?\]\(%s/(?:blob|tree)/[\w.-]+/([^)#\s]+)[^)]*\)" % repository)
    return pattern.sub(lambda m: "" if m.group(1).startswith(m.group(2).rstrip("/")) else m.group(0), prose)


def test_no_shipped_file_cites_a_file_the_tarball_lacks(tarball):
    missing = []
    for path, rel in citations.repository_text_files(tarball):
        if rel.startswith(citations.HISTORY) or rel in ("MANIFEST.json", "FILES.json"):
            continue
        for prose in citations.prose(path, rel):
            prose = _linked(prose)
            for cited in citations.CITED_PATH.findall(prose):
                target = citations.repository_file(ROOT, cited, rel)
                if target and not (tarball / target).exists():
                    missing.append("%s cites %s" % (rel, target))
            for cited in citations.BARE_DOCUMENT.findall(prose):
                places = (Path(cited), Path(rel).parent / cited)
                if any((ROOT / p).exists() for p in places) and not any((tarball / p).exists() for p in places):
                    missing.append("%s cites %s" % (rel, cited))
    assert not missing, "shipped files citing what the tarball lacks (ship it, or link to it in the repository):\n" \
        + "\n".join(sorted(set(missing)))
