# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``sev-snp`` variant (ours; docs/attestation.md, "Variant `sev-snp` (ours)"): an AMD SEV-SNP guest without a
vTPM attests with the CPU's signed report alone.

The document is the JSON ``{"InstanceInfo": b64, "UserData": b64}``; InstanceInfo is Constellation's
``snp.InstanceInfo`` as Go's encoding/json writes it (``ReportSigner``: the VCEK or VLEK, PEM; ``CertChain``: the
ASK/ASVK and ARK, PEM; ``AttestationReport``: the report's bytes; ``Azure`` and ``GCP``: null). The report's
``report_data`` is SHA-256(user data || nonce), zero-padded to 64 bytes (Constellation's extra data), so the nonce
and the aTLS key the user data names are bound by the CPU's signature. There is no TPM quote: the validation has
no PCRs (``Validation.pcrs == {}``), and the chooser registers this variant with ``quotes_pcrs=False``.

The issuer asks the platform for a report (``snp_report_source``): Linux's configfs-tsm interface
(``configfs-tsm:/sys/kernel/config/tsm/report``, the default) or a unix socket speaking one JSON line each way
(``unix:<path>``: the lab's platform, docs/attestation.md "Variant `sev-snp` (ours)"). The validator runs
sev_snp.py: the report is parsed strictly, its binding checked, its signature chain verified to the AMD roots
(``Trust.amd_roots``; each signer's chain once per process, ``Trust.snp_cache``) and the measurements document's
``snp`` object enforced; every refusal names the field.
"""

from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import json
import os
import socket
import ssl
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import amd_certs, sev_snp
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import Measurements, MeasurementSets
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.choose import SEV_SNP
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.variant import Validation
from ansible_collections.constellation.cluster.plugins.module_utils.encoding import b64decode, b64encode, load_json
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError, InputError

SOURCE_FIELD = "snp_report_source"
CONFIGFS_TSM = "configfs-tsm"
UNIX = "unix"
DEFAULT_CONFIGFS_TSM_PATH = "/sys/kernel/config/tsm/report"
DEFAULT_REPORT_SOURCE = "%s:%s" % (CONFIGFS_TSM, DEFAULT_CONFIGFS_TSM_PATH)
REPORT_DATA_SIZE = 64
# A report is 1184 bytes, a cert table a few KiB (VCEK, ASK, ARK: ~1.5 KiB each as DER); PEM and base64 twice
# make it about 2.5 times that. Anything far above is refused before it is parsed.
MAX_DOCUMENT = 64 * 1024
MAX_CERTS = 32 * 1024
_MAX_REPLY = 2 * MAX_DOCUMENT
_SOCKET_TIMEOUT = 10.0
_DOCUMENT_KEYS = ("InstanceInfo", "UserData")
_SIGNERS = ("vcek", "vlek")
_CHAIN = ("ask", "asvk", "ark")


def make_report_data(user_data: bytes, nonce: bytes) -> bytes:
    """SHA-256(user data || nonce) (Constellation's attestation.MakeExtraData), what report_data holds zero-padded."""
    return hashlib.sha256(bytes(user_data) + bytes(nonce)).digest()


# ----------------------------------------------------------------------------------------- the report's source


def parse_report_source(value: Any, field: str = SOURCE_FIELD) -> Tuple[str, str]:
    """``(kind, absolute path)`` of ``configfs-tsm:<path>`` or ``unix:<path>``; None means the default (Linux's
    configfs-tsm). InputError naming ``field`` otherwise."""
    if value is None:
        value = DEFAULT_REPORT_SOURCE
    expected = ("%s:<absolute path> (Linux's interface, default %s) or %s:<absolute path of the platform's socket>"
                % (CONFIGFS_TSM, DEFAULT_CONFIGFS_TSM_PATH, UNIX))
    if not isinstance(value, str):
        raise InputError(field, expected, type(value).__name__)
    kind, sep, path = value.partition(":")
    if not sep or kind not in (CONFIGFS_TSM, UNIX) or not path.startswith("/") or "\0" in path or len(path) > 4096:
        raise InputError(field, expected, value)
    return kind, os.path.normpath(path)


def report_source(value: Any = None, field: str = SOURCE_FIELD):
    """The report source ``value`` names (``parse_report_source``): a ``ConfigfsTSM`` or a ``UnixPlatform``."""
    kind, path = parse_report_source(value, field)
    return ConfigfsTSM(path) if kind == CONFIGFS_TSM else UnixPlatform(path)


class ConfigfsTSM:
    """Linux's configfs-tsm report interface (Documentation/ABI/testing/configfs-tsm): an entry made under
    ``path`` for each report, ``inblob`` <- report_data, ``outblob`` -> the report, ``auxblob`` -> the certificate
    table (empty when the host stored none), ``generation`` read around them (a write by anyone else in between
    is refused), the entry removed again. Every error names the file and the cause."""

    def __init__(self, path: str = DEFAULT_CONFIGFS_TSM_PATH):
        self.path = path
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return "%s:%s" % (CONFIGFS_TSM, self.path)

    def _fail(self, action: str, path: str, err: OSError) -> AttestationError:
        cause = err.strerror or str(err)
        if err.errno == errno.ENOENT and path == self.path:
            cause += " (no configfs-tsm here: is this an SEV-SNP guest with Linux 6.7 or later and configfs mounted?)"
        return AttestationError("%s: cannot %s %s: %s" % (SOURCE_FIELD, action, path, cause))

    def _read(self, entry: str, name: str) -> bytes:
        path = os.path.join(entry, name)
        try:
            with open(path, "rb") as handle:
                return handle.read()
        except OSError as err:
            raise self._fail("read", path, err) from None

    def get(self, report_data: bytes) -> Tuple[bytes, bytes]:
        """(report, certificate table) for ``report_data`` (64 bytes)."""
        with self._lock:
            entry = os.path.join(self.path, "constellation-%s" % uuid.uuid4().hex)
            try:
                os.mkdir(entry, 0o700)
            except OSError as err:
                raise self._fail("make the report entry", self.path if err.errno == errno.ENOENT else entry,
                                 err) from None
            try:
                return self._get(entry, report_data)
            finally:
                try:
                    os.rmdir(entry)
                except OSError:
                    pass  # the kernel removes nothing else; a left entry costs a directory, never a secret

    def _get(self, entry: str, report_data: bytes) -> Tuple[bytes, bytes]:
        if os.path.exists(os.path.join(entry, "provider")):
            provider = self._read(entry, "provider").strip().decode("ascii", "replace")
            if provider != "sev_guest":
                raise AttestationError("%s: %s is provided by %r, not by the SEV-SNP guest driver (sev_guest)"
                                       % (SOURCE_FIELD, self.path, provider))
        inblob = os.path.join(entry, "inblob")
        try:
            with open(inblob, "wb") as handle:
                handle.write(report_data)
        except OSError as err:
            raise self._fail("write", inblob, err) from None
        before = self._read(entry, "generation")
        report = self._read(entry, "outblob")
        aux = self._read(entry, "auxblob") if os.path.exists(os.path.join(entry, "auxblob")) else b""
        after = self._read(entry, "generation")
        if before != after:
            raise AttestationError("%s: %s changed while the report was read (generation %s -> %s): another "
                                   "process wrote to this report entry"
                                   % (SOURCE_FIELD, entry, before.strip().decode("ascii", "replace"),
                                      after.strip().decode("ascii", "replace")))
        return report, aux


class UnixPlatform:
    """A platform that signs reports behind a unix socket (the lab's, ``<lab state>/hosts/<host>/snp-platform.sock``):
    one JSON line ``{"report_data": "<128 hex>"}`` out, one JSON line ``{"report": b64, "certs": b64}`` or
    ``{"error": "..."}`` back."""

    def __init__(self, path: str, timeout: float = _SOCKET_TIMEOUT):
        self.path = path
        self.timeout = timeout

    def __repr__(self) -> str:
        return "%s:%s" % (UNIX, self.path)

    def get(self, report_data: bytes) -> Tuple[bytes, bytes]:
        request = json.dumps({"report_data": bytes(report_data).hex()}).encode("ascii") + b"\n"
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(self.timeout)
                sock.connect(self.path)
                sock.sendall(request)
                reply = b""
                while not reply.endswith(b"\n"):
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    reply += chunk
                    if len(reply) > _MAX_REPLY:
                        raise AttestationError("%s: the platform at %s answered more than %d bytes"
                                               % (SOURCE_FIELD, self.path, _MAX_REPLY))
        except OSError as err:
            raise AttestationError("%s: cannot get a report from the platform at %s: %s"
                                   % (SOURCE_FIELD, self.path, err.strerror or err)) from None
        try:
            answer = load_json(reply, "the platform's answer", _MAX_REPLY)
        except InputError as err:
            raise AttestationError("%s: the platform at %s answered no JSON line: %s" % (SOURCE_FIELD, self.path, err)) \
                from None
        if not isinstance(answer, dict):
            raise AttestationError("%s: the platform at %s answered %s, not an object"
                                   % (SOURCE_FIELD, self.path, type(answer).__name__))
        if "error" in answer:
            raise AttestationError("%s: the platform at %s refused: %s"
                                   % (SOURCE_FIELD, self.path, str(answer["error"])[:300]))
        report = _unb64(answer.get("report"), "the platform's report")
        certs = b"" if answer.get("certs") in (None, "") else _unb64(answer.get("certs"), "the platform's certs")
        return report, certs


# ------------------------------------------------------------------------ Constellation's snp.InstanceInfo


MAX_INSTANCE_INFO = 64 * 1024  # a report, two or three certificates and Azure's runtime data: a few KiB
MAX_CERT_PEM = 16 * 1024  # one PEM certificate (ReportSigner), or ASK/ASVK + ARK (CertChain)
MAX_RUNTIME_DATA = 16 * 1024  # Azure's runtime data: a JSON of two RSA keys and the VM configuration
MAX_MAA_TOKEN = 16 * 1024
# The keys of Constellation's snp.InstanceInfo as Go's encoding/json writes them, in the struct's order.
INSTANCE_INFO_KEYS = ("ReportSigner", "CertChain", "AttestationReport", "Azure", "GCP")
AZURE_KEYS = ("RuntimeData", "MAAToken")


@dataclass(frozen=True)
class InstanceInfo:
    """Constellation's ``snp.InstanceInfo``: ``report`` (AttestationReport), ``report_signer`` (PEM of the VCEK or
    VLEK, b"" when absent), ``cert_chain`` (PEM of ASK/ASVK and maybe ARK, b"" when absent); Azure's
    ``runtime_data`` and ``maa_token`` (``runtime_data`` None: no Azure object)."""

    report: bytes
    report_signer: bytes = b""
    cert_chain: bytes = b""
    runtime_data: Optional[bytes] = None
    maa_token: str = ""

    def to_json(self) -> bytes:
        """Go's encoding/json of snp.InstanceInfo: struct order, compact, nil byte slices as null."""
        azure = None
        if self.runtime_data is not None:
            azure = {"RuntimeData": b64encode(self.runtime_data), "MAAToken": self.maa_token}
        document = {"ReportSigner": b64encode(self.report_signer) if self.report_signer else None,
                    "CertChain": b64encode(self.cert_chain) if self.cert_chain else None,
                    "AttestationReport": b64encode(self.report), "Azure": azure, "GCP": None}
        return json.dumps(document, separators=(",", ":")).encode("ascii")


def _bytes_field(doc: Dict[str, Any], key: str, field: str, max_size: int) -> bytes:
    value = doc.get(key)
    if value is None:
        return b""
    return b64decode(value, field, max_size=max_size)


def decode_instance_info(raw: Optional[bytes]) -> InstanceInfo:
    """Constellation's snp.InstanceInfo JSON, strictly: exactly its keys (GCP null: not these variants), base64
    byte fields within bounds, an AttestationReport present. AttestationError naming the field otherwise."""
    if not raw:
        raise AttestationError("InstanceInfo: found none, wanted Constellation's snp.InstanceInfo JSON (the SEV-SNP "
                               "report and its signer's certificate)")
    try:
        doc = load_json(raw, "InstanceInfo", MAX_INSTANCE_INFO)
        if not isinstance(doc, dict):
            raise InputError("InstanceInfo", "a JSON object", type(doc).__name__)
        unknown = sorted(set(doc) - set(INSTANCE_INFO_KEYS))
        if unknown:
            raise InputError("InstanceInfo", "only the keys %s" % ", ".join(INSTANCE_INFO_KEYS), unknown[0])
        if doc.get("GCP") is not None:
            raise InputError("InstanceInfo.GCP", "null (GCP's instance info belongs to gcp-sev-snp)", "an object")
        report = _bytes_field(doc, "AttestationReport", "InstanceInfo.AttestationReport", 4096)
        if not report:
            raise InputError("InstanceInfo.AttestationReport", "the SEV-SNP report (base64)", doc.get("AttestationReport"))
        signer = _bytes_field(doc, "ReportSigner", "InstanceInfo.ReportSigner", MAX_CERT_PEM)
        chain = _bytes_field(doc, "CertChain", "InstanceInfo.CertChain", 2 * MAX_CERT_PEM)
        azure = doc.get("Azure")
        if azure is None:
            return InstanceInfo(report, signer, chain)
        if not isinstance(azure, dict):
            raise InputError("InstanceInfo.Azure", "an object with RuntimeData and MAAToken", type(azure).__name__)
        unknown = sorted(set(azure) - set(AZURE_KEYS))
        if unknown:
            raise InputError("InstanceInfo.Azure", "only the keys %s" % ", ".join(AZURE_KEYS), unknown[0])
        token = azure.get("MAAToken", "")
        if token is None:
            token = ""
        if not isinstance(token, str) or len(token) > MAX_MAA_TOKEN:
            raise InputError("InstanceInfo.Azure.MAAToken", "a string of at most %d characters" % MAX_MAA_TOKEN,
                             type(token).__name__ if not isinstance(token, str) else "%d characters" % len(token))
        runtime = _bytes_field(azure, "RuntimeData", "InstanceInfo.Azure.RuntimeData", MAX_RUNTIME_DATA)
        return InstanceInfo(report, signer, chain, runtime, token)
    except InputError as err:
        raise AttestationError(str(err)) from None


# --------------------------------------------------------------------------------------------------- issuer


def pem_certificate(der: bytes) -> bytes:
    """A certificate of a report's certificate table (DER) as the instance info carries it (PEM): re-encoded, not
    parsed - the validator parses it (AMD's VCEKs carry serial number zero, sev_snp.load_certificate)."""
    return ssl.DER_cert_to_PEM_cert(bytes(der)).encode("ascii")


class SNPIssuer:
    """Issues ``sev-snp`` documents: a report whose report_data binds (user data, nonce), with the VCEK/VLEK and
    chain the platform's certificate table holds; a host that hands out the report without them (an empty table)
    takes them from ``cache`` (``amd_cert_cache``, AMD's KDS only with ``amd_kds_fetch``: docs/attestation.md,
    "Certificates at hand")."""

    oid = SEV_SNP.oid

    def __init__(self, source: Any = None, cache: Optional[amd_certs.CertCache] = None):
        self.source = source if hasattr(source, "get") else report_source(source)
        self.cache = cache

    def instance_info(self, report_data: bytes) -> "InstanceInfo":
        """Constellation's snp.InstanceInfo (bytes as base64, Go's encoding/json) for ``report_data``."""
        wanted = bytes(report_data).ljust(REPORT_DATA_SIZE, b"\0")
        report, table = self.source.get(wanted)
        try:
            parsed = sev_snp.parse_report(report)
        except AttestationError as err:
            raise AttestationError("%s: %r gave no valid report: %s" % (SOURCE_FIELD, self.source, err)) from None
        if parsed.report_data != wanted:
            raise AttestationError("%s: %r signed another report_data than it was given" % (SOURCE_FIELD, self.source))
        certs = sev_snp.parse_cert_table(table) if table else {}
        signer = b"".join(pem_certificate(certs[name]) for name in _SIGNERS if name in certs)
        chain = b"".join(pem_certificate(certs[name]) for name in _CHAIN if name in certs)
        if not signer and self.cache is not None:
            signer_der, chain = amd_certs.certs_for_report(parsed, self.cache)
            signer = pem_certificate(signer_der)
        return InstanceInfo(bytes(report), signer, chain)

    def issue(self, user_data: bytes, nonce: bytes) -> bytes:
        if not isinstance(user_data, (bytes, bytearray)) or not isinstance(nonce, (bytes, bytearray)):
            raise InputError("user_data/nonce", "bytes", type(user_data).__name__)
        info = self.instance_info(make_report_data(user_data, nonce)).to_json()
        document = {"InstanceInfo": _b64(info), "UserData": _b64(bytes(user_data))}
        return json.dumps(document, separators=(",", ":")).encode("ascii")


def _b64(data: Optional[bytes]) -> Optional[str]:
    # Go's encoding/json writes a nil []byte as null and an empty one as "".
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise AttestationError("sev-snp attestation document: %s must be base64 text, got %s"
                               % (what, type(value).__name__))
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise AttestationError("sev-snp attestation document: %s is not valid base64" % what) from None


# ------------------------------------------------------------------------------------------------ validator


def _strict_object(data: bytes, what: str, keys: Tuple[str, ...], required: Tuple[str, ...]) -> Dict[str, Any]:
    try:
        parsed = load_json(data, what, MAX_DOCUMENT)
    except InputError as err:
        raise AttestationError("sev-snp attestation document: %s is not JSON within bounds: %s" % (what, err)) from None
    if not isinstance(parsed, dict):
        raise AttestationError("sev-snp attestation document: %s is %s, not an object" % (what, type(parsed).__name__))
    unknown = sorted(set(parsed) - set(keys))
    if unknown:
        raise AttestationError("sev-snp attestation document: %s has unknown key(s) %s (only %s)"
                               % (what, ", ".join(repr(k[:40]) for k in unknown[:5]), ", ".join(keys)))
    missing = [key for key in required if parsed.get(key) is None]
    if missing:
        raise AttestationError("sev-snp attestation document: %s has no %s" % (what, ", ".join(missing)))
    return parsed


def decode_document(document: Any) -> Tuple[bytes, bytes, bytes, bytes]:
    """(report, signer PEM, chain PEM, user data) of a ``sev-snp`` document; AttestationError naming what is
    malformed: more than MAX_DOCUMENT bytes, unknown keys, a cloud's instance info, bad base64."""
    if not isinstance(document, (bytes, bytearray)):
        raise AttestationError("sev-snp attestation document must be bytes")
    if len(document) > MAX_DOCUMENT:
        raise AttestationError("sev-snp attestation document is larger than %d bytes" % MAX_DOCUMENT)
    doc = _strict_object(bytes(document), "the document", _DOCUMENT_KEYS, ("InstanceInfo",))
    user_data = b"" if doc.get("UserData") is None else _unb64(doc["UserData"], "UserData")
    try:
        info = decode_instance_info(_unb64(doc["InstanceInfo"], "InstanceInfo"))
    except AttestationError as err:
        raise AttestationError("sev-snp attestation document: %s" % err) from None
    if info.runtime_data is not None:
        raise AttestationError("sev-snp attestation document: InstanceInfo.Azure is set; a cloud's report is another "
                               "variant's (azure-sev-snp, ...), this one takes none")
    report, signer, chain = info.report, info.report_signer, info.cert_chain
    if len(signer) > MAX_CERTS or len(chain) > MAX_CERTS:
        raise AttestationError("sev-snp attestation document: certificates of more than %d bytes" % MAX_CERTS)
    return report, signer, chain, user_data


class SNPValidator:
    """Validates ``sev-snp`` documents, in this order: the document (strict), the report (sev_snp.parse_report),
    report_data == SHA-256(user data || nonce) zero-padded, the report's signature chain to ``roots``
    (sev_snp.verify_report), the measurements document's ``snp`` object (a set without one refuses the report).
    ``measurements`` is swapped as a whole when the accepted sets change (the agent's hot reload)."""

    oid = SEV_SNP.oid
    # Pure computation on the document (at most MAX_DOCUMENT bytes) with the roots in memory: aTLS runs it in the
    # handshake's thread (variant.Validator).
    validate_inline = True

    def __init__(self, measurements: Any, roots: Any = None, cache: Any = None):
        if not isinstance(measurements, (Measurements, MeasurementSets)):
            raise InputError("measurements", "a Measurements policy", type(measurements).__name__)
        self.measurements = measurements
        self.roots = roots
        self.cache = cache if cache is not None else sev_snp.ChainCache()
        self._pinned: Dict[str, Any] = {}  # the sets' own amdRootKey roots, parsed once

    def validate(self, document: bytes, nonce: bytes) -> Validation:
        report_raw, signer, chain, user_data = decode_document(document)
        report = sev_snp.parse_report(report_raw)
        try:
            sev_snp.check_report_data(report, make_report_data(user_data, nonce))
        except sev_snp.SNPError as err:
            raise sev_snp.SNPError(err.field, err.found, "%s = SHA-256(user data || nonce) (a replayed report, a "
                                   "wrong nonce or swapped user data)" % err.wanted) from None
        if not signer:
            raise AttestationError("sev-snp attestation document: InstanceInfo.ReportSigner is empty (the platform "
                                   "gave no VCEK or VLEK with the report)")
        verified, (measurement_set, checks, warnings) = verify_and_match(
            self.measurements, report, signer, chain, self.roots, self.cache, self._pinned)
        return Validation(user_data=user_data, pcrs={}, checks=checks, warnings=warnings,
                          measurement_set=measurement_set, snp=verified.to_dict())


def verify_and_match(measurements: Any, report: Any, signer: bytes, chain: bytes, roots: Any, cache: Any,
                     pinned: Optional[Dict[str, Any]] = None, pcrs: Optional[Dict[int, bytes]] = None, now: Any = None):
    """(``sev_snp.VerifiedReport``, ``measurements.match(pcrs, report)``): the report's chain verified to the AMD
    roots each accepted set names - its own ``amdRootKey`` where it pins one (instead of ``roots``), else ``roots``
    - and matched against those sets only. Sets that pin no root (the usual case) are one group: one verification.
    ``pinned``: a dict that keeps the parsed ``amdRootKey`` roots between calls. Raises the first group's error
    when no group verifies and matches."""
    pinned = {} if pinned is None else pinned
    groups: Dict[Optional[str], list] = {}
    sets = measurements.sets
    for name, each in sets.items():
        key = each.snp.amd_root_key if each.snp is not None else None
        groups.setdefault(key, []).append(name)
    first: Optional[AttestationError] = None
    for key, names in groups.items():
        if key is None:
            group_roots = roots
        else:
            if key not in pinned:
                pinned[key] = sets[names[0]].snp.roots(roots)
            group_roots = pinned[key]
        policy = measurements if len(groups) == 1 else MeasurementSets(
            {name: sets[name] for name in names}, measurements.version, measurements.agents)
        try:
            verified = sev_snp.verify_report(report, signer, chain, roots=group_roots, now=now, cache=cache)
            return verified, policy.match(pcrs or {}, snp_report=report)
        except AttestationError as err:
            first = first or err
    raise first or AttestationError("the measurements policy has no accepted set")


# -------------------------------------------------------------------------- the chooser's factories (choose.py)


def make_issuer(tcti: Optional[str] = None, snp_report_source: Optional[str] = None,
                amd_cert_cache: Optional[str] = None, amd_kds_fetch: bool = False, **_unused) -> SNPIssuer:
    """The ``sev-snp`` issuer: reports from ``snp_report_source`` (default: Linux's configfs-tsm), certificates the
    platform did not send from ``amd_cert_cache``. It quotes no TPM: ``tcti`` and the vTPM variants' options
    (``ak_alg``) do not apply."""
    cache = amd_certs.CertCache(amd_cert_cache, bool(amd_kds_fetch)) if amd_cert_cache else None
    return SNPIssuer(snp_report_source, cache)


def make_validator(policy: Any, trust: Any) -> SNPValidator:
    """The ``sev-snp`` validator: reports chain to ``trust.amd_roots`` (the pinned AMD roots unless a bundle was
    configured), each signer's chain verified once per ``trust.snp_cache``."""
    return SNPValidator(policy, getattr(trust, "amd_roots", None), getattr(trust, "snp_cache", None))
