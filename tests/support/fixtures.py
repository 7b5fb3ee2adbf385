# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kit's pytest fixtures (tests/conftest.py imports them). A module-scoped lab with its cluster is built
with ``tests.support.cluster.lab_cluster`` in the module's own fixture."""

from __future__ import annotations

import pytest

from lab.lab import Lab


@pytest.fixture
def lab_factory():
    """lab_factory(name, hosts=3, tpm=False, agents=False, **Lab options) -> Lab (up); torn down afterwards."""
    labs = []

    def make(name: str, hosts: int = 3, tpm: bool = False, agents: bool = False, **kw) -> Lab:
        lab = Lab(name, **kw)
        labs.append(lab)
        return lab.up(hosts=hosts, tpm=tpm, agents=agents)

    yield make
    for lab in labs:
        lab.down()
