# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Variant ``qemu-vtpm-ek`` (ours): the AK is trusted only after it was
certified through the TPM's EK certificate chain plus credential activation.

``qemu-vtpm`` trusts whatever AK a document names, so any software TPM can attest. This
variant closes that gap with a one-time **enrollment** before the one-shot issue/validate:

1. node: ``issuer.enrollment_request()`` -> EK certificate (read from NV 0x01c00002) + AK public.
2. verifier: ``begin_enrollment(request, ca_certs)`` checks the EK certificate chains to the
   pinned CAs and the AK is a restricted signing key, then TPM2_MakeCredential (in software,
   with the EK public key from the certificate) binds a random secret to the AK's name.
3. node: ``issuer.activate_credential(challenge)``: only the TPM that holds both that EK and an
   object with that AK name can recover the secret (TPM2_ActivateCredential).
4. verifier: ``finish_enrollment(pending, secret)`` -> ``CertifiedAK`` record (AK public + EK
   certificate), which the verifier stores (e.g. in the inventory).

``VTPMEKValidator`` then validates documents exactly as ``qemu-vtpm`` does, but trusts an AK
only if it is one of the certified records whose EK certificate still chains to the CAs it is
given. The document format is unchanged (docs/attestation.md, "The document and the nonce binding"), so aTLS needs nothing new.

OID: ``choose.QEMU_VTPM_EK`` (docs/attestation.md, "Variant `qemu-vtpm-ek` (ours)"); the validators
also read the variant's earlier OID (``alias_oids``), the issuer writes only the current one.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.choose import QEMU_VTPM_EK
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.ek_certs import (  # noqa: F401
    _MAX_NV_CHAIN_CERTS,
    _split_der,
    load_ca_certs,
    verify_ek_cert,
)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import Measurements, per_set
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.tpm import quiet_import
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import (
    ALL_PCRS,
    AKInfo,
    VTPMIssuer,
    VTPMValidator,
    parse_ak,
)
from ansible_collections.constellation.cluster.plugins.module_utils.constants import PCR_INDEX_AGENT
from ansible_collections.constellation.cluster.plugins.module_utils.encoding import b64decode
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError, InputError

try:
    with quiet_import():  # attestation/tpm.py: the library's import warnings stay quiet
        from tpm2_pytss import ESYS_TR, TPM2_ALG, TPM2_SE, TPM2B_ENCRYPTED_SECRET, TPM2B_ID_OBJECT, TPMT_PUBLIC, TPMT_SYM_DEF
        from tpm2_pytss import TSS2_Exception
        from tpm2_pytss.utils import create_ek_template, make_credential
    HAS_TPM2_PYTSS = True
except ImportError:
    HAS_TPM2_PYTSS = False
try:  # the TCG default EK templates: tpm2-pytss 2.x names them ek_template, 1.2 (Debian 12's) _ek
    with quiet_import():
        from tpm2_pytss.internal.templates import ek_template
    _ek_templates_1_2 = None
except ImportError:
    ek_template = None
    try:
        with quiet_import():
            from tpm2_pytss.internal.templates import _ek as _ek_templates_1_2
    except ImportError:
        _ek_templates_1_2 = None

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    HAS_CRYPTOGRAPHY = True
except ImportError:
    HAS_CRYPTOGRAPHY = False

EK_CERT_NV_INDEX_RSA = 0x01C00002
EK_CERT_NV_INDEX_ECC = 0x01C0000A  # TCG EK Credential Profile: the EK-ECC256 (NIST P-256) certificate
# The EKs this variant activates credentials with (the TCG low range, whose policy is PolicySecret(endorsement)):
# (template name of tpm2-pytss, NV index of its certificate), tried in this order.
EK_SLOTS = (("EK-RSA2048", EK_CERT_NV_INDEX_RSA), ("EK-ECC256", EK_CERT_NV_INDEX_ECC))
# TCG EK Credential Profile 2.5: the EK certificate chain (intermediates, DER, one or more per index).
EK_CHAIN_NV_FIRST, EK_CHAIN_NV_LAST = 0x01C00100, 0x01C001FF


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(value, field: str) -> bytes:
    return b64decode(value, field, max_size=64 * 1024)


# ------------------------------------------------------------------------------ certificates
# The EK trust bundle and chain checks are in ek_certs.py (no TPM code); re-exported here.


def default_ek_public_area(name: str):
    """The public area of the TCG default EK template ``name`` (EK-RSA2048, EK-ECC256) as tpm2-pytss has it:
    ``ek_template.lookup(name)`` in 2.x, ``_ek.EK_RSA2048`` in 1.2 (Debian 12's python3-tpm2-pytss)."""
    if ek_template is not None:
        return ek_template.lookup(name).template.publicArea
    return getattr(_ek_templates_1_2, name.replace("-", "_")).ek_template.publicArea


def ek_public_from_cert(cert: "x509.Certificate"):
    """The EK's TPMT_PUBLIC as the TCG default template creates it (EK-RSA2048 or EK-ECC256, by the
    certificate's key), with the certificate's public key: what TPM2_MakeCredential needs (symmetric
    scheme, name algorithm, the key the seed is encrypted to)."""
    key = cert.public_key()
    if isinstance(key, rsa.RSAPublicKey) and key.key_size == 2048:
        public, _unused1 = TPMT_PUBLIC.unmarshal(default_ek_public_area("EK-RSA2048").marshal())
        public.unique.rsa = key.public_numbers().n.to_bytes(256, "big")
        return public
    if isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, ec.SECP256R1):
        public, _unused1 = TPMT_PUBLIC.unmarshal(default_ek_public_area("EK-ECC256").marshal())
        numbers = key.public_numbers()
        public.unique.ecc.x = numbers.x.to_bytes(32, "big")
        public.unique.ecc.y = numbers.y.to_bytes(32, "big")
        return public
    raise AttestationError("EK certificate key is neither RSA-2048 (EK-RSA2048) nor ECC P-256 (EK-ECC256): no "
                           "credential can be activated with it")


def ek_pub_sha256(ek_cert: bytes, field: str = "ek_cert") -> str:
    """Who a TPM is: the SHA-256 (hex) of its EK's public key, as the SubjectPublicKeyInfo DER of its EK
    certificate (PEM or DER). The admin admits a node by it (core/admissions.py); the same EK keeps it
    whatever certificate is reissued for it."""
    if not HAS_CRYPTOGRAPHY:
        raise InputError(field, "an EK certificate, which needs the Python package cryptography")
    data = bytes(ek_cert)
    try:
        cert = x509.load_pem_x509_certificate(data) if data.lstrip().startswith(b"-----BEGIN") \
            else x509.load_der_x509_certificate(data)
        spki = cert.public_key().public_bytes(serialization.Encoding.DER,
                                              serialization.PublicFormat.SubjectPublicKeyInfo)
    except (ValueError, TypeError) as err:
        raise InputError(field, "an X.509 EK certificate (PEM or DER)", str(err)[:120]) from None
    return hashlib.sha256(spki).hexdigest()


# --------------------------------------------------------------------------------- records


@dataclass(frozen=True)
class CertifiedAK:
    """An AK proven to live in a TPM whose EK certificate chains to the fleet's CA. ``ek_chain``:
    intermediates the TPM's NV offered (DER; untrusted links)."""
    ak_pub: bytes
    ek_cert: bytes
    ek_chain: Tuple[bytes, ...] = ()

    def to_dict(self) -> Dict[str, object]:
        data: Dict[str, object] = {"ak_pub": _b64(self.ak_pub), "ek_cert": _b64(self.ek_cert)}
        if self.ek_chain:
            data["ek_chain"] = [_b64(der) for der in self.ek_chain]
        return data

    @classmethod
    def from_dict(cls, data) -> "CertifiedAK":
        if not isinstance(data, dict):
            raise InputError("certified_ak", "a mapping with ak_pub and ek_cert", type(data).__name__)
        return cls(_unb64(data.get("ak_pub"), "certified_ak.ak_pub"), _unb64(data.get("ek_cert"), "certified_ak.ek_cert"),
                   _chain_from(data.get("ek_chain"), "certified_ak.ek_chain"))


def _chain_from(value, field: str) -> Tuple[bytes, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > _MAX_NV_CHAIN_CERTS:
        raise InputError(field, "a list of at most %d base64 DER certificates" % _MAX_NV_CHAIN_CERTS,
                         type(value).__name__)
    return tuple(_unb64(item, field) for item in value)


@dataclass(frozen=True)
class PendingEnrollment:
    """Verifier-side state between challenge and response. The secret never leaves the verifier
    except encrypted to the EK."""
    secret: bytes
    record: CertifiedAK


class EnrollmentRequired(AttestationError):
    """The document is sound but its AK was never certified here: enroll it (EnrollAK), then
    connect again. ``validator`` is the validator that asks, ``ak_pub`` the AK's public area."""

    def __init__(self, message: str, validator: "VTPMEKValidator", ak_pub: bytes):
        super().__init__(message)
        self.validator = validator
        self.ak_pub = ak_pub


MAX_CERTIFIED_AKS = 8192  # records one verifier keeps (the oldest certified go first)


class CertifiedAKs:
    """The AKs one verifier (a controller process, a Coordinator's agent) has certified, keyed by
    AK public area. Thread-safe; a record is added only if its EK certificate chains to the CAs. At most
    ``max_records`` (the oldest certified go first). ``on_add(record)``: called for every new
    certification (the agent writes it through to its sealed store: core/eviction/certified_ak_store.py)."""

    def __init__(self, ca_certs: Sequence = (), max_records: int = MAX_CERTIFIED_AKS):
        self.ca_certs = list(ca_certs)
        self.max_records = max_records
        self.on_add: Optional[Callable[[CertifiedAK], None]] = None
        self._lock = threading.Lock()
        self._records: "OrderedDict[bytes, CertifiedAK]" = OrderedDict()

    def add(self, record: CertifiedAK) -> None:
        self._keep(record)
        if self.on_add is not None:
            self.on_add(record)

    def restore(self, data: Mapping[str, Any]) -> CertifiedAK:
        """A stored record, checked as ``add`` checks a new one (its EK certificate must chain to the CAs
        configured now), kept without ``on_add``. InputError or AttestationError if it does not hold."""
        record = CertifiedAK.from_dict(dict(data))
        self._keep(record)
        return record

    def _keep(self, record: CertifiedAK) -> None:
        verify_ek_cert(record.ek_cert, self.ca_certs, record.ek_chain)
        with self._lock:
            self._records.pop(record.ak_pub, None)
            self._records[record.ak_pub] = record
            while len(self._records) > self.max_records:
                self._records.popitem(last=False)

    def get(self, ak_pub: bytes) -> Optional[CertifiedAK]:
        with self._lock:
            return self._records.get(ak_pub)

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)


def begin_enrollment(request: Dict[str, str], ca_certs: Sequence) -> Tuple[Dict[str, str], PendingEnrollment]:
    """Checks the EK chain and the AK, and returns (challenge for the node, pending state)."""
    certs = load_ca_certs(ca_certs)
    if not isinstance(request, dict):
        raise InputError("enrollment", "a mapping with ek_cert and ak_pub", type(request).__name__)
    ek_cert = _unb64(request.get("ek_cert"), "enrollment.ek_cert")
    ak_pub = _unb64(request.get("ak_pub"), "enrollment.ak_pub")
    ek_chain = _chain_from(request.get("ek_chain"), "enrollment.ek_chain")
    cert = verify_ek_cert(ek_cert, certs, ek_chain)
    ak = parse_ak(ak_pub)  # restricted signing key with pinned algorithms, or refuse now
    secret = os.urandom(32)
    credential_blob, encrypted_secret = make_credential(ek_public_from_cert(cert), secret, ak.name)
    challenge = {"credential_blob": _b64(credential_blob.marshal()), "secret": _b64(encrypted_secret.marshal())}
    return challenge, PendingEnrollment(secret, CertifiedAK(ak_pub, ek_cert, ek_chain))


def finish_enrollment(pending: PendingEnrollment, response: bytes) -> CertifiedAK:
    if not isinstance(response, (bytes, bytearray)) or not hmac.compare_digest(bytes(response), pending.secret):
        raise AttestationError("credential activation failed: the TPM did not recover the secret, so the AK "
                               "does not live in the TPM that owns the certified EK")
    return pending.record


def enroll(issuer: "VTPMEKIssuer", ca_certs: Sequence) -> CertifiedAK:
    """All four steps in one process (the lab; a verifier with direct access to the node)."""
    challenge, pending = begin_enrollment(issuer.enrollment_request(), ca_certs)
    return finish_enrollment(pending, issuer.activate_credential(challenge))


# ----------------------------------------------------------------------------- issuer side


class VTPMEKIssuer(VTPMIssuer):
    """The ``qemu-vtpm`` issuer plus the node's half of the enrollment."""

    oid = QEMU_VTPM_EK.oid

    def _ek_slot(self, tpm) -> Tuple[str, bytes]:
        """(template name, EK certificate DER) of the first EK of EK_SLOTS whose certificate is in NV."""
        for template, index in EK_SLOTS:
            try:
                return template, tpm.nv_read(index)
            except AttestationError:
                continue
        raise AttestationError("no EK certificate in the TPM's NV (RSA 0x%08x, ECC P-256 0x%08x)"
                               % (EK_CERT_NV_INDEX_RSA, EK_CERT_NV_INDEX_ECC))

    def ek_cert(self) -> bytes:
        with self._lock:
            tpm, _ak = self._open()
            return self._ek_slot(tpm)[1]

    def ek_chain(self) -> List[bytes]:
        """Intermediates of the EK certificate in NV (TCG EK Credential Profile 2.5, indices
        0x01c00100-0x01c001ff, DER certificates, several per index allowed), if any."""
        from tpm2_pytss import TPM2_CAP

        with self._lock:
            tpm, _ak = self._open()
            try:
                _more, data = tpm.esapi.get_capability(TPM2_CAP.HANDLES, EK_CHAIN_NV_FIRST, _MAX_NV_CHAIN_CERTS)
            except TSS2_Exception:
                return []
            chain: List[bytes] = []
            for handle in data.data.handles:
                if not EK_CHAIN_NV_FIRST <= int(handle) <= EK_CHAIN_NV_LAST:
                    continue
                chain.extend(_split_der(tpm.nv_read(int(handle))))
            return chain[:_MAX_NV_CHAIN_CERTS]

    def enrollment_request(self) -> Dict[str, object]:
        request: Dict[str, object] = {"ek_cert": _b64(self.ek_cert()), "ak_pub": _b64(self.ak_pub)}
        chain = self.ek_chain()
        if chain:
            request["ek_chain"] = [_b64(der) for der in chain]
        return request

    def activate_credential(self, challenge: Dict[str, str]) -> bytes:
        """TPM2_ActivateCredential with the EK (recreated from its template) and our AK."""
        if not isinstance(challenge, dict):
            raise InputError("challenge", "a mapping with credential_blob and secret", type(challenge).__name__)
        blob_raw = _unb64(challenge.get("credential_blob"), "challenge.credential_blob")
        secret_raw = _unb64(challenge.get("secret"), "challenge.secret")
        try:
            blob, _unused1 = TPM2B_ID_OBJECT.unmarshal(blob_raw)
            secret, _unused1 = TPM2B_ENCRYPTED_SECRET.unmarshal(secret_raw)
        except (TSS2_Exception, ValueError, TypeError) as err:
            raise InputError("challenge", "TPM2B_ID_OBJECT and TPM2B_ENCRYPTED_SECRET", str(err))
        with self._lock:
            tpm, ak = self._open()
            esapi = tpm.esapi
            try:
                name = self._ek_slot(tpm)[0]
            except AttestationError:  # no certificate: the TCG default EK (activation then simply fails)
                name = EK_SLOTS[0][0]
            _cert, template = create_ek_template(name, tpm.nv_read_raw)
            ek, _pub, _cd, _ch, _ct = esapi.create_primary(None, template, ESYS_TR.ENDORSEMENT)
            session = None
            try:
                # The EK's policy is PolicySecret(TPM_RH_ENDORSEMENT) (TCG EK Credential Profile).
                session = esapi.start_auth_session(ESYS_TR.NONE, ESYS_TR.NONE, TPM2_SE.POLICY,
                                                   TPMT_SYM_DEF(algorithm=TPM2_ALG.NULL), TPM2_ALG.SHA256)
                esapi.policy_secret(ESYS_TR.ENDORSEMENT, session, b"", b"", b"", 0)
                try:
                    recovered = esapi.activate_credential(ak, ek, blob, secret, session2=session)
                except TSS2_Exception as err:
                    raise AttestationError("TPM2_ActivateCredential refused the challenge: %s" % err)
                return bytes(recovered)
            finally:
                if session is not None:
                    esapi.flush_context(session)
                esapi.flush_context(ek)


# -------------------------------------------------------------------------- verifier side


class VTPMEKValidator(VTPMValidator):
    """``qemu-vtpm`` validation with AK trust only through certified, still-chaining records.

    ``certified_aks``: records (``CertifiedAK`` or their dicts), or a live ``CertifiedAKs``
    registry that enrollment adds to. An AK not certified raises ``EnrollmentRequired``."""

    oid = QEMU_VTPM_EK.oid
    alias_oids = QEMU_VTPM_EK.alias_oids

    def __init__(self, measurements: Measurements, ca_certs: Sequence, certified_aks=(),
                 pcr_selection: Sequence[int] = ALL_PCRS, check_event_log: bool = True):
        super().__init__(measurements, pcr_selection, check_event_log)
        self.ca_certs = load_ca_certs(ca_certs)
        self.rejected_records: List[Tuple[CertifiedAK, str]] = []
        if isinstance(certified_aks, CertifiedAKs):
            self.certified_aks = certified_aks
            return
        self.certified_aks = CertifiedAKs(self.ca_certs)
        for record in certified_aks:
            if isinstance(record, dict):
                record = CertifiedAK.from_dict(record)
            try:
                self.certified_aks.add(record)
            except AttestationError as err:
                self.rejected_records.append((record, str(err)))

    def trust_ak(self, ak_pub: bytes, ak: AKInfo) -> None:
        record = self.certified_aks.get(ak_pub)
        if record is not None:
            verify_ek_cert(record.ek_cert, self.ca_certs, record.ek_chain)  # a CA dropped since enrollment revokes it
            return
        for rejected, reason in self.rejected_records:
            if rejected.ak_pub == ak_pub:
                raise AttestationError("AK is not trusted: its enrollment record's %s" % reason)
        raise EnrollmentRequired("AK is not certified: it was never enrolled through an EK certificate of the "
                                 "trusted CAs with credential activation (AK name %s)" % ak.name.hex(), self, ak_pub)

    def validate(self, document: bytes, nonce: bytes):
        """As ``qemu-vtpm``; the result names the EK the signing AK was certified through (``ek_pub_sha256``)."""
        validation = super().validate(document, nonce)
        record = self.certified_aks.get(validation.ak_pub)
        if record is None:  # trust_ak passed, so a record was there; gone since (never removed today)
            raise AttestationError("AK is not certified: its enrollment record is gone")
        return dataclasses.replace(validation, ek_pub_sha256=ek_pub_sha256(record.ek_cert))

    def enrollment_validator(self) -> "EnrollmentValidator":
        """The validator of the enrollment connection (see EnrollmentValidator): this policy without PCR 13."""
        return EnrollmentValidator(per_set(self.measurements, _without_agent_pcr), self.pcr_selection,
                                   self.check_event_log)


def _without_agent_pcr(measurements: Measurements) -> Measurements:
    return measurements.with_pcrs({i: m for i, m in measurements.pcrs.items() if i != PCR_INDEX_AGENT})


class EnrollmentValidator(VTPMValidator):
    """Validates a ``qemu-vtpm-ek`` document in full (signature, nonce, PCR policy, key binding)
    except AK trust and the agent's PCR 13. Used only for the connection that carries EnrollAK, which sends
    nothing secret: the enrollment itself then proves the AK, and only a new connection validated by
    ``VTPMEKValidator`` (PCR 13 included) is trusted with anything. PCR 13 waits for that connection because
    its expected value measures the verifier's trust configuration too (attestation/agent_measurement.py: the
    EK CA bundle): a verifier given the wrong EK CAs would otherwise be told "PCR 13" and never reach the EK
    chain, the real cause; now the enrollment names the chain, and a changed agent is refused by PCR 13 on
    the next connection."""

    oid = QEMU_VTPM_EK.oid
    alias_oids = QEMU_VTPM_EK.alias_oids


def enroll_over(client, ca_certs: Sequence) -> CertifiedAK:
    """The verifier's side of EnrollAK over an RPC exchange: ``client.enroll_ak(challenge_for)``
    sends the request, passes the node's enrollment request to ``challenge_for`` and returns the
    secret the node's TPM recovered."""
    box: Dict[str, PendingEnrollment] = {}

    def challenge_for(request: Dict[str, str]) -> Dict[str, str]:
        challenge, box["pending"] = begin_enrollment(request, ca_certs)
        return challenge

    secret = client.enroll_ak(challenge_for)
    if "pending" not in box:
        raise AttestationError("EnrollAK: the node sent no enrollment request")
    return finish_enrollment(box["pending"], secret)


# -------------------------------------------------------------------------- the chooser's factories (choose.py)


def make_issuer(tcti: Optional[str] = None, **kwargs) -> VTPMEKIssuer:
    """The ``qemu-vtpm-ek`` issuer on a TCTI (``None``: the default TPM device)."""
    return VTPMEKIssuer(tcti, **kwargs)


def make_validator(policy: Measurements, trust) -> VTPMEKValidator:
    """The ``qemu-vtpm-ek`` validator: trusts AKs certified through ``trust.ek_ca_certs``, recorded in
    ``trust.certified_aks`` (shared by the validators of one process) or in a registry of its own."""
    return VTPMEKValidator(policy, trust.ek_ca_certs, trust.certified_aks if trust.certified_aks is not None
                           else CertifiedAKs(trust.ek_ca_certs))
