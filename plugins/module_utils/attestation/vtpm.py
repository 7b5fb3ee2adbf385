# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""vTPM attestation, variant ``qemu-vtpm`` (docs/attestation.md, "The document and the nonce binding"): issuer and strict validator.

The document is Constellation's ``vtpm.AttestationDocument`` marshalled as Go's encoding/json
does, so a Constellation verifier accepts ours and ours accepts theirs. The validator runs
the steps of docs/attestation.md "What the validator checks, in order"; every refusal raises AttestationError naming what was wrong.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import threading
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import eventlog, tpm_wire
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import Measurements, MeasurementSets
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.tpm import (
    BANK_IDS,
    BANK_NAMES,
    PCR_COUNT,
    TPM,
    bitmap_indices,
    make_selection,
    quiet_import,
    require_tpm2_pytss,
)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.variant import (
    QEMU_VTPM,
    Validation,
)
from ansible_collections.constellation.cluster.plugins.module_utils.encoding import load_json
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError, InputError, MissingDependency

try:
    with quiet_import():  # attestation/tpm.py: the library's import warnings stay quiet
        from tpm2_pytss import (
            ESYS_TR,
            TPM2_ALG,
            TPM2B_PUBLIC,
            TPMA_OBJECT,
            TPMT_PUBLIC,
            TSS2_Exception,
        )
    HAS_TPM2_PYTSS = True
except ImportError:
    HAS_TPM2_PYTSS = False

try:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, padding
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature
    HAS_CRYPTOGRAPHY = True
except ImportError:
    HAS_CRYPTOGRAPHY = False

AK_PERSISTENT_HANDLE = 0x81008F01  # go-tpm-tools DefaultAKRSAHandle
AK_ECC_PERSISTENT_HANDLE = 0x81008F02  # go-tpm-tools DefaultAKECCHandle
# The AK algorithms an issuer offers. RSA (go-tpm-tools AKTemplateRSA) is what Constellation's own QEMU
# issuer creates (tpmclient.AttestationKeyRSA); ECC P-256 (AKTemplateECC) quotes ~3x faster and every
# validator that follows go-tpm-tools (Constellation's included) accepts it (docs/attestation.md).
AK_ALGS = ("rsa", "ecc")
DEFAULT_AK_ALG = "rsa"
_AK_TEMPLATES = {"rsa": "rsa2048:rsassa-sha256:null", "ecc": "ecc256:ecdsa-sha256:null"}
_AK_HANDLES = {"rsa": AK_PERSISTENT_HANDLE, "ecc": AK_ECC_PERSISTENT_HANDLE}
DEFAULT_EVENT_LOG_PATH = "/sys/kernel/security/tpm0/binary_bios_measurements"
SHA256_ALG = BANK_IDS["sha256"]
ALL_PCRS = tuple(range(PCR_COUNT))
_MAX_DOCUMENT = 1 << 20  # an event log of a real boot is tens of KiB; refuse absurd input early
_AK_CACHE_SIZE = 256
_PCR_KEY = re.compile(r"\A(?:0|[1-9][0-9]?)\Z")  # "0".."99" in ASCII ("²" is a digit to str.isdigit)


def make_extra_data(user_data: bytes, nonce: bytes) -> bytes:
    """SHA-256(userData || nonce) (attestation.MakeExtraData)."""
    return hashlib.sha256(user_data + nonce).digest()


def make_tpm_nonce(instance_info: Optional[bytes], extra_data: bytes) -> bytes:
    """SHA-256(instanceInfo || extraData) (vtpm.makeTpmNonce); QEMU has no instance info."""
    return hashlib.sha256((instance_info or b"") + extra_data).digest()


def check_ak_alg(ak_alg: Any, field: str = "ak_alg") -> str:
    if ak_alg not in AK_ALGS:
        raise InputError(field, "one of %s" % ", ".join(AK_ALGS), ak_alg)
    return ak_alg


def ak_template(ak_alg: str = DEFAULT_AK_ALG) -> "TPMT_PUBLIC":
    """go-tpm-tools AKTemplateRSA (RSA-2048, RSASSA-SHA256) or AKTemplateECC (NIST P-256, ECDSA-SHA256):
    a restricted signing key (restricted signing keys take no symmetric algorithm: ``:null``), empty unique."""
    attrs = (TPMA_OBJECT.SIGN_ENCRYPT | TPMA_OBJECT.RESTRICTED | TPMA_OBJECT.FIXEDTPM
             | TPMA_OBJECT.FIXEDPARENT | TPMA_OBJECT.SENSITIVEDATAORIGIN | TPMA_OBJECT.USERWITHAUTH)
    return TPMT_PUBLIC.parse(_AK_TEMPLATES[check_ak_alg(ak_alg)], objectAttributes=attrs)


def _b64(data: Optional[bytes]) -> Optional[str]:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(value, what: str) -> bytes:
    if not isinstance(value, str):
        raise AttestationError("attestation document: %s must be base64 text, got %s" % (what, type(value).__name__))
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise AttestationError("attestation document: %s is not valid base64" % what)


def _marshal_public(public: "TPMT_PUBLIC") -> bytes:
    return public.marshal()


# --------------------------------------------------------------------------------------- issuer


class VTPMIssuer:
    """Issues ``qemu-vtpm`` documents. Keeps one ESAPI context and the AK handle open across
    issues (aTLS quotes once per handshake), serialised by a lock."""

    oid = QEMU_VTPM.oid

    def __init__(self, tcti: Optional[str] = None, event_log_path: Optional[str] = DEFAULT_EVENT_LOG_PATH,
                 banks: Optional[Sequence[str]] = None, ak_handle: Optional[int] = None,
                 ak_alg: str = DEFAULT_AK_ALG):
        require_tpm2_pytss()
        self.ak_alg = check_ak_alg(ak_alg)
        if ak_handle is None:
            ak_handle = _AK_HANDLES[self.ak_alg]
        self.tcti = tcti
        self.event_log_path = event_log_path
        self._banks = [BANK_IDS[b] if isinstance(b, str) else int(b) for b in banks] if banks else None
        self._ak_persistent = ak_handle
        self._lock = threading.Lock()
        self._tpm: Optional[TPM] = None
        self._ak: Optional["ESYS_TR"] = None
        self._ak_pub: Optional[bytes] = None
        self._pcr_cache: Dict[Tuple[int, Tuple[int, ...]], Dict[int, bytes]] = {}

    # -- lifecycle

    def close(self) -> None:
        with self._lock:
            tpm, self._tpm, self._ak = self._tpm, None, None
            if tpm is not None:
                tpm.close()

    def __enter__(self) -> "VTPMIssuer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _open(self) -> Tuple[TPM, "ESYS_TR"]:
        if self._tpm is None:
            tpm = TPM(self.tcti)
            try:
                self._ak, self._ak_pub = self._load_ak(tpm)
                if self._banks is None:
                    self._banks = tpm.allocated_banks()
            except BaseException:
                tpm.close()
                raise
            self._tpm = tpm
        return self._tpm, self._ak

    def _load_ak(self, tpm: TPM) -> Tuple["ESYS_TR", bytes]:
        """The AK cached at the persistent handle: created and persisted once, reused after.

        A key found at the handle is reused only if it was made from our template; anything else
        there is evicted and replaced (as go-tpm-tools' NewCachedKey does)."""
        esapi = tpm.esapi
        template = ak_template(self.ak_alg)
        try:
            handle = esapi.tr_from_tpmpublic(self._ak_persistent)
        except TSS2_Exception:
            handle = None
        if handle is not None:
            public, _name, _qname = esapi.read_public(handle)
            if _matches_template(public.publicArea, template):
                return handle, _marshal_public(public.publicArea)
            esapi.evict_control(ESYS_TR.OWNER, handle, self._ak_persistent)
        transient, public, _cd, _ch, _ct = esapi.create_primary(None, TPM2B_PUBLIC(publicArea=template), ESYS_TR.OWNER)
        try:
            handle = esapi.evict_control(ESYS_TR.OWNER, transient, self._ak_persistent)
        finally:
            esapi.flush_context(transient)
        return handle, _marshal_public(public.publicArea)

    @property
    def ak_pub(self) -> bytes:
        """The AK public area (TPMT_PUBLIC encoding), as the document carries it."""
        with self._lock:
            self._open()
            return self._ak_pub

    # -- issuing

    def quote(self, tpm_nonce: bytes, bank: int = SHA256_ALG, indices: Sequence[int] = ALL_PCRS) -> Dict:
        """One TPM2_Quote over ``indices`` of ``bank`` plus the PCR values it covers.

        PCRs are read before and the quote's digest is checked against them; a PCR extended in
        between makes us read and quote again (bounded)."""
        with self._lock:
            try:
                return self._quote_locked(tpm_nonce, bank, indices)
            except TSS2_Exception as err:
                # the TPM may have restarted (swtpm): drop the context, reconnect on the next call
                tpm, self._tpm, self._ak = self._tpm, None, None
                self._pcr_cache.clear()
                if tpm is not None:
                    tpm.close()
                raise AttestationError("TPM quote failed (%s): %s" % (self.tcti, err))

    def _quote_locked(self, tpm_nonce: bytes, bank: int, indices: Sequence[int]) -> Dict:
        tpm, ak = self._open()
        # The quote is the authority: reported values are only used if they hash to the signed
        # PCR digest. So the values of the last quote are offered first and read again only
        # when the digest says a PCR was extended since (saves three TPM round trips).
        key = (int(bank), tuple(indices))
        values = self._pcr_cache.get(key)
        for _attempt in range(5):
            if values is None:
                values = tpm.pcr_read(bank, indices)
            quoted, signature = tpm.esapi.quote(ak, make_selection({bank: indices}), tpm_nonce)
            attest_raw = bytes(quoted.attestationData)
            raw_sig = signature.marshal()
            hash_name = _HASHLIB_NAMES[tpm_wire.parse_signature(raw_sig).hash_alg]
            pcr_digest = hashlib.new(hash_name, b"".join(values[i] for i in sorted(values))).digest()
            if pcr_digest == tpm_wire.parse_quote_attest(attest_raw).pcr_digest:
                break
            values = None
        else:
            raise AttestationError("PCRs kept changing while quoting (5 attempts)")
        self._pcr_cache[key] = values
        return {
            "quote": _b64(attest_raw),
            "raw_sig": _b64(raw_sig),
            "pcrs": {"hash": int(bank), "pcrs": {str(i): _b64(values[i]) for i in sorted(values)}},
        }

    def _event_log(self) -> Optional[bytes]:
        if not self.event_log_path:
            return None
        try:
            with open(self.event_log_path, "rb") as handle:
                return handle.read() or None
        except FileNotFoundError:
            return None
        except OSError as err:
            raise AttestationError("cannot read event log %s: %s" % (self.event_log_path, err))

    def attest(self, tpm_nonce: bytes) -> Dict:
        """go-tpm-tools ``AK.Attest``: one quote per allocated bank over all 24 PCRs, event log."""
        with self._lock:
            self._open()
            banks = list(self._banks)
        quotes = [self.quote(tpm_nonce, bank, ALL_PCRS) for bank in banks]
        attestation = {"ak_pub": _b64(self._ak_pub), "quotes": quotes}
        log = self._event_log()
        if log:
            attestation["event_log"] = _b64(log)
        attestation["TeeAttestation"] = None
        return attestation

    def issue(self, user_data: bytes, nonce: bytes) -> bytes:
        if not isinstance(user_data, (bytes, bytearray)) or not isinstance(nonce, (bytes, bytearray)):
            raise InputError("user_data/nonce", "bytes", type(user_data).__name__)
        extra_data = make_extra_data(bytes(user_data), bytes(nonce))
        instance_info = None  # QEMU: getInstanceInfo returns nil
        tpm_nonce = make_tpm_nonce(instance_info, extra_data)
        return encode_document(self.attest(tpm_nonce), instance_info, bytes(user_data))


def encode_document(attestation: Dict, instance_info: Optional[bytes], user_data: bytes) -> bytes:
    """Go encoding/json of vtpm.AttestationDocument: struct order, compact, maps sorted by key."""
    quotes = []
    for q in attestation["quotes"]:
        pcrs = dict(sorted(q["pcrs"]["pcrs"].items()))  # Go sorts map keys as strings
        quotes.append({"quote": q["quote"], "raw_sig": q["raw_sig"],
                       "pcrs": {"hash": q["pcrs"]["hash"], "pcrs": pcrs}})
    ordered = {"ak_pub": attestation["ak_pub"], "quotes": quotes}
    for key in ("event_log", "instance_info", "canonical_event_log", "ak_cert", "intermediate_certs"):
        if attestation.get(key):
            ordered[key] = attestation[key]
    ordered["TeeAttestation"] = attestation.get("TeeAttestation")
    document = {"Attestation": ordered, "InstanceInfo": _b64(instance_info), "UserData": _b64(user_data)}
    return json.dumps(document, separators=(",", ":")).encode("ascii")


# ------------------------------------------------------------------------------------ validator

_HASHLIB_NAMES = {0x0004: "sha1", 0x000B: "sha256", 0x000C: "sha384", 0x000D: "sha512"}
_STRONG_HASHES = (0x000B, 0x000C, 0x000D)  # pinned: SHA-1 is never accepted
_SIGNATURE_ALGS = (tpm_wire.TPM_ALG_RSASSA, tpm_wire.TPM_ALG_RSAPSS, tpm_wire.TPM_ALG_ECDSA)
_STRONG_CURVES = (0x0003, 0x0004, 0x0005)  # TPM2_ECC_NIST_P256, P384, P521


def _crypto_hash(alg: int):
    return {0x000B: hashes.SHA256, 0x000C: hashes.SHA384, 0x000D: hashes.SHA512}[alg]()


@dataclass(frozen=True)
class AKInfo:
    """A parsed and checked AK public area, cached by its encoding."""
    public_key: object
    name: bytes  # TPM object name: nameAlg id || H(TPMT_PUBLIC)
    key_type: int


def _matches_template(public: "TPMT_PUBLIC", template: "TPMT_PUBLIC") -> bool:
    if not (public.type == template.type and public.nameAlg == template.nameAlg
            and int(public.objectAttributes) == int(template.objectAttributes)):
        return False
    if int(template.type) == TPM2_ALG.ECC:
        return (public.parameters.eccDetail.scheme.scheme == template.parameters.eccDetail.scheme.scheme
                and public.parameters.eccDetail.curveID == template.parameters.eccDetail.curveID)
    return (public.parameters.rsaDetail.scheme.scheme == template.parameters.rsaDetail.scheme.scheme
            and public.parameters.rsaDetail.keyBits == template.parameters.rsaDetail.keyBits)


_REQUIRED_AK_ATTRIBUTES = (("restricted", "RESTRICTED"), ("sign", "SIGN_ENCRYPT"),
                           ("fixedTPM", "FIXEDTPM"), ("fixedParent", "FIXEDPARENT"))


def parse_ak(ak_pub: bytes) -> AKInfo:
    """Decodes a TPMT_PUBLIC and insists on a restricted signing key with pinned algorithms.

    A restricted key only signs digests the TPM itself produced (quotes, certifications), so a
    TPMS_ATTEST-shaped blob signed with any other key could state arbitrary PCR values."""
    try:
        public, size = TPMT_PUBLIC.unmarshal(ak_pub)
    except (TSS2_Exception, ValueError, TypeError) as err:
        raise AttestationError("AK public area (ak_pub) is not a TPMT_PUBLIC: %s" % err)
    if size != len(ak_pub):
        raise AttestationError("AK public area (ak_pub) has %d trailing bytes" % (len(ak_pub) - size))
    attrs = int(public.objectAttributes)
    missing = [label for label, flag in _REQUIRED_AK_ATTRIBUTES if not attrs & int(getattr(TPMA_OBJECT, flag))]
    if missing:
        raise AttestationError("AK is not a restricted signing key bound to its TPM: missing attribute(s) %s"
                               % ", ".join(missing))
    if attrs & int(TPMA_OBJECT.DECRYPT):
        raise AttestationError("AK must not be a decryption key")
    if int(public.nameAlg) not in _STRONG_HASHES:
        raise AttestationError("AK name algorithm %s is not allowed (SHA-256 or stronger)" % public.nameAlg)
    key_type = int(public.type)
    if key_type == TPM2_ALG.RSA:
        scheme = public.parameters.rsaDetail.scheme
        if int(scheme.scheme) not in (TPM2_ALG.RSASSA, TPM2_ALG.RSAPSS):
            raise AttestationError("AK RSA scheme %s is not allowed (RSASSA or RSAPSS)" % scheme.scheme)
        if int(scheme.details.anySig.hashAlg) not in _STRONG_HASHES:
            raise AttestationError("AK signature hash %s is not allowed (SHA-1 is refused)"
                                   % scheme.details.anySig.hashAlg)
        if public.parameters.rsaDetail.keyBits < 2048:
            raise AttestationError("AK RSA key has %d bits, at least 2048 required" % public.parameters.rsaDetail.keyBits)
    elif key_type == TPM2_ALG.ECC:
        scheme = public.parameters.eccDetail.scheme
        if int(scheme.scheme) != TPM2_ALG.ECDSA:
            raise AttestationError("AK ECC scheme %s is not allowed (ECDSA)" % scheme.scheme)
        if int(public.parameters.eccDetail.curveID) not in _STRONG_CURVES:
            raise AttestationError("AK ECC curve %s is not allowed (NIST P-256, P-384 or P-521)"
                                   % public.parameters.eccDetail.curveID)
        if int(scheme.details.anySig.hashAlg) not in _STRONG_HASHES:
            raise AttestationError("AK signature hash %s is not allowed (SHA-1 is refused)"
                                   % scheme.details.anySig.hashAlg)
    else:
        raise AttestationError("AK type %s is not allowed (RSA or ECC)" % public.type)
    try:
        key = serialization.load_der_public_key(public.to_der())
    except (ValueError, TypeError, TSS2_Exception) as err:
        raise AttestationError("AK public key cannot be decoded: %s" % err)
    return AKInfo(key, bytes(public.get_name()), key_type)


def verify_signature(ak: AKInfo, data: bytes, raw_sig: bytes) -> int:
    """Checks a TPMT_SIGNATURE over data with the AK (cryptography does the maths); returns its hash
    algorithm."""
    if len(raw_sig) >= 2 and int.from_bytes(raw_sig[:2], "big") not in _SIGNATURE_ALGS:
        raise AttestationError("quote signature algorithm 0x%04x is not allowed" % int.from_bytes(raw_sig[:2], "big"))
    try:
        sig = tpm_wire.parse_signature(raw_sig)
    except tpm_wire.Malformed as err:
        raise AttestationError("quote signature (raw_sig) is not a TPMT_SIGNATURE: %s" % err)
    alg, halg = sig.sig_alg, sig.hash_alg
    if halg not in _STRONG_HASHES:
        raise AttestationError("quote signature hash 0x%04x is not allowed (SHA-1 is refused)" % halg)
    try:
        if alg in (TPM2_ALG.RSASSA, TPM2_ALG.RSAPSS):
            if ak.key_type != TPM2_ALG.RSA:
                raise AttestationError("quote signature is RSA but the AK is not an RSA key")
            pad = padding.PKCS1v15() if alg == TPM2_ALG.RSASSA else \
                padding.PSS(mgf=padding.MGF1(_crypto_hash(halg)), salt_length=padding.PSS.AUTO)
            ak.public_key.verify(sig.sig, data, pad, _crypto_hash(halg))
        else:  # ECDSA (_SIGNATURE_ALGS)
            if ak.key_type != TPM2_ALG.ECC:
                raise AttestationError("quote signature is ECDSA but the AK is not an ECC key")
            der = encode_dss_signature(int.from_bytes(sig.ecdsa_r, "big"), int.from_bytes(sig.ecdsa_s, "big"))
            ak.public_key.verify(der, data, ec.ECDSA(_crypto_hash(halg)))
    except InvalidSignature:
        raise AttestationError("quote signature does not verify with the AK")
    except AttestationError:
        raise
    except Exception as err:  # cryptography raises ValueError/TypeError on malformed keys or sizes
        raise AttestationError("quote signature cannot be checked: %s" % err)
    return halg


class VTPMValidator:
    """Validates ``qemu-vtpm`` documents (docs/attestation.md, "What the validator checks, in order"), strictly and in order.

    ``pcr_selection``: the PCRs of the SHA-256 bank the quote must cover, exactly (default all 24,
    as the issuer quotes). ``check_event_log``: replay a present event log against the quote.
    """

    oid = QEMU_VTPM.oid
    # Pure computation on the document (at most _MAX_DOCUMENT bytes) and data in memory: aTLS runs it in
    # the handshake's thread, no deadline thread (variant.Validator). Subclasses keep it only while
    # their trust_ak does no I/O either (qemu-vtpm-ek's certified AKs and CA chains are in memory).
    validate_inline = True

    def __init__(self, measurements: Measurements, pcr_selection: Sequence[int] = ALL_PCRS,
                 check_event_log: bool = True):
        require_tpm2_pytss()
        if not HAS_CRYPTOGRAPHY:
            raise MissingDependency("cryptography", "TPM attestation")
        if not isinstance(measurements, (Measurements, MeasurementSets)):
            raise InputError("measurements", "a Measurements policy", type(measurements).__name__)
        # Swapped as a whole when the accepted sets change (the agent's hot reload): one attribute write.
        self.measurements = measurements
        self.pcr_selection = tuple(sorted(set(pcr_selection)))
        if not self.pcr_selection or any(not 0 <= i < PCR_COUNT for i in self.pcr_selection):
            raise InputError("pcr_selection", "PCR indices in 0..23", pcr_selection)
        self.check_event_log = check_event_log
        self._ak_cache: Dict[bytes, AKInfo] = {}
        self._cache_lock = threading.Lock()

    # Variant hook (docs/attestation.md, "What the validator checks, in order" step 3): qemu-vtpm trusts the AK unconditionally.
    def trust_ak(self, ak_pub: bytes, ak: AKInfo) -> None:
        return None

    # Variant hooks of the variants whose document carries instance info (the cloud SEV-SNP variants,
    # snp_vtpm.py): ``trust_instance`` trusts the AK through the instance info and returns what it proved (None
    # here: the AK is trusted by ``trust_ak``); ``match_measurements`` checks the PCRs (and that evidence) against
    # the policy; ``complete`` adds the evidence to the result.
    def trust_instance(self, instance_info: Optional[bytes], ak_pub: bytes, ak: AKInfo) -> Any:
        self.trust_ak(ak_pub, ak)
        return None

    def match_measurements(self, pcrs: Dict[int, bytes], evidence: Any) -> Tuple[str, list, list]:
        return self.measurements.match(pcrs)

    def complete(self, validation: Validation, evidence: Any) -> Validation:
        return validation

    def _ak(self, ak_pub: bytes) -> AKInfo:
        info = self._ak_cache.get(ak_pub)
        if info is None:
            info = parse_ak(ak_pub)
            with self._cache_lock:
                if len(self._ak_cache) >= _AK_CACHE_SIZE:
                    self._ak_cache.clear()
                self._ak_cache[ak_pub] = info
        return info

    def validate(self, document: bytes, nonce: bytes) -> Validation:
        # 1. the document (docs/attestation.md, "The document and the nonce binding")
        attestation, instance_info, user_data = decode_document(document)
        # 2. nonce binding (docs/attestation.md, "The document and the nonce binding")
        tpm_nonce = make_tpm_nonce(instance_info, make_extra_data(user_data, nonce))
        # 3. the AK: restricted signing key with pinned algorithms, then the variant's trust
        ak_pub = _unb64(attestation.get("ak_pub"), "Attestation.ak_pub")
        ak = self._ak(ak_pub)
        evidence = self.trust_instance(instance_info, ak_pub, ak)
        # 4. the SHA-256 quote; no other bank is trusted (SHA-1 never)
        quote = _sha256_quote(attestation.get("quotes"))
        pcrs = self._verify_quote(ak, quote, tpm_nonce)
        # 5. event log replay against the verified PCRs
        raw_log = attestation.get("event_log")
        if self.check_event_log and raw_log:
            eventlog.replay_and_check(_unb64(raw_log, "Attestation.event_log"), pcrs)
        # 6. measurements policy
        measurement_set, checks, warnings = self.match_measurements(pcrs, evidence)
        return self.complete(Validation(user_data=user_data, pcrs=pcrs, checks=checks, warnings=warnings,
                                        measurement_set=measurement_set, ak_pub=ak_pub), evidence)

    def _verify_quote(self, ak: AKInfo, quote: Dict, tpm_nonce: bytes) -> Dict[int, bytes]:
        attest_raw = _unb64(quote.get("quote"), "quote")
        raw_sig = _unb64(quote.get("raw_sig"), "raw_sig")
        # signature first: nothing in TPMS_ATTEST is believed before it verifies
        sig_hash = verify_signature(ak, attest_raw, raw_sig)
        try:
            magic, attest_type = tpm_wire.parse_attest_header(attest_raw)
            # Another type's body is not decoded: the type check below refuses it, naming the type.
            attest = tpm_wire.parse_quote_attest(attest_raw) if attest_type == tpm_wire.TPM_ST_ATTEST_QUOTE else None
        except tpm_wire.Malformed as err:
            raise AttestationError("quote is not a TPMS_ATTEST: %s" % err)
        if magic != tpm_wire.TPM_GENERATED_VALUE:
            raise AttestationError("quote magic is 0x%08x, expected TPM_GENERATED 0xff544347" % magic)
        if attest is None:
            raise AttestationError("quote type is 0x%04x, expected ATTEST_QUOTE" % attest_type)
        if attest.extra_data != tpm_nonce:
            raise AttestationError("quote extraData %s does not match the nonce binding %s "
                                   "(replayed document, wrong nonce or swapped user data)"
                                   % (attest.extra_data.hex(), tpm_nonce.hex()))
        signed = [(hash_alg, tuple(bitmap_indices(bitmap))) for hash_alg, bitmap in attest.pcr_select]
        wanted = [(SHA256_ALG, self.pcr_selection)]
        if signed != wanted:
            raise AttestationError("signed PCR selection is %s, expected %s"
                                   % (_format_selection(signed), _format_selection(wanted)))
        reported = _decode_pcrs(quote.get("pcrs"))
        if set(reported) != set(self.pcr_selection):
            raise AttestationError("reported PCRs %s differ from the signed selection %s"
                                   % (_format_indices(sorted(reported)), _format_indices(self.pcr_selection)))
        digest = hashlib.new(_HASHLIB_NAMES[sig_hash], b"".join(reported[i] for i in self.pcr_selection)).digest()
        if digest != attest.pcr_digest:
            raise AttestationError("PCR values do not match the quoted PCR digest (values were altered)")
        return reported


def decode_document(document: bytes) -> Tuple[Dict, Optional[bytes], bytes]:
    if not isinstance(document, (bytes, bytearray)):
        raise AttestationError("attestation document must be bytes")
    if len(document) > _MAX_DOCUMENT:
        raise AttestationError("attestation document is larger than %d bytes" % _MAX_DOCUMENT)
    try:
        doc = load_json(bytes(document), "attestation document", _MAX_DOCUMENT)
    except InputError as err:
        raise AttestationError("attestation document is not JSON within bounds: %s" % err) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("Attestation"), dict):
        raise AttestationError("attestation document has no Attestation object")
    info = doc.get("InstanceInfo")
    instance_info = None if info is None else _unb64(info, "InstanceInfo")
    user = doc.get("UserData")
    user_data = b"" if user is None else _unb64(user, "UserData")
    return doc["Attestation"], instance_info, user_data


def _sha256_quote(quotes) -> Dict:
    if not isinstance(quotes, list) or not quotes:
        raise AttestationError("attestation document has no quotes")
    found = []
    for quote in quotes:
        if not isinstance(quote, dict) or not isinstance(quote.get("pcrs"), dict):
            raise AttestationError("attestation document: malformed quote entry")
        bank = quote["pcrs"].get("hash")
        found.append(bank)
        if isinstance(bank, int) and not isinstance(bank, bool) and bank == SHA256_ALG:
            return quote
    names = ", ".join(BANK_NAMES.get(h, str(h)) if isinstance(h, int) else type(h).__name__ for h in found)
    raise AttestationError("no SHA-256 quote in the document (found: %s; SHA-1 is not accepted)" % names)


def _decode_pcrs(pcrs) -> Dict[int, bytes]:
    if not isinstance(pcrs, dict) or not isinstance(pcrs.get("pcrs"), dict):
        raise AttestationError("quote has no PCR values")
    values: Dict[int, bytes] = {}
    for key, value in pcrs["pcrs"].items():
        if not isinstance(key, str) or not _PCR_KEY.match(key) or int(key) >= PCR_COUNT:
            raise AttestationError("quote PCR index %r is not in 0..23" % (key[:8] if isinstance(key, str) else key,))
        raw = _unb64(value, "PCR %s" % key)
        if len(raw) != 32:
            raise AttestationError("PCR %s value has %d bytes, expected 32 (SHA-256)" % (key, len(raw)))
        values[int(key)] = raw
    return values


def _format_indices(indices) -> str:
    indices = list(indices)
    if indices == list(range(indices[0], indices[-1] + 1)) if indices else False:
        return "%d-%d" % (indices[0], indices[-1]) if len(indices) > 1 else str(indices[0])
    return ",".join(str(i) for i in indices) or "none"


def _format_selection(selection) -> str:
    return " + ".join("%s:%s" % (BANK_NAMES.get(alg, hex(alg)), _format_indices(idx)) for alg, idx in selection) \
        or "empty"


# -------------------------------------------------------------------------- the chooser's factories (choose.py)


def make_issuer(tcti: Optional[str] = None, **kwargs) -> VTPMIssuer:
    """The ``qemu-vtpm`` issuer on a TCTI (``None``: the default TPM device)."""
    return VTPMIssuer(tcti, **kwargs)


def make_validator(policy: Measurements, trust) -> VTPMValidator:
    """The ``qemu-vtpm`` validator: it trusts the AK as Constellation does, so ``trust`` adds nothing."""
    return VTPMValidator(policy)
