# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Real swtpm instances on free loopback ports (no TPM mocks)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from ansible_collections.constellation.cluster.tests.unit.worker_fixtures import worker_fixture
from lab.swtpm import SwTPM, free_port
from tests.support.ek_vendor import Vendor, pem
from tests.support.keys import measurements_key

# The plain policy of the ``inv`` fixture's signed document.
INVENTORY_PCRS = {"4": {"expected": "ab" * 32, "warnOnly": False}}

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


@worker_fixture
def swtpm(get):
    """A plain swtpm (no EK cert; libtpms' default banks sha1, sha256, sha384, sha512)."""
    tpm = _start(os.path.join(get("worker_dir"), "swtpm-plain"))
    yield tpm
    tpm.stop()


@pytest.fixture
def fresh_swtpm(tmp_path):
    """A swtpm of its own, for tests that extend PCRs."""
    tpm = _start(tmp_path / "tpm")
    yield tpm
    tpm.stop()


@pytest.fixture
def fresh_swtpm_ek(tmp_path):
    """A swtpm of its own with an EK certificate (of a CA of its own), for tests that provision keys and NV."""
    (tmp_path / "ek-ca").mkdir()
    tpm = _start(tmp_path / "tpm-ek", ek_cert=True, ca_dir=str(tmp_path / "ek-ca"))
    yield tpm
    tpm.stop()


@worker_fixture
def worker_dir(get):  # pylint: disable=unused-argument
    """A directory for this worker's swtpm states and CAs, removed when its session ends."""
    path = tempfile.mkdtemp(prefix="unit-swtpm-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@worker_fixture
def ca_dir(get):
    path = os.path.join(get("worker_dir"), "fleet-ca")
    os.makedirs(path)
    return path


@worker_fixture
def other_ca_dir(get):
    path = os.path.join(get("worker_dir"), "other-ca")
    os.makedirs(path)
    return path


@worker_fixture
def swtpm_ek(get):
    """A swtpm manufactured with an EK certificate from the fleet's CA."""
    tpm = _start(os.path.join(get("worker_dir"), "swtpm-ek"), ek_cert=True, ca_dir=get("ca_dir"))
    yield tpm
    tpm.stop()


@worker_fixture
def swtpm_other_ca(get):
    """A swtpm whose EK certificate comes from a different CA."""
    tpm = _start(os.path.join(get("worker_dir"), "swtpm-other"), ek_cert=True, ca_dir=get("other_ca_dir"))
    yield tpm
    tpm.stop()


@pytest.fixture
def ek_ca_path(swtpm_ek, tmp_path):
    """The fleet's EK CA bundle (root + intermediate), as an operator pins it."""
    path = tmp_path / "ek_ca.pem"
    path.write_bytes(b"".join(Path(p).read_bytes() for p in swtpm_ek.ca_cert_paths()))
    return str(path)


@pytest.fixture
def inv(tmp_path):
    """An inventory's files: the EK CA, the signed plain policy (INVENTORY_PCRS), the signing key and the pinned
    public key."""
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation import signature

    (tmp_path / "ek_ca.pem").write_bytes(pem(Vendor("Test TPM vendor").root))
    key = measurements_key(tmp_path / "measurements.pub")
    (tmp_path / "measurements.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    doc = tmp_path / "measurements.json"
    doc.write_text(json.dumps(INVENTORY_PCRS, indent=2) + "\n")
    (tmp_path / "measurements.json.sig").write_text(signature.sign_blob(key, doc.read_bytes()) + "\n")
    return tmp_path
