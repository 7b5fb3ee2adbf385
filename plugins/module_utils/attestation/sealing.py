# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Data sealed to this TPM under a PCR policy (tpm2-pytss): the key that encrypts a peer's secrets at rest
(core/at_rest.py).

``seal`` creates a sealed data object (KEYEDHASH, no sign/decrypt) under the TPM's storage root key - an ECC
P-256 primary of the owner hierarchy made from the TCG template, the same key on every call, on no other TPM -
whose only authorisation is TPM2_PolicyPCR over the SHA-256 bank's current values of the chosen PCRs
(``userWithAuth`` clear: no password opens it). ``unseal`` loads it again and satisfies the policy in a policy
session: the TPM releases the data only while those PCRs hold the values they held when it was sealed. The blob
(public and private area, and the PCR list) is no secret: its sensitive part is encrypted to the storage root
key, which never leaves this TPM.

``seal(..., values=...)`` seals to PREDICTED values instead of the current ones (a rolling image upgrade: the key
sealed ahead of the reboot to the next image's boot PCRs): the trial session's TPM2_PolicyPCR then takes an
explicit pcrDigest, SHA-256 over the selected values in selection order (``pcr_digest``), as TPM 2.0 Part 3,
23.7 defines it; the TPM computes the same digest from its real PCRs when ``unseal`` satisfies the policy.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import List, Mapping, Optional, Sequence

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.tpm import make_selection, quiet_import
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError

try:
    with quiet_import():  # attestation/tpm.py: the library's import warnings stay quiet
        from tpm2_pytss import (
            ESYS_TR,
            TPM2_ALG,
            TPM2_RC,
            TPM2_SE,
            TPM2B_DIGEST,
            TPM2B_PRIVATE,
            TPM2B_PUBLIC,
            TPM2B_SENSITIVE_CREATE,
            TPM2B_SENSITIVE_DATA,
            TPMA_OBJECT,
            TPMS_SENSITIVE_CREATE,
            TPMT_SYM_DEF,
            TSS2_Exception,
        )
except ImportError:  # ansible-test's import sanity runs without third-party packages; callers check tpm.require_tpm2_pytss
    pass

BLOB_VERSION = 1
MAX_SEALED_DATA = 128  # TPM2B_SENSITIVE_DATA holds at most MAX_SYM_DATA (128) bytes


class SealError(AttestationError):
    """The TPM refused to seal or unseal; the message says why in the operator's terms."""


def _srk_template():
    attrs = (TPMA_OBJECT.FIXEDTPM | TPMA_OBJECT.FIXEDPARENT | TPMA_OBJECT.SENSITIVEDATAORIGIN
             | TPMA_OBJECT.USERWITHAUTH | TPMA_OBJECT.RESTRICTED | TPMA_OBJECT.DECRYPT | TPMA_OBJECT.NODA)
    return TPM2B_PUBLIC.parse("ecc256:aes128cfb", objectAttributes=attrs)


def _policy_session(esapi, trial: bool):
    return esapi.start_auth_session(ESYS_TR.NONE, ESYS_TR.NONE, TPM2_SE.TRIAL if trial else TPM2_SE.POLICY,
                                    TPMT_SYM_DEF(algorithm=TPM2_ALG.NULL), TPM2_ALG.SHA256)


def _primary(esapi):
    handle, _public, _cd, _ch, _ct = esapi.create_primary(None, _srk_template(), ESYS_TR.OWNER)
    return handle


def pcr_digest(values: Mapping[int, bytes], pcrs: Sequence[int]) -> bytes:
    """TPM2_PolicyPCR's pcrDigest: SHA-256 over the SHA-256 bank's values of ``pcrs``, ascending (selection order)."""
    missing = [i for i in sorted(set(pcrs)) if len(values.get(i, b"")) != 32]
    if missing:
        raise SealError("predicted values must give 32 bytes for each sealed PCR; missing or malformed: %s"
                        % ", ".join(str(i) for i in missing))
    return hashlib.sha256(b"".join(values[i] for i in sorted(set(pcrs)))).digest()


def seal(tpm, data: bytes, pcrs: Sequence[int], values: Optional[Mapping[int, bytes]] = None) -> bytes:
    """``data`` (at most 128 bytes) sealed to the current values of ``pcrs`` (SHA-256 bank) of ``tpm``
    (attestation/tpm.py's TPM), or to the predicted ``values`` of those PCRs. Returns the blob to keep (JSON,
    no secret in it)."""
    if not 0 < len(data) <= MAX_SEALED_DATA:
        raise SealError("sealed data must be 1 to %d bytes, got %d" % (MAX_SEALED_DATA, len(data)))
    pcrs = sorted(set(pcrs))
    expected = TPM2B_DIGEST(pcr_digest(values, pcrs)) if values is not None else TPM2B_DIGEST()
    esapi = tpm.esapi
    with tpm.lock:
        try:
            session = _policy_session(esapi, trial=True)
            try:
                esapi.policy_pcr(session, expected, make_selection({TPM2_ALG.SHA256: pcrs}))
                policy = esapi.policy_get_digest(session)
            finally:
                esapi.flush_context(session)
            public = TPM2B_PUBLIC.parse("keyedhash", objectAttributes=TPMA_OBJECT.FIXEDTPM | TPMA_OBJECT.FIXEDPARENT
                                        | TPMA_OBJECT.NODA)
            public.publicArea.authPolicy = policy
            sensitive = TPM2B_SENSITIVE_CREATE(TPMS_SENSITIVE_CREATE(data=TPM2B_SENSITIVE_DATA(bytes(data))))
            primary = _primary(esapi)
            try:
                private, public_out, _cd, _ch, _ct = esapi.create(primary, sensitive, public)
            finally:
                esapi.flush_context(primary)
        except TSS2_Exception as err:
            raise SealError("the TPM could not seal the key: %s" % err) from None
    return json.dumps({"version": BLOB_VERSION, "pcrs": pcrs, "hash": "sha256",
                       "public": base64.b64encode(public_out.marshal()).decode("ascii"),
                       "private": base64.b64encode(private.marshal()).decode("ascii")}).encode("ascii")


def blob_pcrs(blob: bytes) -> List[int]:
    return _parse(blob)[0]


def _parse(blob: bytes):
    try:
        doc = json.loads(blob.decode("ascii"))
        if doc.get("version") != BLOB_VERSION or doc.get("hash") != "sha256":
            raise ValueError("version")
        pcrs = [int(i) for i in doc["pcrs"]]
        public, _offset = TPM2B_PUBLIC.unmarshal(base64.b64decode(doc["public"], validate=True))
        private, _offset = TPM2B_PRIVATE.unmarshal(base64.b64decode(doc["private"], validate=True))
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError, TSS2_Exception):
        raise SealError("the sealed key blob is not one this agent wrote (corrupt or from another version)") from None
    return pcrs, public, private


def unseal(tpm, blob: bytes) -> bytes:
    """The data sealed in ``blob``, if this is the TPM it was sealed on and its PCRs hold the sealed values."""
    pcrs, public, private = _parse(blob)
    esapi = tpm.esapi
    with tpm.lock:
        primary = _primary(esapi)
        try:
            try:
                handle = esapi.load(primary, private, public)
            except TSS2_Exception as err:
                raise SealError("this TPM cannot load the sealed key: it was sealed on another TPM (%s)" % _rc(err)) from None
            try:
                session = _policy_session(esapi, trial=False)
                try:
                    esapi.policy_pcr(session, TPM2B_DIGEST(), make_selection({TPM2_ALG.SHA256: pcrs}))
                    return bytes(esapi.unseal(handle, session1=session))
                except TSS2_Exception as err:
                    if _is_policy_failure(err):
                        raise SealError("the TPM refuses to unseal the key: PCRs %s differ from when it was sealed "
                                        "(another boot chain or another agent or agent configuration)"
                                        % ", ".join(str(i) for i in pcrs)) from None
                    raise SealError("the TPM could not unseal the key: %s" % _rc(err)) from None
                finally:
                    esapi.flush_context(session)
            finally:
                esapi.flush_context(handle)
        finally:
            esapi.flush_context(primary)


def _rc(err) -> str:
    return str(err).split(":", 1)[-1].strip() or str(err)


def _is_policy_failure(err) -> bool:
    code = getattr(err, "error", None)
    return code in (TPM2_RC.POLICY_FAIL, TPM2_RC.VALUE) or "policy" in str(err).lower()
