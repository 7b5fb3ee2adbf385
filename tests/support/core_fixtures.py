# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fixtures of a Core for the unit tests of the Core, the RPC protocol and the agent (tests/unit/conftest.py
registers them): real swtpm (or an in-memory TPM), memory store, a recording VPN (WireGuard itself runs in the
lab tests), and ``cluster``: an activated Coordinator with two recorded Nodes (10.42.0.12 and .13). The fakes
implement the Core's ports (``core/ports.py``, tests/support/core_fakes.py)."""

from __future__ import annotations

import os

import pytest

from lab.swtpm import SwTPM, free_port
from ansible_collections.constellation.cluster.plugins.module_utils import core, kms
from ansible_collections.constellation.cluster.plugins.module_utils.core import ports
from ansible_collections.constellation.cluster.plugins.module_utils.store import MemoryStore

from ansible_collections.constellation.cluster.tests.support.core_fakes import (  # noqa: F401 pylint: disable=unused-import
    MemoryTPM, RecordingVPN, admin_pem, record_nodes,
)

os.environ.setdefault("TSS2_LOG", "all+none")


def start_swtpm(path) -> SwTPM:
    last = None
    for _attempt in range(5):
        tpm = SwTPM(str(path), free_port())
        try:
            return tpm.start()
        except Exception as err:  # pylint: disable=broad-except
            last = err
    raise last


@pytest.fixture
def swtpm(tmp_path):
    tpm = start_swtpm(tmp_path / "tpm")
    yield tpm
    tpm.stop()


@pytest.fixture
def swtpm_factory(tmp_path):
    """swtpm_factory() -> a started SwTPM of its own (stopped afterwards)."""
    started = []

    def make():
        tpm = start_swtpm(tmp_path / ("tpm%d" % len(started)))
        started.append(tpm)
        return tpm

    yield make
    for tpm in started:
        tpm.stop()


@pytest.fixture
def make_core(tmp_path):
    """make_core(tpm, store=None, public_ip=..., disk_uuid=...) -> (Core, RecordingVPN); ``tpm`` is a
    started SwTPM or a ``ports.TPM`` (e.g. MemoryTPM)."""
    counter = [0]

    def make(tpm, store=None, public_ip=None, disk_uuid=None):
        counter[0] += 1
        state_dir = tmp_path / ("agent%d" % counter[0])
        state_dir.mkdir()
        vpn = RecordingVPN()
        device = tpm if isinstance(tpm, ports.TPM) else core.TPMDevice(tpm.tcti)
        c = core.Core(store if store is not None else MemoryStore(), device, vpn, str(state_dir),
                      public_ip or "10.42.0.%d" % (10 + counter[0]), disk_uuid or core.new_disk_uuid())
        return c, vpn

    return make


@pytest.fixture
def cluster(make_core):
    c, vpn = make_core(MemoryTPM(), public_ip="10.42.0.11")
    c.recovery.load()
    c.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), admin_pem())
    nodes = record_nodes(c, ("10.42.0.12", "10.42.0.13"))
    return c, vpn, nodes
