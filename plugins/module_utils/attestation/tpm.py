# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Thin access to a TPM through tpm2-pytss ESAPI: PCRs, events, NV, from a TCTI string.

TCTI strings as tpm2-tools spell them: ``device:/dev/tpmrm0`` (default) or
``swtpm:host=127.0.0.1,port=2321``.
"""

from __future__ import annotations

import threading
import warnings
from contextlib import contextmanager
from typing import Dict, Iterable, Iterator, List, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.constants import (  # noqa: F401 pylint: disable=unused-import
    PCR_COUNT,
    PCR_INDEX_CLUSTER_ID,
)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError, InputError, MissingDependency


@contextmanager
def quiet_import() -> Iterator[None]:
    """Around an import of tpm2-pytss: a library's warnings at its import (a CryptographyDeprecationWarning, as
    tpm2-pytss gave on a newer cryptography) concern its maintainers, not whoever reads Ansible's output or the
    agent's log. The import alone is quiet; what the code does afterwards is not filtered here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


try:
    with quiet_import():
        from tpm2_pytss import ESAPI, ESYS_TR, TPM2_ALG, TPM2_CAP, TPM2_RC, TPMT_HA, TPML_DIGEST_VALUES
        from tpm2_pytss import TPML_PCR_SELECTION, TPMS_PCR_SELECTION, TSS2_Exception
        from tpm2_pytss.utils import NoSuchIndex
    HAS_TPM2_PYTSS = True
    TPM2_PYTSS_IMPORT_ERROR = None
except ImportError as _err:  # ansible-test's import sanity runs without third-party packages
    HAS_TPM2_PYTSS = False
    TPM2_PYTSS_IMPORT_ERROR = _err

DEFAULT_TCTI = "device:/dev/tpmrm0"
_PCR_READ_BATCH = 8  # TPM2_PCR_Read returns at most 8 digests per call

# TPM_ALG_ID of the hash banks (docs/attestation.md, "The document and the nonce binding": 4=SHA1, 11=SHA256, 12=SHA384, 13=SHA512).
BANK_IDS = {"sha1": 0x0004, "sha256": 0x000B, "sha384": 0x000C, "sha512": 0x000D}
BANK_NAMES = {v: k for k, v in BANK_IDS.items()}
DIGEST_SIZES = {0x0004: 20, 0x000B: 32, 0x000C: 48, 0x000D: 64}


def require_tpm2_pytss() -> None:
    if not HAS_TPM2_PYTSS:
        raise MissingDependency("tpm2-pytss (3.0.0 or later)", "TPM attestation", TPM2_PYTSS_IMPORT_ERROR)


def bank_id(bank) -> int:
    if isinstance(bank, int):
        if bank not in BANK_NAMES:
            raise InputError("bank", "one of %s" % ", ".join(BANK_IDS), bank)
        return bank
    try:
        return BANK_IDS[str(bank).lower()]
    except KeyError:
        raise InputError("bank", "one of %s" % ", ".join(BANK_IDS), bank)


def selection_bitmap(indices: Iterable[int]) -> bytes:
    bitmap = bytearray(3)
    for index in indices:
        if not 0 <= index < PCR_COUNT:
            raise InputError("pcr", "PCR index in 0..23", index)
        bitmap[index // 8] |= 1 << (index % 8)
    return bytes(bitmap)


def bitmap_indices(bitmap: bytes) -> List[int]:
    return [i for i in range(len(bitmap) * 8) if bitmap[i // 8] & (1 << (i % 8))]


def make_selection(selections: Dict[int, Iterable[int]]) -> "TPML_PCR_SELECTION":
    """{bank alg id: PCR indices} -> TPML_PCR_SELECTION."""
    items = []
    for alg, indices in selections.items():
        bitmap = selection_bitmap(indices)
        items.append(TPMS_PCR_SELECTION(hash=alg, sizeofSelect=3, pcrSelect=bitmap))
    return TPML_PCR_SELECTION(items)


class TPM:
    """One ESAPI context on one TCTI. Not shared between threads without ``lock``."""

    def __init__(self, tcti: Optional[str] = None):
        require_tpm2_pytss()
        self.tcti = tcti or DEFAULT_TCTI
        self.lock = threading.RLock()
        try:
            self.esapi = ESAPI(self.tcti)
        except Exception as err:  # TSS2_Exception, or OSError/ValueError from the TCTI loader
            raise AttestationError("cannot open TPM via TCTI %r: %s" % (self.tcti, err))

    def close(self) -> None:
        esapi, self.esapi = self.esapi, None
        if esapi is not None:
            esapi.close()

    def __enter__(self) -> "TPM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def allocated_banks(self) -> List[int]:
        """Alg ids of the PCR banks that have at least one PCR allocated."""
        with self.lock:
            _more, caps = self.esapi.get_capability(TPM2_CAP.PCRS, 0, 1)
        banks = []
        for sel in caps.data.assignedPCR:
            if any(bytes(sel.pcrSelect)[: sel.sizeofSelect]):
                banks.append(int(sel.hash))
        return banks

    def pcr_read(self, bank="sha256", indices: Iterable[int] = range(PCR_COUNT)) -> Dict[int, bytes]:
        """Reads PCRs of one bank, in batches (the TPM answers <= 8 digests per call)."""
        alg = bank_id(bank)
        wanted = sorted(set(indices))
        values: Dict[int, bytes] = {}
        for _attempt in range(PCR_COUNT + 1):  # bounded: each round reads at least one PCR
            if not wanted:
                break
            batch = wanted[:_PCR_READ_BATCH]
            with self.lock:
                _counter, sel_out, digests = self.esapi.pcr_read(make_selection({alg: batch}))
            got: List[int] = []
            for sel in sel_out:
                got.extend(bitmap_indices(bytes(sel.pcrSelect)[: sel.sizeofSelect]))
            if not got:
                raise AttestationError("TPM returned no value for PCRs %s of bank %s"
                                       % (batch, BANK_NAMES.get(alg, alg)))
            for index, digest in zip(got, digests):
                values[index] = bytes(digest)
            wanted = [i for i in wanted if i not in values]
        return values

    def pcr_event(self, index: int, data: bytes) -> None:
        """TPM2_PCR_Event: every bank is extended with its own hash of data (<= 1024 bytes)."""
        _check_pcr(index)
        if len(data) > 1024:
            raise InputError("data", "at most 1024 bytes for TPM2_PCR_Event", "%d bytes" % len(data))
        with self.lock:
            self.esapi.pcr_event(ESYS_TR.parse("pcr%d" % index), data)

    def pcr_extend(self, index: int, digest: bytes) -> None:
        """TPM2_PCR_Extend of the SHA-256 bank with a ready-made 32-byte digest."""
        _check_pcr(index)
        if len(digest) != 32:
            raise InputError("digest", "32 bytes (SHA-256)", "%d bytes" % len(digest))
        ha = TPMT_HA(hashAlg=TPM2_ALG.SHA256)
        ha.digest.sha256 = digest
        values = TPML_DIGEST_VALUES([ha])
        with self.lock:
            self.esapi.pcr_extend(ESYS_TR.parse("pcr%d" % index), values)

    def nv_read_raw(self, nv_index: int) -> bytes:
        """``nv_read`` for tpm2-pytss' create_ek_template, which wants NoSuchIndex when missing."""
        try:
            return self.nv_read(nv_index)
        except _MissingIndex:
            raise NoSuchIndex(nv_index)

    def nv_read(self, nv_index: int, chunk: int = 1024, owner_auth: bool = False) -> bytes:
        """Whole NV index, read in chunks (TPMs limit one read to ~1 KiB). Missing -> AttestationError.
        ``owner_auth``: read with the owner hierarchy's authorization (Azure's HCL report), else the index's own."""
        with self.lock:
            try:
                handle = self.esapi.tr_from_tpmpublic(nv_index)
            except TSS2_Exception as err:
                if _is_missing(err):
                    raise _MissingIndex("TPM NV index 0x%08x is not defined" % nv_index)
                raise AttestationError("TPM NV index 0x%08x: %s" % (nv_index, err))
            try:
                public, _name = self.esapi.nv_read_public(handle)
                size = public.nvPublic.dataSize
                data = b""
                while len(data) < size:
                    part = self.esapi.nv_read(handle, min(chunk, size - len(data)), len(data),
                                              auth_handle=ESYS_TR.OWNER if owner_auth else handle)
                    data += bytes(part)
                return data
            finally:
                self.esapi.tr_close(handle)


class _MissingIndex(AttestationError):
    pass


def _is_missing(err) -> bool:
    code = err.error if hasattr(err, "error") else None
    return code in (TPM2_RC.HANDLE, TPM2_RC.VALUE) or "handle" in str(err).lower()


def _check_pcr(index: int) -> None:
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < PCR_COUNT:
        raise InputError("pcr", "PCR index in 0..23", index)


@contextmanager
def open_tpm(tcti: Optional[str] = None) -> Iterator[TPM]:
    tpm = TPM(tcti)
    try:
        yield tpm
    finally:
        tpm.close()


def read_pcrs(tcti: Optional[str] = None, bank="sha256") -> Dict[int, bytes]:
    with open_tpm(tcti) as tpm:
        return tpm.pcr_read(bank)


def pcr_event(tcti: Optional[str], index: int, data: bytes) -> None:
    with open_tpm(tcti) as tpm:
        tpm.pcr_event(index, data)


def extend_pcr(tcti: Optional[str], index: int, digest: bytes) -> None:
    """The lab's measured boot: TPM2_PCR_Extend(index, SHA-256 digest)."""
    with open_tpm(tcti) as tpm:
        tpm.pcr_extend(index, digest)


def mark_initialized(tcti: Optional[str], cluster_id: bytes) -> None:
    """The node lock's point of no return: TPM2_PCR_Event(PCR 15, cluster_id) (docs/attestation.md, "PCR 15 and the cluster ID")."""
    if len(cluster_id) != 32:
        raise InputError("cluster_id", "32 bytes", "%d bytes" % len(cluster_id))
    pcr_event(tcti, PCR_INDEX_CLUSTER_ID, cluster_id)


def is_initialized(tcti: Optional[str]) -> bool:
    """PCR 15 (SHA-256 bank) differs from all zeros."""
    with open_tpm(tcti) as tpm:
        return tpm.pcr_read("sha256", [PCR_INDEX_CLUSTER_ID])[PCR_INDEX_CLUSTER_ID] != bytes(32)
