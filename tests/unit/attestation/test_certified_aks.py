# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The AKs certified in one playbook run, shared by its processes (plugin_utils/certified_aks.py), with a
real swtpm: a later process of the same run trusts the AK without enrolling it again, yet still
validates every quote against the policy; another run, a record file others could write, or a
record that does not chain to the CAs gets nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.ek import (
    EnrollmentRequired, VTPMEKIssuer, enroll)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    Measurement, Measurements)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.tpm import read_pcrs
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError
from ansible_collections.constellation.cluster.plugins.plugin_utils import certified_aks

NONCE = b"r" * 32


@pytest.fixture(scope="module")
def ek_issuer(swtpm_ek):
    with VTPMEKIssuer(swtpm_ek.tcti, event_log_path=None) as iss:
        yield iss


def _trust(tpm):
    return choose.load_trust("qemu-vtpm-ek", tpm.ca_cert_paths())


def _policy(tpm, **changed):
    pcrs = read_pcrs(tpm.tcti)
    return Measurements({i: Measurement(bytes.fromhex(changed[str(i)]) if str(i) in changed else pcrs[i])
                         for i in (0, 4, 15)})


def _validate(tpm, issuer, trust, policy=None):
    validator = choose.validator("qemu-vtpm-ek", policy or _policy(tpm), trust)
    return validator.validate(issuer.issue(b"spki", NONCE), NONCE)


def test_an_ak_enrolled_once_in_a_run_is_trusted_by_its_other_processes(ek_issuer, swtpm_ek, tmp_path):
    folder = str(tmp_path / "cp")
    first = certified_aks.share(_trust(swtpm_ek), folder, os.getpid())
    with pytest.raises(EnrollmentRequired):
        _validate(swtpm_ek, ek_issuer, first)
    first.certified_aks.add(enroll(ek_issuer, swtpm_ek.ca_cert_paths()))  # as connect_enrolling does
    (records,) = [p for p in os.listdir(folder) if p.startswith("aks-")]
    assert os.stat(os.path.join(folder, records)).st_mode & 0o777 == 0o600
    assert os.stat(folder).st_mode & 0o777 == 0o700

    # A later process of the same run (a task worker, the connection's relay) builds its own Trust.
    later = certified_aks.share(_trust(swtpm_ek), folder, os.getpid())
    result = _validate(swtpm_ek, ek_issuer, later)
    assert result.user_data == b"spki" and all(check.ok for check in result.checks)
    # Only the enrollment is shared: a measurement that differs from the policy is still refused.
    with pytest.raises(AttestationError) as refused:
        _validate(swtpm_ek, ek_issuer, later, _policy(swtpm_ek, **{"4": "ab" * 32}))
    assert not isinstance(refused.value, EnrollmentRequired)
    assert [check.index for check in refused.value.checks if not check.ok] == [4]
    # Another run (another playbook process) enrolls again.
    with pytest.raises(EnrollmentRequired):
        _validate(swtpm_ek, ek_issuer, certified_aks.share(_trust(swtpm_ek), folder, os.getppid()))


def test_records_others_could_write_or_that_do_not_chain_are_not_taken(ek_issuer, swtpm_ek, swtpm_other_ca,
                                                                       tmp_path):
    folder = str(tmp_path / "cp")
    path = certified_aks.records_path(folder, os.getpid())
    with VTPMEKIssuer(swtpm_other_ca.tcti, event_log_path=None) as other:
        foreign = enroll(other, swtpm_other_ca.ca_cert_paths())  # certified by a verifier trusting another CA
    genuine = enroll(ek_issuer, swtpm_ek.ca_cert_paths())
    with open(path, "w", encoding="ascii") as handle:
        handle.write(json.dumps(foreign.to_dict()) + "\n" + "not json\n" + json.dumps(genuine.to_dict()) + "\n")
    os.chmod(path, 0o600)
    shared = certified_aks.share(_trust(swtpm_ek), folder, os.getpid())
    assert shared.certified_aks.get(foreign.ak_pub) is None
    assert shared.certified_aks.get(genuine.ak_pub) == genuine

    os.chmod(path, 0o644)  # readable (and so perhaps written) by others: ignored, and not written to
    shared = certified_aks.share(_trust(swtpm_ek), folder, os.getpid())
    assert len(shared.certified_aks) == 0
    shared.certified_aks.add(genuine)
    assert open(path, encoding="ascii").read().count("\n") == 3

    os.chmod(folder, 0o755)  # a folder others may enter: nothing is shared at all
    trust = _trust(swtpm_ek)
    assert certified_aks.share(trust, folder, os.getpid()) is trust


def test_records_of_ended_runs_are_removed_and_other_variants_share_nothing(ek_issuer, swtpm_ek, tmp_path):
    folder = str(tmp_path / "cp")
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                           check=True)
    os.makedirs(folder, mode=0o700)
    stale = os.path.join(folder, "aks-%s-1.jsonl" % ended.stdout.strip())
    with open(stale, "w", encoding="ascii") as handle:
        handle.write("{}\n")
    shared = certified_aks.share(_trust(swtpm_ek), folder, os.getpid())
    shared.certified_aks.add(enroll(ek_issuer, swtpm_ek.ca_cert_paths()))
    assert not os.path.exists(stale)
    assert os.path.exists(certified_aks.records_path(folder, os.getpid()))

    plain = choose.load_trust("qemu-vtpm", None, insecure_trust_any_ak=True)
    assert certified_aks.share(plain, folder, os.getpid()) is plain
