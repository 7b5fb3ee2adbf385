# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A swtpm of the test's own for the verification service's issuer (no TPM mocks)."""

from __future__ import annotations

import os
import shutil

import pytest


@pytest.fixture
def tpm(tmp_path):
    if not shutil.which("swtpm"):  # pragma: no cover - the environment has it
        pytest.skip("swtpm is not installed")
    from lab.swtpm import SwTPM, free_port

    os.environ.setdefault("TSS2_LOG", "all+none")
    tpm = SwTPM(str(tmp_path / "tpm"), free_port()).start()
    yield tpm
    tpm.stop()
