# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The seed corpus of the fuzz tests: a real attestation document issued by swtpm (targets.build_corpus)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from ansible_collections.constellation.cluster.tests.unit.fuzz.targets import build_corpus, make_targets
from ansible_collections.constellation.cluster.tests.unit.worker_fixtures import worker_fixture

os.environ.setdefault("TSS2_LOG", "all+none")

if not shutil.which("swtpm"):  # pragma: no cover - the environment has it
    pytest.skip("swtpm is not installed", allow_module_level=True)


@worker_fixture
def corpus(get):  # pylint: disable=unused-argument
    workdir = tempfile.mkdtemp(prefix="unit-fuzz-corpus-")
    try:
        yield build_corpus(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@worker_fixture
def targets(get):
    made = {target.name: target for target in make_targets(get("corpus"))}
    yield made
    for target in made.values():
        for cleanup in target.cleanup:
            cleanup()
