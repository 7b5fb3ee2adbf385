# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The state disk tests' device: a 32 MiB file (cryptsetup formats a file as it formats a block device)."""

from __future__ import annotations

import pytest


@pytest.fixture
def image(tmp_path):
    path = tmp_path / "state.img"
    with open(path, "wb") as handle:
        handle.truncate(32 * 1024 * 1024)
    return str(path)
