# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Secrets sealed to a TPM (attestation/sealing.py, core/at_rest.py) on real swtpm instances: the state folder
copied to another TPM, a tampered boot PCR and a changed agent (PCR 13) each cannot unseal, and say so."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import sealing, tpm
from ansible_collections.constellation.cluster.plugins.module_utils.core.at_rest import SEALED_KEY_FILE, SealedStorage
from ansible_collections.constellation.cluster.plugins.module_utils.errors import StateError
from ansible_collections.constellation.cluster.plugins.module_utils.store import FileStore
from ansible_collections.constellation.cluster.tests.unit.attestation.conftest import _start

PCRS = [4, 9, 11, 13]
SECRET = b"kms://cluster-kms?key=c2VjcmV0&salt=c2FsdA"


def _boot(tcti, image=b"image"):
    """A measured boot and agent: PCRs 4, 9, 11 from the image, 13 from the agent."""
    with tpm.open_tpm(tcti) as dev:
        for pcr in PCRS:
            dev.pcr_extend(pcr, hashlib.sha256(image + b"/%d" % pcr).digest())


def _storage(folder, tcti):
    return SealedStorage.open(str(folder), lambda: tpm.open_tpm(tcti), PCRS)


def _write_state(folder, tcti):
    folder.mkdir(parents=True, exist_ok=True)
    storage = _storage(folder, tcti)
    store = FileStore(str(folder / "store.json"), cipher=storage)
    store.put("kmsData", SECRET)
    storage.write_file(str(folder / "state_disk.key"), b"\x42" * 32)
    return storage


def test_the_state_folder_holds_no_secret_in_plain_form_and_reopens_on_the_same_tpm(fresh_swtpm, tmp_path):
    tmp_path = tmp_path / "state"
    _boot(fresh_swtpm.tcti)
    _write_state(tmp_path, fresh_swtpm.tcti)
    for path in tmp_path.iterdir():
        data = path.read_bytes()
        assert SECRET not in data and b"c2VjcmV0" not in data and b"\x42" * 32 not in data, path.name
    blob = json.loads(json.loads((tmp_path / SEALED_KEY_FILE).read_text())["blobs"][0]["blob"])
    assert blob["pcrs"] == PCRS and blob["hash"] == "sha256"
    again = _storage(tmp_path, fresh_swtpm.tcti)  # the agent restarted (same boot)
    assert FileStore(str(tmp_path / "store.json"), cipher=again).get("kmsData") == SECRET
    assert again.read_file(str(tmp_path / "state_disk.key")) == b"\x42" * 32


def test_a_state_folder_copied_to_another_tpm_cannot_be_unsealed(fresh_swtpm, tmp_path):
    _boot(fresh_swtpm.tcti)
    _write_state(tmp_path / "h1", fresh_swtpm.tcti)
    other = _start(tmp_path / "other-tpm")
    try:
        _boot(other.tcti)  # the same image and agent: identical PCR values
        shutil.copytree(str(tmp_path / "h1"), str(tmp_path / "copy"))
        with pytest.raises(StateError, match="sealed on another TPM") as err:
            _storage(tmp_path / "copy", other.tcti)
        assert "state folder copied from another host" in str(err.value)
    finally:
        other.stop()


def test_a_tampered_boot_pcr_cannot_unseal(fresh_swtpm, tmp_path):
    tmp_path = tmp_path / "state"
    _boot(fresh_swtpm.tcti)
    _write_state(tmp_path, fresh_swtpm.tcti)
    fresh_swtpm.stop(orderly=True)
    fresh_swtpm.start()  # a reboot: PCRs reset, keys kept
    _boot(fresh_swtpm.tcti, image=b"tampered image")
    with pytest.raises(StateError, match="PCRs 4, 9, 11, 13 differ from when it was sealed"):
        _storage(tmp_path, fresh_swtpm.tcti)


def test_a_changed_agent_cannot_unseal_and_the_genuine_one_can_after_a_reboot(fresh_swtpm, tmp_path):
    tmp_path = tmp_path / "state"
    _boot(fresh_swtpm.tcti)
    _write_state(tmp_path, fresh_swtpm.tcti)
    with tpm.open_tpm(fresh_swtpm.tcti) as dev:  # another agent (or configuration) measured itself too
        dev.pcr_extend(13, hashlib.sha256(b"modified agent").digest())
    with pytest.raises(StateError, match="another agent or agent configuration"):
        _storage(tmp_path, fresh_swtpm.tcti)
    fresh_swtpm.stop(orderly=True)
    fresh_swtpm.start()
    _boot(fresh_swtpm.tcti)  # rebooted into the measured state: the secrets come back
    assert FileStore(str(tmp_path / "store.json"), cipher=_storage(tmp_path, fresh_swtpm.tcti)).get("kmsData") == SECRET


def test_a_ciphertext_is_bound_to_its_file_and_plain_files_are_refused(fresh_swtpm, tmp_path):
    tmp_path = tmp_path / "state"
    _boot(fresh_swtpm.tcti)
    storage = _write_state(tmp_path, fresh_swtpm.tcti)
    shutil.copy(str(tmp_path / "state_disk.key"), str(tmp_path / "other.key"))
    with pytest.raises(StateError, match="does not decrypt"):
        storage.read_file(str(tmp_path / "other.key"))
    (tmp_path / "plain.key").write_bytes(b"\x42" * 32)
    with pytest.raises(StateError, match="is not sealed"):
        storage.read_file(str(tmp_path / "plain.key"))


def test_sealing_refuses_oversized_data_and_a_foreign_blob(fresh_swtpm):
    with tpm.open_tpm(fresh_swtpm.tcti) as dev:
        with pytest.raises(sealing.SealError, match="1 to 128 bytes"):
            sealing.seal(dev, b"x" * 129, [13])
        with pytest.raises(sealing.SealError, match="not one this agent wrote"):
            sealing.unseal(dev, b'{"version": 9}')


def test_the_seal_covers_the_enforced_boot_pcrs_and_the_agents_not_15_nor_warn_only():
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import Measurements
    from ansible_collections.constellation.cluster.plugins.module_utils.core.at_rest import sealed_pcrs

    policy = Measurements.from_dict({"4": {"expected": "11" * 32, "warnOnly": False}, "9": "22" * 32,
                                     "14": {"expected": "00" * 32, "warnOnly": True},
                                     "15": {"expected": "00" * 32, "warnOnly": False}})
    assert sealed_pcrs(policy) == [4, 9, 13]


# ---------------------------------------------------------------- re-sealed ahead of a reboot (issue 28, image upgrade)

AGENT = hashlib.sha256(b"agent").digest()


def _boot_image(tcti, image: bytes):
    """A measured boot of ``image`` (PCRs 4, 9, 11) and the agent (PCR 13, the same for every image)."""
    with tpm.open_tpm(tcti) as dev:
        for pcr in (4, 9, 11):
            dev.pcr_extend(pcr, hashlib.sha256(image + b"/%d" % pcr).digest())
        dev.pcr_extend(13, AGENT)


def _predicted(image: bytes):
    """What a set of ``image`` expects: each boot PCR extended once from zeros."""
    return [4, 9, 11], {pcr: hashlib.sha256(bytes(32) + hashlib.sha256(image + b"/%d" % pcr).digest()).digest()
                        for pcr in (4, 9, 11)}


def _reboot(swtpm, image: bytes):
    swtpm.stop(orderly=True)
    swtpm.start()
    _boot_image(swtpm.tcti, image)


def test_the_key_sealed_ahead_to_the_next_image_unseals_after_the_reboot_and_a_retired_one_does_not(fresh_swtpm, tmp_path):
    folder = tmp_path / "state"
    _boot_image(fresh_swtpm.tcti, b"v1")
    storage = _write_state(folder, fresh_swtpm.tcti)
    assert storage.reseal({"v1": _predicted(b"v1"), "v2": _predicted(b"v2")}) is True
    assert storage.sealed_sets == ["v1", "v2"]  # v1's prediction is the booted state: no separate "booted" blob
    assert storage.reseal({"v1": _predicted(b"v1"), "v2": _predicted(b"v2")}) is False  # idempotent
    blobs = json.loads((folder / SEALED_KEY_FILE).read_text())["blobs"]
    assert [b["set"] for b in blobs] == ["v1", "v2"] and all(b["pcrs"] == [4, 9, 11, 13] for b in blobs)

    _reboot(fresh_swtpm, b"v2")  # the upgrade's reboot into the new image
    again = _storage(folder, fresh_swtpm.tcti)
    assert again.unsealed_with == "v2"
    assert FileStore(str(folder / "store.json"), cipher=again).get("kmsData") == SECRET

    assert again.reseal({"v2": _predicted(b"v2")}) is True  # v1 retired: its blob is gone
    assert again.sealed_sets == ["v2"]
    _reboot(fresh_swtpm, b"v1")  # booted back into the retired image
    with pytest.raises(StateError, match="PCRs 4, 9, 11, 13 differ"):
        _storage(folder, fresh_swtpm.tcti)


def test_an_unlisted_image_unseals_nothing_and_a_changed_agent_neither(fresh_swtpm, tmp_path):
    folder = tmp_path / "state"
    _boot_image(fresh_swtpm.tcti, b"v1")
    _write_state(folder, fresh_swtpm.tcti).reseal({"v1": _predicted(b"v1"), "v2": _predicted(b"v2")})
    _reboot(fresh_swtpm, b"v3")
    with pytest.raises(StateError) as err:
        _storage(folder, fresh_swtpm.tcti)
    assert "v1: " in str(err.value) and "v2: " in str(err.value)
    _reboot(fresh_swtpm, b"v2")
    with tpm.open_tpm(fresh_swtpm.tcti) as dev:  # the predicted PCR 13 is the agent's: another agent fails
        dev.pcr_extend(13, hashlib.sha256(b"modified agent").digest())
    with pytest.raises(StateError, match="differ from when it was sealed"):
        _storage(folder, fresh_swtpm.tcti)


def test_the_booted_blob_is_kept_while_no_set_predicts_the_booted_values(fresh_swtpm, tmp_path):
    folder = tmp_path / "state"
    _boot_image(fresh_swtpm.tcti, b"v0")
    storage = _write_state(folder, fresh_swtpm.tcti)
    storage.reseal({"v1": _predicted(b"v1")})
    assert storage.sealed_sets == ["v1", "booted"]
    assert _storage(folder, fresh_swtpm.tcti).unsealed_with == "booted"  # a restart without a reboot
    values = {i: bytes([i]) * 32 for i in (4, 9, 11, 13)}
    assert sealing.pcr_digest(values, [13, 4, 11, 9]) == hashlib.sha256(b"".join(values[i] for i in (4, 9, 11, 13))).digest()
    with pytest.raises(sealing.SealError, match="missing or malformed: 9"):
        sealing.pcr_digest({4: values[4]}, [4, 9])


def test_a_format_1_key_file_still_opens(fresh_swtpm, tmp_path):
    folder = tmp_path / "state"
    folder.mkdir()
    _boot_image(fresh_swtpm.tcti, b"v1")
    with tpm.open_tpm(fresh_swtpm.tcti) as dev:
        (folder / SEALED_KEY_FILE).write_bytes(sealing.seal(dev, b"\x07" * 32, [4, 9, 11, 13]))
    storage = _storage(folder, fresh_swtpm.tcti)
    assert storage.unsealed_with == "booted"
    assert storage.reseal({"v1": _predicted(b"v1")}) is True
    assert json.loads((folder / SEALED_KEY_FILE).read_text())["version"] == 2
