# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Makes the worker fixtures (worker_fixtures.py) before ansible-test forks for a test, ends them
when the worker's session finishes."""

from __future__ import annotations

import os

import pytest

from ansible_collections.constellation.cluster.tests.unit import worker_fixtures
from ansible_collections.constellation.cluster.tests.support.core_fixtures import (  # noqa: F401 pylint: disable=unused-import
    cluster, make_core, swtpm, swtpm_factory,
)
from ansible_collections.constellation.cluster.tests.support.kubeadm_fixtures import (  # noqa: F401 pylint: disable=unused-import
    apiserver, control_plane_dir, double_log, init_params, initialised, join,
)

# The test suite may use variant dummy (no security), which attestation/choose.py refuses anywhere
# else; agents, ansible-playbook and relays the tests start inherit it from this environment.
os.environ["CONSTELLATION_TEST_SUITE"] = "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):  # pylint: disable=unused-argument
    worker_fixtures.prepare(item)
    yield


def pytest_sessionfinish(session, exitstatus):  # pylint: disable=unused-argument
    worker_fixtures.close_all()
