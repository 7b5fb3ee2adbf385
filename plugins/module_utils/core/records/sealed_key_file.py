# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The sealed storage key's file (core/at_rest.py ``SealedStorage``): its blobs, read and written atomically, the
PCRs a key may be sealed to, and the one-time move of a key sealed to a replayable PCR onto the boot PCRs alone.

Format 2: ``{"version": 2, "blobs": [{"set", "pcrs", "digest", "blob"}]}``, one blob per accepted measurements set
and ``booted``; a format-1 file is one blob, named ``booted``."""

from __future__ import annotations

import json
from typing import AbstractSet, Callable, Dict, List, Optional, Sequence, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.errors import StateError
from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_write

KEY_FILE_VERSION = 2
BOOTED = "booted"  # the blob sealed to the values of the boot the key was made or last unsealed in


def boot_pcrs(pcrs: Sequence[int], replayable: AbstractSet[int]) -> List[int]:
    """``pcrs`` but the replayable ones; StateError when none is left (a key sealed to no PCR is no seal)."""
    kept = sorted(set(pcrs) - set(replayable))
    if not kept:
        raise StateError("the storage key must be sealed to at least one PCR the boot chain measures, got %s (PCRs "
                         "%s are replayable by the host's root): enforce a boot PCR in the measurements policy"
                         % (",".join(str(i) for i in sorted(set(pcrs))) or "none",
                            ", ".join(str(i) for i in sorted(replayable))))
    return kept


def read_pcrs(tpm, indices: Sequence[int]) -> Dict[int, bytes]:
    values: Dict[int, bytes] = {}
    indices = sorted(set(indices))
    for start in range(0, len(indices), 8):  # pcr_read returns at most 8 PCRs per call
        values.update(tpm.pcr_read("sha256", indices[start:start + 8]))
    return values


def without_replayable(tpm, key: bytes, unsealed: Dict, entries: List[Dict], blob_pcrs: Sequence[int],
                       replayable: AbstractSet[int], path: str, log: Optional[Callable]) -> Tuple[List[Dict], List[int]]:
    """A key unsealed with a blob that covers a replayable PCR: sealed again to the current values of the blob's
    other PCRs (the TPM just proved they hold the sealed values), under the same name; every other blob that covers
    a replayable PCR is dropped (its predicted values cannot be read back from it). Returns the entries and PCRs."""
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation import sealing

    pcrs = boot_pcrs(blob_pcrs, replayable)
    current = read_pcrs(tpm, pcrs)
    fresh = {"set": unsealed["set"], "pcrs": pcrs, "digest": sealing.pcr_digest(current, pcrs).hex(),
             "blob": sealing.seal(tpm, key, pcrs, current).decode("ascii")}
    kept, dropped = [], []
    for entry in entries:
        if entry is unsealed:
            kept.append(fresh)
        elif set(entry.get("pcrs") or sealing.blob_pcrs(entry["blob"].encode("ascii"))) & set(replayable):
            dropped.append(entry["set"])
        else:
            kept.append(entry)
    write_entries(path, kept)
    if log:
        log("storage_key_resealed_without_replayable_pcrs", level="warning", pcrs=",".join(str(i) for i in pcrs),
            set=unsealed["set"], dropped=",".join(dropped),
            message="the storage key was sealed to PCRs the host's root can replay; it is now sealed to the boot "
                    "chain's PCRs only" + ("; blobs of sets %s were dropped (set the measurements again to seal "
                                           "ahead to them)" % ", ".join(dropped) if dropped else ""))
    return kept, pcrs


def write_entries(path: str, entries: List[Dict]) -> None:
    atomic_write(path, json.dumps({"version": KEY_FILE_VERSION, "blobs": entries}).encode("ascii"), 0o600)


def read_entries(data: bytes) -> List[Dict]:
    """The blobs of a key file: format 2 (several), or format 1 (the file is one blob, named ``booted``)."""
    try:
        doc = json.loads(data.decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        doc = None
    if isinstance(doc, dict) and doc.get("version") == KEY_FILE_VERSION and isinstance(doc.get("blobs"), list):
        entries = doc["blobs"]
        if entries and all(isinstance(e, dict) and isinstance(e.get("set"), str) and isinstance(e.get("blob"), str)
                           for e in entries):
            return entries
        raise StateError("the sealed key file holds no valid blob (corrupt): reset this host's state folder")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise StateError("the sealed key file is not one this agent wrote (corrupt): reset this host's state folder") \
            from None
    return [{"set": BOOTED, "pcrs": None, "digest": None, "blob": text}]
