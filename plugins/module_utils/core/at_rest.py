# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A peer's secrets at rest (docs/agent.md, "Secrets at rest"): encrypted with a storage key that is sealed to
the node's own TPM under a PCR policy (attestation/sealing.py).

``SealedStorage.open`` unseals the storage key kept in ``<state_dir>/sealed_storage_key.json``, or - on the first
start, before anything secret exists - makes a random 32-byte key and seals it to the current values of the
chosen PCRs: the enforced boot PCRs of the agent's measurements policy, never a PCR that the host's root can
bring to its genuine value in the same boot (attestation/deployment.py ``replayable_pcrs``: on an ordinary host
the agent's own PCR 13, which the agent extends from userspace; in the node image PCR 13, which stays zero; in
both the resettable 16 and 23). PCR 15 is not in
the seal either: it holds the cluster ID, a value that is not secret and that a rebooted peer re-extends only
after it recovered. What the seal proves is therefore what the boot chain measured; on an ordinary host, root of
a genuine boot is trusted, in the node image it is not (docs/security.md, "At rest" and "Deployment modes").

Every secret the agent keeps is written through ``encrypt``/``write_file`` (AES-256-GCM, a fresh 96-bit nonce per
write, the file's purpose as associated data, so a ciphertext cannot be swapped for another): the store file
(KMS URI, init secret, the WireGuard private key), the state disk key, the measurements version floor. A copy of
the state folder is useless on another TPM and after a tampered boot: the TPM does not unseal the key, and
``open`` says which of these it is.

A rolling image upgrade (docs/site.md "Upgrade the image") seals the SAME key ahead of the reboot: ``reseal``
keeps one blob per accepted measurements set, sealed to that set's predicted values, and drops the blobs of
retired sets. The agent calls it only with a signed document it received over the API (SetMeasurements,
GetMeasurements), never with the policy file it found on disk at start. The key file then holds several blobs
(format 2: ``{"version": 2, "blobs": [{"set", "pcrs", "digest", "blob"}]}``; a format-1 file is one blob) and
``open`` unseals with the one the TPM accepts. While the booted values match no accepted set's prediction, a blob
named ``booted`` sealed to the current values is kept too, so that the agent restarts without a reboot.

A blob that also covers a replayable PCR (written by an agent that sealed to PCR 13) still unseals; ``open`` then
seals the key again to the current values of that blob's other PCRs (which the TPM just proved to be the sealed
ones) and drops every other such blob: what they predicted cannot be read back from them.

A variant that quotes no PCRs (``sev-snp``: the CPU's report proves the launch, no TPM quote) checks no PCR, so
none is sealed to either: its key is sealed to an empty PCR selection, which binds it to the TPM alone (a copy of
the state folder is still useless elsewhere, but any boot of this TPM unseals it; docs/attestation.md, "Variant
`sev-snp` (ours)").

``PlainStorage`` (no encryption) exists only for the test suite's ``dummy`` variant, which has no TPM.
"""

from __future__ import annotations

import os
from typing import AbstractSet, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import deployment
from ansible_collections.constellation.cluster.plugins.module_utils.constants import PCR_INDEX_AGENT, PCR_INDEX_CLUSTER_ID
from ansible_collections.constellation.cluster.plugins.module_utils.core.records.sealed_key_file import (
    BOOTED, boot_pcrs, read_entries, read_pcrs, without_replayable, write_entries)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import StateError
from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_write

SEALED_KEY_FILE = "sealed_storage_key.json"
MAGIC = b"CSEALED1"  # sealed-file format, version 1: MAGIC || nonce (12) || AES-256-GCM ciphertext+tag
_NONCE = 12


def sealed_pcrs(policy, deployment_mode: str = deployment.DEFAULT) -> List[int]:
    """The PCRs the storage key is sealed to: the enforced ones of ``policy`` (a Measurements) but 15 and but those
    root can replay under ``deployment_mode`` (attestation/deployment.py ``replayable_pcrs``), in both modes PCR 13,
    16 and 23. On an ordinary host (``host``) the agent extends PCR 13 from userspace with public digests, which
    root can extend just the same. In the node image (``image``) the agent does not extend PCR 13: its genuine
    value there is 32 zero bytes, what it holds when nothing extends it, so a seal to it would hold for any code
    that simply leaves it alone; what the image runs is proven by the boot chain instead (PCR 4: the UKI; 9: its
    command line with the dm-verity root hash, and initrd; 11: the UKI's sections and boot phases), which the
    image's set enforces and the key is sealed to. 16 and 23: root resets them within the boot."""
    replayable = deployment.replayable_pcrs(deployment_mode)
    pcrs = {index for index, m in policy.pcrs.items() if not m.warn_only and index != PCR_INDEX_CLUSTER_ID}
    return sorted(pcrs - replayable)


def sealed_pcr_sets(policy, deployment_mode: str = deployment.DEFAULT) -> Dict[str, List[int]]:
    """``sealed_pcrs`` of each accepted set of ``policy`` (a Measurements is the one set "default")."""
    return {name: sealed_pcrs(measurements, deployment_mode) for name, measurements in policy.sets.items()}


def seal_predictions(policy, deployment_mode: str = deployment.DEFAULT) -> Dict[str, Tuple[List[int], Dict[int, bytes]]]:
    """What ``SealedStorage.reseal`` takes: per accepted set, its sealed PCRs and their values as the set expects
    them (PCR 13, where it is sealed to, is left to reseal, which reads the agent's current value)."""
    predictions = {}
    for name, measurements in policy.sets.items():
        pcrs = sealed_pcrs(measurements, deployment_mode)
        predictions[name] = (pcrs, {i: measurements.pcrs[i].expected for i in pcrs if i != PCR_INDEX_AGENT})
    return predictions


class SealedStorage:
    """Encrypts and decrypts the agent's secrets at rest with a key only this TPM, in this measured state, unseals."""

    sealed = True

    def __init__(self, key: bytes, pcrs: Sequence[int] = (), path: Optional[str] = None,
                 tpm_factory: Optional[Callable] = None, entries: Optional[List[Dict]] = None, unsealed_with: str = BOOTED):
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._aead = AESGCM(key)
        self._key = bytes(key)  # kept for reseal; never logged, never written but sealed
        self.pcrs = list(pcrs)
        self._path = path
        self._tpm_factory = tpm_factory
        self._entries: List[Dict] = list(entries or [])
        self.unsealed_with = unsealed_with  # the name of the blob this start unsealed

    def __repr__(self) -> str:
        return "SealedStorage(pcrs=%s, sets=%s)" % (self.pcrs, ",".join(self.sealed_sets))

    @property
    def sealed_sets(self) -> List[str]:
        """The names of the blobs in the key file (accepted sets, and ``booted`` when kept)."""
        return [entry["set"] for entry in self._entries]

    @classmethod
    def open(cls, state_dir: str, tpm_factory: Callable, pcrs: Sequence[int], log: Optional[Callable] = None,
             replayable: AbstractSet[int] = deployment.replayable_pcrs(), tpm_only: bool = False) -> "SealedStorage":
        """``tpm_factory()``: a context manager giving attestation/tpm.py's TPM; ``pcrs``: what a new key is sealed
        to (``replayable`` ones left out). ``tpm_only``: the variant quotes no PCRs (sev-snp), a key sealed to no
        PCR is accepted: it binds the secrets to this TPM, not to what booted. Raises StateError naming the reason
        when an existing sealed key cannot be unsealed (the agent must not start then)."""
        from ansible_collections.constellation.cluster.plugins.module_utils.attestation import sealing

        path = os.path.join(state_dir, SEALED_KEY_FILE)
        try:
            with open(path, "rb") as handle:
                data: Optional[bytes] = handle.read()
        except FileNotFoundError:
            data = None
        with tpm_factory() as tpm:
            if data is None:
                key = os.urandom(32)
                pcrs = sorted(set(pcrs) - set(replayable)) if tpm_only else boot_pcrs(pcrs, replayable)
                entries = [{"set": BOOTED, "pcrs": pcrs, "digest": None, "blob": sealing.seal(tpm, key, pcrs).decode("ascii")}]
                write_entries(path, entries)
                if log:
                    log("storage_key_sealed", pcrs=",".join(str(i) for i in pcrs))
                return cls(key, pcrs, path, tpm_factory, entries)
            entries = read_entries(data)
            errors = []
            for entry in entries:
                blob = entry["blob"].encode("ascii")
                try:
                    key = sealing.unseal(tpm, blob)
                except sealing.SealError as err:
                    errors.append(str(err) if len(entries) == 1 else "%s: %s" % (entry["set"], err))
                    continue
                blob_pcrs = sealing.blob_pcrs(blob)
                if set(blob_pcrs) & set(replayable):
                    entries, blob_pcrs = without_replayable(tpm, key, entry, entries, blob_pcrs, replayable, path, log)
                return cls(key, blob_pcrs, path, tpm_factory, entries, entry["set"])
            raise StateError("the secrets in %s cannot be read here: %s. A state folder copied from another "
                             "host or a tampered boot cannot unseal them; on the host they belong to, boot the "
                             "measured image, or reset the state folder to start this host fresh"
                             % (state_dir, "; ".join(errors) or "no sealed blob"))

    def reseal(self, predictions: Mapping[str, Tuple[Sequence[int], Mapping[int, bytes]]]) -> bool:
        """Seals this storage key to each accepted set's predicted values (``{set name: (pcrs, {pcr: value})}``;
        PCR 13, where sealed to, is read now), drops the blobs of sets no longer accepted, and keeps a ``booted``
        blob while the current values match no prediction. Unchanged blobs are kept as they are. Returns whether
        the key file changed. Raises StateError when the TPM refuses. The caller passes only the sets of a signed
        document received over the API (never the policy file found on disk)."""
        from ansible_collections.constellation.cluster.plugins.module_utils.attestation import sealing

        if self._path is None or self._tpm_factory is None:
            raise StateError("this storage key was not opened from a key file: it cannot be sealed again")
        old = {entry["set"]: entry for entry in self._entries}
        entries: List[Dict] = []
        try:
            with self._tpm_factory() as tpm:
                wanted = sorted({i for pcrs, _values in predictions.values() for i in pcrs}
                                | set(old.get(BOOTED, {}).get("pcrs") or []) | set(self.pcrs))
                current = read_pcrs(tpm, wanted)
                booted_matches = False
                for name, (pcrs, values) in predictions.items():
                    pcrs = sorted(set(pcrs))
                    predicted = dict(values)
                    if PCR_INDEX_AGENT in pcrs:
                        predicted[PCR_INDEX_AGENT] = current[PCR_INDEX_AGENT]
                    digest = sealing.pcr_digest(predicted, pcrs).hex()
                    booted_matches = booted_matches or all(predicted[i] == current[i] for i in pcrs)
                    entry = old.get(name)
                    if entry is None or entry.get("digest") != digest or entry.get("pcrs") != pcrs:
                        entry = {"set": name, "pcrs": pcrs, "digest": digest,
                                 "blob": sealing.seal(tpm, self._key, pcrs, predicted).decode("ascii")}
                    entries.append(entry)
                if not booted_matches:
                    pcrs = sorted(set(self.pcrs))
                    digest = sealing.pcr_digest(current, pcrs).hex()
                    entry = old.get(BOOTED)
                    if entry is None or entry.get("digest") != digest or entry.get("pcrs") != pcrs:
                        entry = {"set": BOOTED, "pcrs": pcrs, "digest": digest,
                                 "blob": sealing.seal(tpm, self._key, pcrs, current).decode("ascii")}
                    entries.append(entry)
        except sealing.SealError as err:
            raise StateError("the storage key could not be sealed to the accepted measurement sets: %s" % err) from None
        if entries == self._entries:
            return False
        write_entries(self._path, entries)
        self._entries = entries
        return True

    def encrypt(self, data: bytes, purpose: str) -> bytes:
        nonce = os.urandom(_NONCE)
        return MAGIC + nonce + self._aead.encrypt(nonce, bytes(data), purpose.encode("utf-8"))

    def decrypt(self, blob: bytes, purpose: str) -> bytes:
        from cryptography.exceptions import InvalidTag

        if not blob.startswith(MAGIC) or len(blob) < len(MAGIC) + _NONCE + 16:
            raise StateError("%s is not sealed (written in plain form by an agent before secrets were sealed, or "
                             "not by this agent): reset this host's state folder" % purpose)
        nonce = blob[len(MAGIC):len(MAGIC) + _NONCE]
        try:
            return self._aead.decrypt(nonce, blob[len(MAGIC) + _NONCE:], purpose.encode("utf-8"))
        except InvalidTag:
            raise StateError("%s does not decrypt with this host's sealed storage key (altered, or from another "
                             "host)" % purpose) from None

    def write_file(self, path: str, data: bytes) -> None:
        atomic_write(path, self.encrypt(data, os.path.basename(path)), 0o600)

    def read_file(self, path: str) -> Optional[bytes]:
        try:
            with open(path, "rb") as handle:
                blob = handle.read()
        except FileNotFoundError:
            return None
        return self.decrypt(blob, os.path.basename(path))


class PlainStorage(SealedStorage):
    """No encryption: the test suite's ``dummy`` variant only (no TPM); the agent refuses it otherwise."""

    sealed = False

    def __init__(self):  # pylint: disable=super-init-not-called
        self.pcrs = []
        self._entries = []
        self.unsealed_with = BOOTED

    def reseal(self, predictions) -> bool:
        return False

    def encrypt(self, data: bytes, purpose: str) -> bytes:
        return bytes(data)

    def decrypt(self, blob: bytes, purpose: str) -> bytes:
        return bytes(blob)
