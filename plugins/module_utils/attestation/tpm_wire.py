# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Strict decoders of the two TPM structures a quote check reads: TPMS_ATTEST of a quote and
TPMT_SIGNATURE (TPM 2.0 Part 2, sections 10.12.12 and 11.3.4), big-endian as the TPM marshals them.

Why not tpm2_pytss: its unmarshal is quick, but every field read afterwards converts a cffi value
into a new Python object (~5-10 us each): about half of a validation's CPU was spent reading a
dozen fields (the repository's bench atls_handshake.py, docs/atls.md). These decoders return plain bytes and ints
and check what the TSS marshalling functions check (every length within its buffer's size, no byte
left over). They decide nothing: the validator compares every decoded value with the one it
expects, after the signature over the raw bytes verified.
"""

from __future__ import annotations

import struct
from typing import List, NamedTuple, Tuple

TPM_GENERATED_VALUE = 0xFF544347
TPM_ST_ATTEST_QUOTE = 0x8018
TPM_ALG_RSASSA = 0x0014
TPM_ALG_RSAPSS = 0x0016
TPM_ALG_ECDSA = 0x0018

# Buffer sizes of the TSS structures (tss2_tpm2_types.h): a larger size field is malformed.
_NAME_MAX = 2 + 64  # TPM2B_NAME: sizeof(TPMU_NAME) = sizeof(TPMT_HA)
_DATA_MAX = 2 + 64  # TPM2B_DATA: sizeof(TPMT_HA)
_DIGEST_MAX = 64  # TPM2B_DIGEST: sizeof(TPMU_HA)
_NUM_PCR_BANKS = 16  # TPML_PCR_SELECTION: TPM2_NUM_PCR_BANKS
_PCR_SELECT_MAX = 4  # TPMS_PCR_SELECTION: TPM2_PCR_SELECT_MAX
_RSA_MAX = 512  # TPM2B_PUBLIC_KEY_RSA: TPM2_MAX_RSA_KEY_BYTES
_ECC_MAX = 128  # TPM2B_ECC_PARAMETER: TPM2_MAX_ECC_KEY_BYTES

_HEADER = struct.Struct(">IH")  # magic, type
_CLOCK_FW = struct.Struct(">QIIBQ")  # clockInfo (clock, resetCount, restartCount, safe), firmwareVersion


class Malformed(ValueError):
    """The bytes are not the structure (the message says where)."""


class QuoteAttest(NamedTuple):
    magic: int
    type: int
    extra_data: bytes
    pcr_select: List[Tuple[int, bytes]]  # (hash algorithm, selection bitmap of sizeofSelect bytes)
    pcr_digest: bytes


class Signature(NamedTuple):
    sig_alg: int
    hash_alg: int
    sig: bytes  # RSASSA/RSAPSS: the signature; ECDSA: empty
    ecdsa_r: bytes
    ecdsa_s: bytes


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes):
        self.data = bytes(data)
        self.pos = 0

    def take(self, size: int, what: str) -> bytes:
        end = self.pos + size
        if end > len(self.data):
            raise Malformed("%s: %d bytes needed at offset %d, %d left" % (what, size, self.pos, len(self.data) - self.pos))
        chunk = self.data[self.pos:end]
        self.pos = end
        return chunk

    def unpack(self, fmt: struct.Struct, what: str):
        return fmt.unpack(self.take(fmt.size, what))

    def u16(self, what: str) -> int:
        return int.from_bytes(self.take(2, what), "big")

    def sized(self, limit: int, what: str) -> bytes:
        """A TPM2B: a 16-bit size, then that many bytes (at most ``limit``)."""
        size = self.u16(what + " size")
        if size > limit:
            raise Malformed("%s: size %d exceeds its buffer of %d bytes" % (what, size, limit))
        return self.take(size, what)

    def end(self, what: str) -> None:
        if self.pos != len(self.data):
            raise Malformed("%s has %d trailing bytes" % (what, len(self.data) - self.pos))


def parse_attest_header(raw: bytes) -> Tuple[int, int]:
    """(magic, type) of a TPMS_ATTEST, whatever its type."""
    return _Reader(raw).unpack(_HEADER, "TPMS_ATTEST header")


def parse_quote_attest(raw: bytes) -> QuoteAttest:
    """A TPMS_ATTEST whose type is TPM_ST_ATTEST_QUOTE (raises Malformed for any other type:
    callers check the header first with :func:`parse_attest_header` to say which)."""
    reader = _Reader(raw)
    magic, st = reader.unpack(_HEADER, "TPMS_ATTEST header")
    if st != TPM_ST_ATTEST_QUOTE:
        raise Malformed("TPMS_ATTEST type 0x%04x is not a quote" % st)
    reader.sized(_NAME_MAX, "qualifiedSigner")
    extra_data = reader.sized(_DATA_MAX, "extraData")
    reader.unpack(_CLOCK_FW, "clockInfo/firmwareVersion")
    count = int.from_bytes(reader.take(4, "pcrSelect count"), "big")
    if count > _NUM_PCR_BANKS:
        raise Malformed("pcrSelect: %d banks exceed the limit of %d" % (count, _NUM_PCR_BANKS))
    selection = []
    for _bank in range(count):
        hash_alg = reader.u16("pcrSelect hash")
        size = reader.take(1, "pcrSelect sizeofSelect")[0]
        if size > _PCR_SELECT_MAX:
            raise Malformed("pcrSelect: sizeofSelect %d exceeds %d" % (size, _PCR_SELECT_MAX))
        selection.append((hash_alg, reader.take(size, "pcrSelect bitmap")))
    digest = reader.sized(_DIGEST_MAX, "pcrDigest")
    reader.end("TPMS_ATTEST")
    return QuoteAttest(magic, st, extra_data, selection, digest)


def parse_signature(raw: bytes) -> Signature:
    """A TPMT_SIGNATURE of RSASSA, RSAPSS or ECDSA (Malformed for any other algorithm: the
    validator allows no other)."""
    reader = _Reader(raw)
    alg = reader.u16("sigAlg")
    if alg in (TPM_ALG_RSASSA, TPM_ALG_RSAPSS):
        hash_alg = reader.u16("hash")
        sig = Signature(alg, hash_alg, reader.sized(_RSA_MAX, "signature"), b"", b"")
    elif alg == TPM_ALG_ECDSA:
        hash_alg = reader.u16("hash")
        sig_r = reader.sized(_ECC_MAX, "signatureR")
        sig = Signature(alg, hash_alg, b"", sig_r, reader.sized(_ECC_MAX, "signatureS"))
    else:
        raise Malformed("signature algorithm 0x%04x is not allowed (RSASSA, RSAPSS or ECDSA)" % alg)
    reader.end("TPMT_SIGNATURE")
    return sig
