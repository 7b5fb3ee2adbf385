# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Real swtpm instances on free loopback ports (no TPM mocks)."""

from __future__ import annotations

import os
import shutil

import pytest

from lab.swtpm import SwTPM, free_port

os.environ.setdefault("TSS2_LOG", "all+none")

if not shutil.which("swtpm"):  # pragma: no cover - the environment has it
    pytest.skip("swtpm is not installed", allow_module_level=True)


def _start(path, **kwargs) -> SwTPM:
    last = None
    for _attempt in range(5):  # a free port may be taken between probing and binding
        tpm = SwTPM(str(path), free_port(), **kwargs)
        try:
            return tpm.start()
        except Exception as err:  # pylint: disable=broad-except
            last = err
    raise last


@pytest.fixture(scope="session")
def swtpm(tmp_path_factory):
    """A plain swtpm (no EK cert; libtpms' default banks sha1, sha256, sha384, sha512)."""
    tpm = _start(tmp_path_factory.mktemp("swtpm-plain"))
    yield tpm
    tpm.stop()


@pytest.fixture
def fresh_swtpm(tmp_path):
    """A swtpm of its own, for tests that extend PCRs."""
    tpm = _start(tmp_path / "tpm")
    yield tpm
    tpm.stop()


@pytest.fixture(scope="session")
def ca_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("fleet-ca"))


@pytest.fixture(scope="session")
def other_ca_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("other-ca"))


@pytest.fixture(scope="session")
def swtpm_ek(tmp_path_factory, ca_dir):
    """A swtpm manufactured with an EK certificate from the fleet's CA."""
    tpm = _start(tmp_path_factory.mktemp("swtpm-ek"), ek_cert=True, ca_dir=ca_dir)
    yield tpm
    tpm.stop()


@pytest.fixture(scope="session")
def swtpm_other_ca(tmp_path_factory, other_ca_dir):
    """A swtpm whose EK certificate comes from a different CA."""
    tpm = _start(tmp_path_factory.mktemp("swtpm-other"), ek_cert=True, ca_dir=other_ca_dir)
    yield tpm
    tpm.stop()
