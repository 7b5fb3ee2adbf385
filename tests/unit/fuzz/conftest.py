# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The seed corpus of the fuzz tests: a real attestation document issued by swtpm (targets.build_corpus)."""

from __future__ import annotations

import os
import shutil

import pytest

from ansible_collections.constellation.cluster.tests.unit.fuzz.targets import build_corpus, make_targets

os.environ.setdefault("TSS2_LOG", "all+none")

if not shutil.which("swtpm"):  # pragma: no cover - the environment has it
    pytest.skip("swtpm is not installed", allow_module_level=True)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    return build_corpus(str(tmp_path_factory.mktemp("fuzz-corpus")))


@pytest.fixture(scope="session")
def targets(corpus):
    made = {target.name: target for target in make_targets(corpus)}
    yield made
    for target in made.values():
        for cleanup in target.cleanup:
            cleanup()
