# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A peer's secrets at rest (docs/agent.md, "Secrets at rest"): encrypted with a storage key that is sealed to
the node's own TPM under a PCR policy (attestation/sealing.py).

``SealedStorage.open`` unseals the storage key kept in ``<state_dir>/sealed_storage_key.json``, or - on the first
start, before anything secret exists - makes a random 32-byte key and seals it to the current values of the
chosen PCRs: the enforced boot PCRs of the agent's measurements policy and the agent's own PCR 13, read after the
agent measured itself. PCR 15 is not in the seal: it holds the cluster ID, a value that is not secret and that a
rebooted peer re-extends only after it recovered, so it would add an ordering constraint and no protection.

Every secret the agent keeps is written through ``encrypt``/``write_file`` (AES-256-GCM, a fresh 96-bit nonce per
write, the file's purpose as associated data, so a ciphertext cannot be swapped for another): the store file
(KMS URI, init secret, the WireGuard private key), the state disk key. A copy of the state folder is useless on
another TPM, after a tampered boot, and under a changed agent or trust configuration: the TPM does not unseal the
key, and ``open`` says which of these it is.

``PlainStorage`` (no encryption) exists only for the test suite's ``dummy`` variant, which has no TPM.
"""

from __future__ import annotations

import os
from typing import Callable, List, Optional, Sequence

from ansible_collections.constellation.cluster.plugins.module_utils.constants import PCR_INDEX_AGENT, PCR_INDEX_CLUSTER_ID
from ansible_collections.constellation.cluster.plugins.module_utils.errors import StateError
from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_write

SEALED_KEY_FILE = "sealed_storage_key.json"
MAGIC = b"CSEALED1"  # sealed-file format, version 1: MAGIC || nonce (12) || AES-256-GCM ciphertext+tag
_NONCE = 12


def sealed_pcrs(policy) -> List[int]:
    """The PCRs the storage key is sealed to: the enforced ones of ``policy`` (a Measurements) but 15, and 13."""
    return sorted({index for index, m in policy.pcrs.items() if not m.warn_only and index != PCR_INDEX_CLUSTER_ID}
                  | {PCR_INDEX_AGENT})


class SealedStorage:
    """Encrypts and decrypts the agent's secrets at rest with a key only this TPM, in this measured state, unseals."""

    sealed = True

    def __init__(self, key: bytes, pcrs: Sequence[int] = ()):
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._aead = AESGCM(key)
        self.pcrs = list(pcrs)

    @classmethod
    def open(cls, state_dir: str, tpm_factory: Callable, pcrs: Sequence[int],
             log: Optional[Callable] = None) -> "SealedStorage":
        """``tpm_factory()``: a context manager giving attestation/tpm.py's TPM. Raises StateError naming the
        reason when an existing sealed key cannot be unsealed (the agent must not start then)."""
        from ansible_collections.constellation.cluster.plugins.module_utils.attestation import sealing

        path = os.path.join(state_dir, SEALED_KEY_FILE)
        try:
            with open(path, "rb") as handle:
                blob: Optional[bytes] = handle.read()
        except FileNotFoundError:
            blob = None
        with tpm_factory() as tpm:
            if blob is None:
                key = os.urandom(32)
                atomic_write(path, sealing.seal(tpm, key, pcrs), 0o600)
                if log:
                    log("storage_key_sealed", pcrs=",".join(str(i) for i in sorted(set(pcrs))))
                return cls(key, sorted(set(pcrs)))
            try:
                key = sealing.unseal(tpm, blob)
            except sealing.SealError as err:
                raise StateError("the secrets in %s cannot be read here: %s. A state folder copied from another "
                                 "host, a tampered boot or a changed agent cannot unseal them; on the host they "
                                 "belong to, boot the measured image with the installed agent, or reset the state "
                                 "folder to start this host fresh" % (state_dir, err)) from None
            return cls(key, sealing.blob_pcrs(blob))

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

    def encrypt(self, data: bytes, purpose: str) -> bytes:
        return bytes(data)

    def decrypt(self, blob: bytes, purpose: str) -> bytes:
        return bytes(blob)
