"""Shared fixtures (the kit: tests/support). The lab fixture builds real simulated hosts (network namespaces,
swtpm, wireguard-go); tests that use it are marked ``lab`` and need root."""

from __future__ import annotations

import os
import shutil

import pytest

# The kit's fixtures, by import (pytest finds fixtures in a conftest's namespace).
from tests.support.fixtures import lab_factory  # noqa: F401  pylint: disable=unused-import

# The test suite may use variant dummy (no security), which attestation/choose.py refuses anywhere
# else; agents, ansible-playbook and relays the tests start inherit it from this environment.
os.environ["CONSTELLATION_TEST_SUITE"] = "1"


def _lab_capable() -> str:
    if os.geteuid() != 0:
        return "the lab needs root (network namespaces)"
    for prog in ("ip", "nsenter", "unshare", "swtpm", "wireguard-go", "wg"):
        if shutil.which(prog) is None:
            return "the lab needs %s (make setup installs it)" % prog
    return ""


LAB_SKIP_REASON = _lab_capable()


def pytest_collection_modifyitems(config, items):
    if not LAB_SKIP_REASON:
        return
    skip = pytest.mark.skip(reason=LAB_SKIP_REASON)
    for item in items:
        if "lab" in item.keywords:
            item.add_marker(skip)
