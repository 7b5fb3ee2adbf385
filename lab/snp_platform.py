# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's SEV-SNP platform: what a host's AMD secure processor would sign (docs/testing.md, "The lab as an
SEV-SNP platform").

Each host has a platform state in ``<host dir>/snp/platform.json`` (made once, kept across ``lab status`` and
restarts): its chip (a random 64-byte CHIP_ID and the chip's secret the VCEK is derived from), the guest's launch
measurement, policy, host data, VMPL and the platform's TCBs (current, reported, committed, launch), the report
version, which key signs (VCEK, or VLEK as on AWS) and which AMD certified it (the lab's, or the "foreign" one
for a report signed in software). ``sign_report(host, report_data)`` builds the attestation report in AMD's
layout (written here from the SEV-SNP firmware ABI, independently of the verifier's parser, which is tested
against it), signs it with the VCEK (ECDSA P-384, SHA-384 over the first 0x2A0 bytes, r and s little-endian)
and returns it with the extended report's certificate table (GUID table with VCEK, ASK, ARK).

The VCEK is derived, as AMD's firmware derives it, from the chip's secret and the TCB (HKDF here), so a
platform at another TCB signs with another key, whose certificate the lab's AMD issues for that TCB.

``serve(socket_path, platform)`` answers on a unix socket, one JSON line per connection (the agent's
``snp_report_source: unix:<path>``): ``{"report_data": "<128 hex>"}`` -> ``{"report": "<b64>", "certs":
"<b64>"}`` or ``{"error": "..."}``. The lab starts it per host (``python -m lab.snp_platform``) inside the host's
namespaces, so that ``lab down`` stops it with the host's other processes.

``hcl_report(host, runtime_data)``: Azure's HCL report (what the paravisor writes into the vTPM's NV index
0x01400001): the SNP report with report_data = SHA-256(runtime data), zero-padded, followed by the runtime data.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import hashlib
import json
import os
import socket
import socketserver
import struct
import sys
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ansible_collections.constellation.cluster.plugins.module_utils import fileutil
from lab.amd import LAB_CSP_ID, AMDChain, check_tcb, foreign_chain, lab_chain
from lab.image import LAB_IMAGE, launch_measurement
from lab.names import Host

REPORT_SIZE = 0x4A0
SIGNED_SIZE = 0x2A0  # the signature covers the report up to here
SIGNATURE_ALGO_ECDSA_P384_SHA384 = 1
SIGNING_KEYS = {"vcek": 0, "vlek": 1}  # SIGNING_KEY, bits 2-4 of the signer info at 0x48
CHAINS = ("lab", "foreign")
VERSIONS = (2, 3, 5)  # 3: the CPUID of the chip; 5: the mitigation vectors (firmware 1.58 on)
# SMT allowed (bit 16) and bit 17 (reserved, must be one); ABI 0.0. Bit 19 is DEBUG, bit 18 MIGRATE_MA.
LAB_POLICY = (1 << 16) | (1 << 17)
POLICY_DEBUG = 1 << 19
# The lab platform's TCB (security patch levels of a current Milan): the measurements document's minimums.
LAB_TCB = {"bootloader": 4, "tee": 0, "snp": 22, "microcode": 213}
# `tamper --snp tcb`: a platform downgraded to an older microcode (a genuine VCEK for that TCB).
DOWNGRADED_TCB = dict(LAB_TCB, microcode=LAB_TCB["microcode"] - 8)
LAB_FIRMWARE = {"major": 1, "minor": 55, "build": 21}
MILAN_CPUID = (0x19, 0x01, 0x01)  # family, model, stepping of a Milan B1
PLATFORM_INFO_SMT = 1
TAMPERS = ("debug", "tcb", "measurement", "foreign")
# The certificate table's GUIDs (AMD's GHCB specification); the ASK's also names the ASVK.
GUID_VCEK = uuid.UUID("63da758d-e664-4564-adc5-f4b93be8accd")
GUID_VLEK = uuid.UUID("a8074bc2-a25a-483e-aae6-39c045a0b8a1")
GUID_ASK = uuid.UUID("4ab7b379-bbac-4fe4-a02f-05aef327c782")
GUID_ARK = uuid.UUID("c0b406a4-a803-4952-9743-3fb6014cd0ae")
CERT_ENTRY = struct.Struct("<16sII")
# The HCL report (Azure): header, the hardware report, the IGVM request data, the runtime data.
HCL_SIGNATURE, HCL_VERSION, HCL_REQUEST_AK_CERT = 0x414C4348, 2, 2  # "HCLA"
HCL_REPORT_TYPE_SNP, HCL_HASH_SHA256 = 2, 1
HCL_HEADER = struct.Struct("<IIIII12x")
HCL_REQUEST = struct.Struct("<IIIII")
MAX_REQUEST = 4096  # one request line; anything longer is refused
SOCKET_TIMEOUT = 5.0

_LOCK = threading.Lock()


class PlatformError(Exception):
    pass


def tcb_u64(tcb: Dict[str, int]) -> int:
    """A TCB_VERSION of Milan/Genoa: bootloader in byte 0, TEE in byte 1, SNP in byte 6, microcode in byte 7."""
    tcb = check_tcb(tcb)
    return tcb["bootloader"] | tcb["tee"] << 8 | tcb["snp"] << 48 | tcb["microcode"] << 56


@dataclass
class PlatformState:
    """What a host's platform reports (hex strings for bytes, as kept in platform.json)."""

    chip_id: str
    chip_secret: str
    report_id: str
    measurement: str
    host_data: str = "00" * 32
    policy: int = LAB_POLICY
    vmpl: int = 0
    guest_svn: int = 0
    version: int = 3
    current_tcb: dict = dataclasses.field(default_factory=lambda: dict(LAB_TCB))
    reported_tcb: dict = dataclasses.field(default_factory=lambda: dict(LAB_TCB))
    committed_tcb: dict = dataclasses.field(default_factory=lambda: dict(LAB_TCB))
    launch_tcb: dict = dataclasses.field(default_factory=lambda: dict(LAB_TCB))
    signing_key: str = "vcek"
    chain: str = "lab"
    mask_chip_id: bool = False
    tampered: list = dataclasses.field(default_factory=list)

    @classmethod
    def fresh(cls, image: str = LAB_IMAGE, signing_key: str = "vcek") -> "PlatformState":
        return cls(chip_id=os.urandom(64).hex(), chip_secret=os.urandom(32).hex(), report_id=os.urandom(32).hex(),
                   measurement=launch_measurement(image).hex(), signing_key=signing_key)

    def check(self) -> "PlatformState":
        for name, size in (("chip_id", 64), ("chip_secret", 32), ("report_id", 32), ("measurement", 48),
                           ("host_data", 32)):
            value = getattr(self, name)
            try:
                ok = len(bytes.fromhex(value)) == size
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise PlatformError("platform.%s: expected %d bytes as hex, got %r" % (name, size, value))
        for name in ("current_tcb", "reported_tcb", "committed_tcb", "launch_tcb"):
            try:
                check_tcb(getattr(self, name))
            except ValueError as err:
                raise PlatformError("platform.%s: %s" % (name, err)) from None
        if self.version not in VERSIONS:
            raise PlatformError("platform.version: expected one of %s, got %r" % (VERSIONS, self.version))
        if self.signing_key not in SIGNING_KEYS:
            raise PlatformError("platform.signing_key: expected vcek or vlek, got %r" % self.signing_key)
        if self.chain not in CHAINS:
            raise PlatformError("platform.chain: expected lab or foreign, got %r" % self.chain)
        for name, top in (("policy", 2 ** 64), ("vmpl", 4), ("guest_svn", 2 ** 32)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < top:
                raise PlatformError("platform.%s: expected an integer 0..%d, got %r" % (name, top - 1, value))
        return self


class SNPPlatform:
    """The SEV-SNP platform of one host: its state in ``<host_dir>/snp`` and the lab's AMD in ``lab_state``."""

    def __init__(self, host_dir: Path, lab_state: Path):
        self.host_dir = Path(host_dir)
        self.lab_state = Path(lab_state)

    @property
    def folder(self) -> Path:
        return self.host_dir / "snp"

    @property
    def state_path(self) -> Path:
        return self.folder / "platform.json"

    @property
    def socket_path(self) -> Path:
        return self.host_dir / "snp-platform.sock"

    @property
    def pid_path(self) -> Path:
        return self.folder / "platform.pid"

    # -- state --------------------------------------------------------------------------
    def state(self, image: str = LAB_IMAGE, signing_key: str = "vcek") -> PlatformState:
        """The platform's state, made once (``image``, ``signing_key``: for a new one only)."""
        with _LOCK:
            if not self.state_path.exists():
                self.save(PlatformState.fresh(image, signing_key))
            try:
                data = json.loads(self.state_path.read_text())
                names = {f.name for f in dataclasses.fields(PlatformState)}
                state = PlatformState(**{k: v for k, v in data.items() if k in names})
            except (OSError, ValueError, TypeError) as err:
                raise PlatformError("%s: unreadable platform state (%s)" % (self.state_path, err)) from None
        return state.check()

    def save(self, state: PlatformState) -> None:
        state.check()
        self.folder.mkdir(parents=True, exist_ok=True)
        fileutil.atomic_write(str(self.state_path), json.dumps(dataclasses.asdict(state), indent=2).encode(),
                              0o600)

    def update(self, **changes) -> PlatformState:
        state = dataclasses.replace(self.state(), **changes)
        self.save(state)
        return state

    def tamper(self, what: str) -> PlatformState:
        """``debug``: the guest launched with the DEBUG policy bit; ``measurement``: a modified guest (another launch
        measurement); ``tcb``: a platform downgraded below the lab's minimum (the lab's AMD certifies a VCEK for
        that TCB, as AMD's would); ``foreign``: reports signed with a VCEK of another AMD (software-signed)."""
        state = self.state()
        tampered = sorted(set(state.tampered) | {what})
        if what == "debug":
            return self.update(policy=state.policy | POLICY_DEBUG, tampered=tampered)
        if what == "measurement":
            return self.update(measurement=hashlib.sha384(b"tampered guest/" + bytes.fromhex(state.measurement))
                               .hexdigest(), tampered=tampered)
        if what == "tcb":
            tcb = dict(DOWNGRADED_TCB)
            return self.update(current_tcb=tcb, reported_tcb=dict(tcb), committed_tcb=dict(tcb),
                               launch_tcb=dict(tcb), tampered=tampered)
        if what == "foreign":
            return self.update(chain="foreign", tampered=tampered)
        raise PlatformError("snp: expected one of %s, got %r" % (", ".join(TAMPERS), what))

    def restore(self, image: str = LAB_IMAGE) -> PlatformState:
        """The genuine platform again (same chip): the lab's policy, measurement, TCB and AMD."""
        state = self.state()
        return self.update(policy=LAB_POLICY, measurement=launch_measurement(image).hex(), chain="lab",
                           current_tcb=dict(LAB_TCB), reported_tcb=dict(LAB_TCB), committed_tcb=dict(LAB_TCB),
                           launch_tcb=dict(LAB_TCB), tampered=[], signing_key=state.signing_key)

    # -- keys and certificates -------------------------------------------------------------
    def chain(self, state: Optional[PlatformState] = None) -> AMDChain:
        state = state or self.state()
        return (lab_chain if state.chain == "lab" else foreign_chain)(self.lab_state).ensure()

    def signing_key(self, state: PlatformState) -> ec.EllipticCurvePrivateKey:
        """The VCEK (or VLEK) of the chip at its reported TCB, derived from the chip's secret."""
        info = b"lab-snp-%s/%016x" % (state.signing_key.encode(), tcb_u64(state.reported_tcb))
        if state.chain != "lab":
            info += b"/" + state.chain.encode()
        seed = HKDF(algorithm=hashes.SHA384(), length=48, salt=None, info=info).derive(
            bytes.fromhex(state.chip_secret))
        order = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFC7634D81F4372DDF581A0DB248B0A77AECEC196ACCC52973
        return ec.derive_private_key(int.from_bytes(seed, "big") % (order - 1) + 1, ec.SECP384R1())

    def signer_cert(self, state: PlatformState) -> x509.Certificate:
        """The VCEK/VLEK certificate for the state's chip and reported TCB (issued once, kept in the platform's
        folder, as a host caches what AMD's key distribution service returned)."""
        path = self.folder / ("%s-%s-%016x.pem" % (state.signing_key, state.chain, tcb_u64(state.reported_tcb)))
        key = self.signing_key(state)
        if path.exists():
            cert = x509.load_pem_x509_certificate(path.read_bytes())
            if cert.public_key() == key.public_key():
                return cert
        chain = self.chain(state)
        if state.signing_key == "vcek":
            cert = chain.issue_vcek(key.public_key(), bytes.fromhex(state.chip_id), state.reported_tcb)
        else:
            cert = chain.issue_vlek(key.public_key(), state.reported_tcb, LAB_CSP_ID)
        self.folder.mkdir(parents=True, exist_ok=True)
        fileutil.atomic_write(str(path), cert.public_bytes(serialization.Encoding.PEM), 0o644)
        return cert

    # -- the report ----------------------------------------------------------------------
    def sign_report(self, report_data: bytes) -> Tuple[bytes, bytes]:
        """(the signed report, the extended report's certificate table) for ``report_data`` (64 bytes)."""
        if not isinstance(report_data, (bytes, bytearray)) or len(report_data) != 64:
            raise PlatformError("report_data: expected 64 bytes, got %r"
                                % (len(report_data) if isinstance(report_data, (bytes, bytearray))
                                   else type(report_data).__name__))
        state = self.state()
        body = build_report(state, bytes(report_data))
        der = self.signing_key(state).sign(body[:SIGNED_SIZE], ec.ECDSA(hashes.SHA384()))
        r, s = decode_dss_signature(der)
        report = body[:SIGNED_SIZE] + r.to_bytes(72, "little") + s.to_bytes(72, "little")
        report += bytes(REPORT_SIZE - len(report))
        chain = self.chain(state)
        signer = self.signer_cert(state).public_bytes(serialization.Encoding.DER)
        if state.signing_key == "vcek":
            table = cert_table([(GUID_VCEK, signer), (GUID_ASK, chain.cert_der("ask")),
                                (GUID_ARK, chain.cert_der("ark"))])
        else:
            table = cert_table([(GUID_VLEK, signer), (GUID_ASK, chain.cert_der("asvk")),
                                (GUID_ARK, chain.cert_der("ark"))])
        return report, table

    def hcl_report(self, runtime_data: bytes) -> bytes:
        """Azure's HCL report binding ``runtime_data`` (report_data = SHA-256(runtime data), zero-padded)."""
        report, _certs = self.sign_report(hashlib.sha256(bytes(runtime_data)).digest() + bytes(32))
        request = HCL_REQUEST.pack(HCL_REQUEST.size + len(runtime_data), 1, HCL_REPORT_TYPE_SNP, HCL_HASH_SHA256,
                                   len(runtime_data))
        total = HCL_HEADER.size + len(report) + len(request) + len(runtime_data)
        return HCL_HEADER.pack(HCL_SIGNATURE, HCL_VERSION, total, HCL_REQUEST_AK_CERT, 0) + report + request \
            + bytes(runtime_data)


def build_report(state: PlatformState, report_data: bytes) -> bytes:
    """The report's signed part (0x2A0 bytes) in AMD's layout, followed by zeros where the signature goes."""
    data = bytearray(REPORT_SIZE)
    struct.pack_into("<IIQ", data, 0x00, state.version, state.guest_svn, state.policy)
    # 0x10 FAMILY_ID and 0x20 IMAGE_ID (16 bytes each): zero, no ID block.
    struct.pack_into("<IIQQ", data, 0x30, state.vmpl, SIGNATURE_ALGO_ECDSA_P384_SHA384,
                     tcb_u64(state.current_tcb), PLATFORM_INFO_SMT)
    signer_info = SIGNING_KEYS[state.signing_key] << 2 | (2 if state.mask_chip_id else 0)  # no author key
    struct.pack_into("<I", data, 0x48, signer_info)
    data[0x50:0x90] = report_data
    data[0x90:0xC0] = bytes.fromhex(state.measurement)
    data[0xC0:0xE0] = bytes.fromhex(state.host_data)
    # 0xE0 ID_KEY_DIGEST, 0x110 AUTHOR_KEY_DIGEST (48 bytes each): zero, no ID block.
    data[0x140:0x160] = bytes.fromhex(state.report_id)
    data[0x160:0x180] = b"\xff" * 32  # REPORT_ID_MA: no migration agent
    struct.pack_into("<Q", data, 0x180, tcb_u64(state.reported_tcb))
    if state.version >= 3:
        data[0x188:0x18B] = bytes(MILAN_CPUID)
    if not state.mask_chip_id:
        data[0x1A0:0x1E0] = bytes.fromhex(state.chip_id)
    struct.pack_into("<Q", data, 0x1E0, tcb_u64(state.committed_tcb))
    firmware = bytes([LAB_FIRMWARE["build"], LAB_FIRMWARE["minor"], LAB_FIRMWARE["major"]])
    data[0x1E8:0x1EB] = firmware  # current build, minor, major
    data[0x1EC:0x1EF] = firmware  # committed
    struct.pack_into("<Q", data, 0x1F0, tcb_u64(state.launch_tcb))
    # 0x1F8 LAUNCH_MIT_VECTOR, 0x200 CURRENT_MIT_VECTOR (version 5): zero, no mitigation applied.
    return bytes(data)


def cert_table(entries) -> bytes:
    """The extended report's certificate table: (GUID, offset, length) entries, a zero entry, the certificates."""
    offset = CERT_ENTRY.size * (len(entries) + 1)
    header, blobs = b"", b""
    for guid, der in entries:
        header += CERT_ENTRY.pack(guid.bytes, offset + len(blobs), len(der))
        blobs += der
    return header + CERT_ENTRY.pack(bytes(16), 0, 0) + blobs


# -- the API the variants and their tests use ----------------------------------------------------
def platform_of(host: Host) -> SNPPlatform:
    return SNPPlatform(host.dir, host.state_dir)


def sign_report(host: Host, report_data: bytes) -> Tuple[bytes, bytes]:
    """(report, certificate table) of ``host``'s platform for ``report_data`` (64 bytes)."""
    return platform_of(host).sign_report(report_data)


def hcl_report(host: Host, runtime_data: bytes) -> bytes:
    """Azure's HCL report of ``host``'s platform for ``runtime_data``."""
    return platform_of(host).hcl_report(runtime_data)


# -- the socket service ---------------------------------------------------------------------
def answer(platform: SNPPlatform, line: bytes) -> dict:
    """The reply to one request line (never raises)."""
    try:
        request = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {"error": "request: expected one JSON object on one line"}
    if not isinstance(request, dict) or set(request) != {"report_data"}:
        return {"error": "request: expected {\"report_data\": \"<128 hex>\"}"}
    value = request["report_data"]
    try:
        report_data = bytes.fromhex(value) if isinstance(value, str) and len(value) == 128 else None
    except ValueError:
        report_data = None
    if report_data is None:
        return {"error": "report_data: expected 128 hex digits (64 bytes), got %r" % (value if not isinstance(
            value, str) else value[:140])}
    try:
        report, certs = platform.sign_report(report_data)
    except Exception as err:  # pylint: disable=broad-except  # the service outlives any one request
        return {"error": "platform: %s" % err}
    return {"report": base64.b64encode(report).decode(), "certs": base64.b64encode(certs).decode()}


class _Handler(socketserver.StreamRequestHandler):
    def handle(self):
        self.request.settimeout(SOCKET_TIMEOUT)
        try:
            line = self.rfile.readline(MAX_REQUEST + 1)
        except (OSError, socket.timeout):
            return
        if len(line) > MAX_REQUEST:
            reply = {"error": "request: longer than %d bytes" % MAX_REQUEST}
        else:
            reply = answer(self.server.platform, line.strip())
        try:
            self.wfile.write(json.dumps(reply).encode() + b"\n")
        except OSError:
            pass


class PlatformServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, socket_path: Path, platform: SNPPlatform):
        self.platform = platform
        socket_path = Path(socket_path)
        if socket_path.exists() or socket_path.is_symlink():
            socket_path.unlink()
        super().__init__(str(socket_path), _Handler)
        os.chmod(str(socket_path), 0o600)


def serve(socket_path: Path, platform: SNPPlatform) -> PlatformServer:
    """A server on ``socket_path`` answering in a thread (tests); ``.shutdown()`` and ``.server_close()`` end it."""
    server = PlatformServer(socket_path, platform)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def request(socket_path: Path, report_data: bytes, timeout: float = SOCKET_TIMEOUT) -> Tuple[bytes, bytes]:
    """A client of the service (what ``snp_report_source: unix:<path>`` does): (report, certificate table)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(socket_path))
        sock.sendall(json.dumps({"report_data": bytes(report_data).hex()}).encode() + b"\n")
        reply = json.loads(sock.makefile("rb").readline(1 << 20))
    if "error" in reply:
        raise PlatformError(reply["error"])
    return base64.b64decode(reply["report"]), base64.b64decode(reply["certs"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.snp_platform", description="a lab host's SEV-SNP platform")
    p.add_argument("--host-dir", required=True)
    p.add_argument("--lab-state", required=True)
    args = p.parse_args(argv)
    platform = SNPPlatform(Path(args.host_dir), Path(args.lab_state))
    platform.state()
    platform.chain().ensure()
    server = PlatformServer(platform.socket_path, platform)
    fileutil.atomic_write(str(platform.pid_path), b"%d\n" % os.getpid(), 0o644)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
