# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Secrets sealed to a TPM (attestation/sealing.py, core/at_rest.py) on real swtpm instances: the state folder
copied to another TPM and a tampered boot PCR each cannot unseal, and say so; no PCR the host's root can replay in
the same boot (13, which the agent extends itself, 16, 23) is in the seal, and a tampered boot cannot be fixed up
by any extension from userspace."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import sealing, tpm
from ansible_collections.constellation.cluster.plugins.module_utils.core.at_rest import SEALED_KEY_FILE, SealedStorage
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.store import FileStore
from ansible_collections.constellation.cluster.tests.unit.attestation.conftest import _start

PCRS = [4, 9, 11, 13]  # what the boot chain (4, 9, 11) and the agent (13) extend
SEALED = [4, 9, 11]  # what the storage key is sealed to: not the agent's PCR 13, which root can replay
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
    assert blob["pcrs"] == SEALED and blob["hash"] == "sha256"
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
    with pytest.raises(StateError, match="PCRs 4, 9, 11 differ from when it was sealed"):
        _storage(tmp_path, fresh_swtpm.tcti)


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


def test_the_seal_covers_the_enforced_boot_pcrs_not_15_nor_warn_only_nor_what_root_can_replay():
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import Measurements
    from ansible_collections.constellation.cluster.plugins.module_utils.core.at_rest import sealed_pcrs

    policy = Measurements.from_dict({"4": {"expected": "11" * 32, "warnOnly": False}, "9": "22" * 32,
                                     "14": {"expected": "00" * 32, "warnOnly": True},
                                     "15": {"expected": "00" * 32, "warnOnly": False},
                                     "13": "33" * 32, "16": "44" * 32, "23": "55" * 32})
    assert sealed_pcrs(policy) == [4, 9]
    assert sealed_pcrs(policy, "host") == [4, 9]
    assert sealed_pcrs(policy, "image") == [4, 9]  # PCR 13 is zero in the image: not sealed to either
    with pytest.raises(InputError, match="^deployment_mode: expected one of host, image"):
        sealed_pcrs(policy, "vm")


# ---------------------------------------------------------------- re-sealed ahead of a reboot (image upgrade)

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
    assert [b["set"] for b in blobs] == ["v1", "v2"] and all(b["pcrs"] == SEALED for b in blobs)

    _reboot(fresh_swtpm, b"v2")  # the upgrade's reboot into the new image
    again = _storage(folder, fresh_swtpm.tcti)
    assert again.unsealed_with == "v2"
    assert FileStore(str(folder / "store.json"), cipher=again).get("kmsData") == SECRET

    assert again.reseal({"v2": _predicted(b"v2")}) is True  # v1 retired: its blob is gone
    assert again.sealed_sets == ["v2"]
    _reboot(fresh_swtpm, b"v1")  # booted back into the retired image
    with pytest.raises(StateError, match="PCRs 4, 9, 11 differ"):
        _storage(folder, fresh_swtpm.tcti)


def test_an_unlisted_image_unseals_nothing(fresh_swtpm, tmp_path):
    folder = tmp_path / "state"
    _boot_image(fresh_swtpm.tcti, b"v1")
    _write_state(folder, fresh_swtpm.tcti).reseal({"v1": _predicted(b"v1"), "v2": _predicted(b"v2")})
    _reboot(fresh_swtpm, b"v3")
    with pytest.raises(StateError) as err:
        _storage(folder, fresh_swtpm.tcti)
    assert "v1: " in str(err.value) and "v2: " in str(err.value)


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
    assert storage.unsealed_with == "booted" and storage.pcrs == SEALED  # sealed again, without PCR 13
    assert storage.reseal({"v1": _predicted(b"v1")}) is True
    assert json.loads((folder / SEALED_KEY_FILE).read_text())["version"] == 2


# ---------------------------------------------------------------- what the host's root can write in the same boot


def test_no_pcr_userspace_extends_is_sealed_and_root_cannot_fix_up_a_tampered_boot(fresh_swtpm, tmp_path):
    """The attack of a host's root after a reboot: replay the agent's PCR 13 events (public, logged), extend or
    reset 16 and 23, and extend the boot PCRs with the genuine digests. The key is sealed as the agent seals it,
    from a policy that enforces 13, 16 and 23 too: none of them is in the seal, so a replay of PCR 13 gains
    nothing that the genuine boot did not already give (the key unseals there without any agent: host root is
    trusted on such a peer, and GetState says so), and no extension from userspace turns a tampered boot into the
    genuine one."""
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.agent_measurement import enforce_agent_pcr
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import Measurements
    from ansible_collections.constellation.cluster.plugins.module_utils.core.at_rest import sealed_pcrs

    folder = tmp_path / "state"
    folder.mkdir()
    _boot_image(fresh_swtpm.tcti, b"v1")
    predicted = _predicted(b"v1")[1]
    policy = Measurements.from_dict({"16": (b"\x16" * 32).hex(), "23": (b"\x23" * 32).hex(),
                                     **{str(i): value.hex() for i, value in predicted.items()}})
    pcrs = sealed_pcrs(enforce_agent_pcr(policy, bytes(32)))
    assert pcrs == SEALED
    storage = SealedStorage.open(str(folder), lambda: tpm.open_tpm(fresh_swtpm.tcti), pcrs)
    FileStore(str(folder / "store.json"), cipher=storage).put("kmsData", SECRET)
    for blob in json.loads((folder / SEALED_KEY_FILE).read_text())["blobs"]:
        assert not set(sealing.blob_pcrs(blob["blob"].encode())) & {13, 16, 23}

    fresh_swtpm.stop(orderly=True)
    fresh_swtpm.start()  # a reboot into a tampered boot chain, then root acts from userspace
    with tpm.open_tpm(fresh_swtpm.tcti) as dev:
        for pcr in (4, 9, 11):
            dev.pcr_extend(pcr, hashlib.sha256(b"tampered/%d" % pcr).digest())
        dev.pcr_extend(13, AGENT)  # PCR 13's genuine events, replayed
        for pcr in (16, 23):
            dev.pcr_extend(pcr, b"\x01" * 32)
        for pcr in (4, 9, 11):  # the genuine digests extended after the tampered ones
            dev.pcr_extend(pcr, hashlib.sha256(b"v1/%d" % pcr).digest())
    with pytest.raises(StateError, match="PCRs 4, 9, 11 differ from when it was sealed"):
        _storage(folder, fresh_swtpm.tcti)

    fresh_swtpm.stop(orderly=True)
    fresh_swtpm.start()  # the genuine boot chain, no agent has run: the key unseals, PCR 13 plays no part
    with tpm.open_tpm(fresh_swtpm.tcti) as dev:
        for pcr in (4, 9, 11):
            dev.pcr_extend(pcr, hashlib.sha256(b"v1/%d" % pcr).digest())
        assert dev.pcr_read("sha256", [13])[13] == bytes(32)
    assert FileStore(str(folder / "store.json"), cipher=_storage(folder, fresh_swtpm.tcti)).get("kmsData") == SECRET


def test_a_key_sealed_to_pcr_13_by_an_older_agent_unseals_once_and_is_sealed_again_without_it(fresh_swtpm, tmp_path):
    """An agent upgrade: the key file holds blobs sealed to 4, 9, 11 and 13 (the booted set and one sealed ahead).
    The blob that unseals is replaced by one sealed to 4, 9 and 11 only (the TPM just proved they hold the sealed
    values); the other one is dropped, since what it predicted cannot be read back. After a reboot the key unseals
    without PCR 13."""
    folder = tmp_path / "state"
    folder.mkdir()
    _boot_image(fresh_swtpm.tcti, b"v1")
    key = b"\x07" * 32
    with tpm.open_tpm(fresh_swtpm.tcti) as dev:
        old = []
        for name in ("v1", "v2"):
            pcrs, values = _predicted(name.encode())
            values[13] = dev.pcr_read("sha256", [13])[13]
            digest = sealing.pcr_digest(values, PCRS)
            old.append({"set": name, "pcrs": PCRS, "digest": digest.hex(),
                        "blob": sealing.seal(dev, key, PCRS, values).decode("ascii")})
    (folder / SEALED_KEY_FILE).write_text(json.dumps({"version": 2, "blobs": old}))
    events = []
    storage = SealedStorage.open(str(folder), lambda: tpm.open_tpm(fresh_swtpm.tcti), SEALED,
                                 log=lambda event, **fields: events.append((event, fields)))
    assert storage.unsealed_with == "v1" and storage.pcrs == SEALED and storage.sealed_sets == ["v1"]
    assert events[0][0] == "storage_key_resealed_without_replayable_pcrs" and events[0][1]["dropped"] == "v2"
    blobs = json.loads((folder / SEALED_KEY_FILE).read_text())["blobs"]
    assert [(b["set"], b["pcrs"], sealing.blob_pcrs(b["blob"].encode())) for b in blobs] == [("v1", SEALED, SEALED)]
    fresh_swtpm.stop(orderly=True)
    fresh_swtpm.start()
    with tpm.open_tpm(fresh_swtpm.tcti) as dev:  # the genuine boot; PCR 13 is whatever root or an agent made it
        for pcr in (4, 9, 11):
            dev.pcr_extend(pcr, hashlib.sha256(b"v1/%d" % pcr).digest())
        dev.pcr_extend(13, hashlib.sha256(b"another agent").digest())
    again = _storage(folder, fresh_swtpm.tcti)
    assert again.unsealed_with == "v1"
    assert again.encrypt(b"x", "p") and again.decrypt(storage.encrypt(b"same key", "p"), "p") == b"same key"
