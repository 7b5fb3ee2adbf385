# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""AMD SEV-SNP attestation reports: parse, verify against AMD's roots, check against a policy
(docs/attestation.md, "AMD SEV-SNP reports").

- ``parse_report``: AMD's ATTESTATION_REPORT layout (0x4A0 bytes, versions 2 to 5), strictly: the size,
  the version, the signature algorithm (1, ECDSA P-384 with SHA-384) and every reserved field zero.
- ``parse_cert_table``: the certificate table of an extended report request (GUID, offset, length).
- ``verify_report``: the chain ARK -> ASK/ASVK -> VCEK/VLEK (RSA-PSS SHA-384; the ARK one of the pinned
  roots), each certificate valid at ``now``, the VCEK's hwID and TCB extensions equal to the report's
  chip_id and reported_tcb, and the report's ECDSA P-384 signature over its first 0x2A0 bytes.
- ``SNPPolicy``: what an operator requires (TCB minimums, launch measurement, ID key digest, host data,
  guest SVN, VMPL, no debug, no migration agent), the measurements document's ``snp`` object.

Only ``cryptography`` checks signatures; nothing here talks to AMD or a device.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field as dc_field
from typing import Any, Dict, Mapping, Optional, Tuple

# The interface: the report's formats (sev_snp_abi.py) and the chain (sev_snp_chain.py), under this one name.
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.sev_snp_abi import (  # noqa: F401 pylint: disable=unused-import
    CERT_TABLE_GUIDS, GUID_BY_NAME, MAX_VERSION, MIN_VERSION, PRODUCTS, REPORT_SIZE, SIGNATURE_ALGO_ECDSA_P384_SHA384,
    SIGNED_SIZE, TCB, GuestPolicy, Report, SNPError, build_cert_table, parse_cert_table, parse_report,
    product_from_cpuid)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.sev_snp_chain import (  # noqa: F401 pylint: disable=unused-import
    OID_BL_SPL, OID_CSP_ID, OID_FMC_SPL, OID_HWID, OID_PRODUCT_NAME, OID_SNP_SPL, OID_STRUCT_VERSION, OID_TEE_SPL,
    OID_UCODE_SPL, AMDRoot, AMDRoots, ChainCache, VerifiedReport, load_certificate, load_certificates, load_roots,
    pinned_roots, process_cache, verify_report)
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError


def check_report_data(report: Report, expected: bytes) -> None:
    """The report binds ``expected`` (at most 64 bytes, zero-padded to 64)."""
    expected = bytes(expected)
    if len(expected) > 64:
        raise SNPError("report_data", "%d bytes expected" % len(expected), "at most 64 bytes")
    padded = expected.ljust(64, b"\0")
    if not _consteq(report.report_data, padded):
        raise SNPError("report_data", report.report_data, padded)


def _consteq(a: bytes, b: bytes) -> bool:
    return hmac.compare_digest(a, b)


# --- policy ------------------------------------------------------------------------------------------------------

_TCB_KEYS = (("bootloaderVersion", "bootloader"), ("teeVersion", "tee"), ("snpVersion", "snp"),
             ("microcodeVersion", "microcode"), ("fmcVersion", "fmc"))
_POLICY_KEYS = {key for key, _part in _TCB_KEYS}
_POLICY_KEYS |= {"launchMeasurement", "idKeyDigest", "hostData", "guestSvn", "vmpl", "allowDebug", "allowMigrationAgent",
                 "amdRootKey"}


def _hex_bytes(value: Any, size: int, name: str) -> bytes:
    if not isinstance(value, str):
        raise InputError(name, "a hex string of %d bytes" % size, value)
    try:
        data = bytes.fromhex(value)
    except ValueError:
        raise InputError(name, "a hex string of %d bytes" % size, value) from None
    if len(data) != size:
        raise InputError(name, "a hex string of %d bytes" % size, "%d bytes" % len(data))
    return data


def _hex_list(value: Any, size: int, name: str) -> Tuple[bytes, ...]:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise InputError(name, "a hex string of %d bytes or a non-empty list of them" % size, value)
    return tuple(_hex_bytes(item, size, "%s[%d]" % (name, i) if isinstance(value, list) else name)
                 for i, item in enumerate(items))


def _int(value: Any, name: str, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= hi:
        raise InputError(name, "an integer from 0 to %d" % hi, value)
    return value


@dataclass(frozen=True)
class SNPPolicy:
    """What a report must show (the measurements document's ``snp`` object; Constellation's key names).
    TCB minimums apply to reported_tcb; ``launch_measurement``/``id_key_digest``: accepted values."""

    launch_measurement: Tuple[bytes, ...]
    bootloader_version: int = 0
    tee_version: int = 0
    snp_version: int = 0
    microcode_version: int = 0
    fmc_version: Optional[int] = None
    id_key_digest: Optional[Tuple[bytes, ...]] = None
    host_data: Optional[bytes] = None
    guest_svn: int = 0
    vmpl: Optional[int] = None
    allow_debug: bool = False
    allow_migration_agent: bool = False
    amd_root_key: Optional[str] = None
    field: str = dc_field(default="snp", compare=False)

    @classmethod
    def from_dict(cls, data: Any, field: str = "snp") -> "SNPPolicy":
        if not isinstance(data, Mapping):
            raise InputError(field, "a mapping (launchMeasurement, bootloaderVersion, ...)", data)
        unknown = sorted(str(key) for key in data if key not in _POLICY_KEYS)
        if unknown:
            raise InputError(field, "only the keys %s" % ", ".join(sorted(_POLICY_KEYS)), unknown)
        if "launchMeasurement" not in data:
            raise InputError(field + ".launchMeasurement", "the launch measurement (48 bytes hex, or a list)")
        kwargs: Dict[str, Any] = {"field": field}
        kwargs["launch_measurement"] = _hex_list(data["launchMeasurement"], 48, field + ".launchMeasurement")
        for key, part in _TCB_KEYS:
            if key in data:
                kwargs[part + "_version"] = _int(data[key], field + "." + key, 255)
        if "idKeyDigest" in data:
            kwargs["id_key_digest"] = _hex_list(data["idKeyDigest"], 48, field + ".idKeyDigest")
        if "hostData" in data:
            kwargs["host_data"] = _hex_bytes(data["hostData"], 32, field + ".hostData")
        if "guestSvn" in data:
            kwargs["guest_svn"] = _int(data["guestSvn"], field + ".guestSvn", 0xFFFFFFFF)
        if "vmpl" in data:
            kwargs["vmpl"] = _int(data["vmpl"], field + ".vmpl", 3)
        for key, name in (("allowDebug", "allow_debug"), ("allowMigrationAgent", "allow_migration_agent")):
            if key in data:
                if not isinstance(data[key], bool):
                    raise InputError(field + "." + key, "a boolean", data[key])
                kwargs[name] = data[key]
        if "amdRootKey" in data:
            pem = data["amdRootKey"]
            if not isinstance(pem, str) or "-----BEGIN CERTIFICATE-----" not in pem:
                raise InputError(field + ".amdRootKey", "the PEM of an AMD root key (ARK) certificate", pem)
            try:
                load_roots(pem.encode(), field + ".amdRootKey")
            except SNPError as err:
                raise InputError(field + ".amdRootKey", "a self-signed AMD root key (ARK) in AMD's profile",
                                 str(err)) from None
            kwargs["amd_root_key"] = pem
        return cls(**kwargs)

    def to_dict(self) -> dict:
        result: Dict[str, Any] = {}
        for key, part in _TCB_KEYS:
            value = getattr(self, part + "_version")
            if value is not None:
                result[key] = value
        result["launchMeasurement"] = ([m.hex() for m in self.launch_measurement] if len(self.launch_measurement) > 1
                                       else self.launch_measurement[0].hex())
        if self.id_key_digest is not None:
            result["idKeyDigest"] = ([d.hex() for d in self.id_key_digest] if len(self.id_key_digest) > 1
                                     else self.id_key_digest[0].hex())
        if self.host_data is not None:
            result["hostData"] = self.host_data.hex()
        result["guestSvn"] = self.guest_svn
        if self.vmpl is not None:
            result["vmpl"] = self.vmpl
        result["allowDebug"] = self.allow_debug
        result["allowMigrationAgent"] = self.allow_migration_agent
        if self.amd_root_key is not None:
            result["amdRootKey"] = self.amd_root_key
        return result

    def roots(self, default: Optional[AMDRoots] = None) -> AMDRoots:
        """The roots this policy trusts: its own ``amdRootKey`` if set, else ``default`` (else the pinned ones)."""
        if self.amd_root_key is not None:
            return load_roots(self.amd_root_key.encode(), self.field + ".amdRootKey")
        return default if default is not None else pinned_roots()

    def check(self, report: Report) -> None:
        """SNPError naming the first requirement ``report`` fails (``snp.<key>``), found and wanted."""
        f = self.field
        if report.policy.debug and not self.allow_debug:
            raise SNPError(f + ".allowDebug", "the guest policy's debug bit set (the host may read the guest)",
                           "debug off (allowDebug false)")
        if report.policy.migrate_ma and not self.allow_migration_agent:
            raise SNPError(f + ".allowMigrationAgent", "the guest policy's migrate_ma bit set",
                           "no migration agent (allowMigrationAgent false)")
        tcb = report.reported_tcb
        for key, part in _TCB_KEYS:
            minimum = getattr(self, part + "_version")
            if minimum is None:
                continue
            value = getattr(tcb, part)
            if value is None:  # fmc asked of a Milan/Genoa report
                raise SNPError(f + "." + key, "no %s in the reported TCB (%s layout)" % (part, report.tcb_product),
                               ">= %d" % minimum)
            if value < minimum:
                raise SNPError(f + "." + key, "%d (reported_tcb)" % value, ">= %d" % minimum)
        if report.guest_svn < self.guest_svn:
            raise SNPError(f + ".guestSvn", report.guest_svn, ">= %d" % self.guest_svn)
        if self.vmpl is not None and report.vmpl != self.vmpl:
            raise SNPError(f + ".vmpl", report.vmpl, self.vmpl)
        if report.measurement not in self.launch_measurement:
            raise SNPError(f + ".launchMeasurement", report.measurement,
                           " or ".join(m.hex() for m in self.launch_measurement))
        if self.id_key_digest is not None and report.id_key_digest not in self.id_key_digest:
            raise SNPError(f + ".idKeyDigest", report.id_key_digest, " or ".join(d.hex() for d in self.id_key_digest))
        if self.host_data is not None and report.host_data != self.host_data:
            raise SNPError(f + ".hostData", report.host_data, self.host_data)
