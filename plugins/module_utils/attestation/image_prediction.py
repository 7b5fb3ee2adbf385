# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node image's boot-chain PCRs, predicted at build time from its UKI (docs/image.md, "Predicted measurements").

API (plain Python; runs on the build host or the controller, never on a node)::

    prediction = predict(uki_path, firmware=OVMF_2022_11, runner=None)   # -> Prediction
    prediction.values()            # {4: bytes, 7: bytes, 9: bytes, 11: bytes}, SHA-256 bank
    prediction.pcrs[4].events      # (Event(pcr, type, digest, description, data), ...) in measurement order
    prediction.to_dict()           # JSON-able: each PCR's value and events, the digests and versions it used
    doc = document(prediction, name, version=None, base=None)  # MeasurementSets: set ``name``: PCRs 4/7/9/11, 13 = 0
                                                  # (base: the document in force, its sets kept: an upgrade)
    write_signed(doc, path, priv_key)             # path + path.sig (signature.sign_blob, as measurements_signature)
    keep_document(doc, path, priv_key, check_mode)   # the same, unless path holds it already (image_measurements)
    image_set(prediction)                         # the set alone (a Measurements)
    authenticode_digest(pe_bytes)                 # the PE image digest the firmware measures
    uki_sections(uki_bytes)                       # {".linux": bytes, ".osrel": ..., ".cmdline": ..., ".initrd": ...}

Every input error is an ``InputError`` naming the file (``uki``, ``uki .linux``) and what was expected; a PCR 11
that ``systemd-measure`` computes differently from the replay of the events listed here is a ConstellationError.

What the prediction is valid for (``FirmwareProfile``, ``Prediction.stub``): PCR 7 depends on the firmware (OVMF
2022.11, Secure Boot off, no keys enrolled); PCR 4 on the systemd-stub inside the UKI (systemd-boot-efi 252 also
has the firmware measure the kernel it starts) and on booting the UKI as the first boot option's application.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import signature
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.eventlog import (
    EV_EFI_ACTION, EV_EFI_BOOT_SERVICES_APPLICATION, EV_EFI_VARIABLE_DRIVER_CONFIG, EV_EVENT_TAG, EV_IPL, EV_SEPARATOR)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    Measurement, Measurements, MeasurementSets, check_set_name, extend_digest)
from ansible_collections.constellation.cluster.plugins.module_utils.command import CommandRunner
from ansible_collections.constellation.cluster.plugins.module_utils.constants import PCR_INDEX_AGENT
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError
from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_write

# The TCG PC Client Platform Firmware Profile's names of the event types predicted here.
EVENT_TYPE_NAMES = {
    EV_SEPARATOR: "EV_SEPARATOR", EV_IPL: "EV_IPL", EV_EVENT_TAG: "EV_EVENT_TAG",
    EV_EFI_VARIABLE_DRIVER_CONFIG: "EV_EFI_VARIABLE_DRIVER_CONFIG", EV_EFI_ACTION: "EV_EFI_ACTION",
    EV_EFI_BOOT_SERVICES_APPLICATION: "EV_EFI_BOOT_SERVICES_APPLICATION",
}
# Not an event-log record: systemd-pcrphase (systemd 252) extends PCR 11 without logging it.
PCR_PHASE_EXTEND = "systemd-pcrphase"

PREDICTED_PCRS = (4, 7, 9, 11)
SYSTEMD_MEASURE = "/usr/lib/systemd/systemd-measure"
# The boot phases systemd-pcrphase extends PCR 11 with before the agent starts (After=systemd-pcrphase.service).
BOOT_PHASES = ("enter-initrd", "leave-initrd", "sysinit", "ready")
# The UKI sections systemd-stub 252 measures into PCR 11, in its order, and systemd-measure's option for each.
STUB_SECTIONS = ((".linux", "linux"), (".osrel", "osrel"), (".cmdline", "cmdline"), (".initrd", "initrd"),
                 (".splash", "splash"), (".dtb", "dtb"), (".pcrpkey", "pcrpkey"))
REQUIRED_SECTIONS = (".linux", ".osrel", ".cmdline", ".initrd")
CALLING_EFI_APPLICATION = b"Calling EFI Application from Boot Option"
SEPARATOR_DATA = bytes(4)  # EV_SEPARATOR's data: a UINT32 0 (no error)
MAX_UKI = 1024 * 1024 * 1024
MAX_CMDLINE = 64 * 1024

# PE/COFF offsets (Microsoft PE Format; "Windows Authenticode Portable Executable Signature Format").
_PE32, _PE32_PLUS = 0x10B, 0x20B
_DIRECTORY_SECURITY = 4
_SECTION_HEADER = 40


def _guid(text: str) -> bytes:
    """An EFI_GUID in its in-memory (mixed-endian) byte order."""
    parts = text.split("-")
    return (struct.pack("<IHH", int(parts[0], 16), int(parts[1], 16), int(parts[2], 16))
            + bytes.fromhex(parts[3] + parts[4]))


EFI_GLOBAL_VARIABLE = _guid("8be4df61-93ca-11d2-aa0d-00e098032b8c")
EFI_IMAGE_SECURITY_DATABASE_GUID = _guid("d719b2cb-3d3a-4596-a3bc-dad00e67656f")


@dataclass(frozen=True)
class SecureVariable:
    """A Secure Boot policy variable as the firmware measures it into PCR 7 (``data``: its content, b"" when the
    variable does not exist - the firmware then measures it with a zero data length)."""

    name: str
    vendor: bytes
    data: bytes = b""

    def uefi_variable_data(self) -> bytes:
        """UEFI_VARIABLE_DATA: VariableName GUID, UINT64 UnicodeNameLength (characters, no NUL), UINT64
        VariableDataLength, the name in UTF-16LE without NUL, the data."""
        name = self.name.encode("utf-16-le")
        return self.vendor + struct.pack("<QQ", len(self.name), len(self.data)) + name + self.data


@dataclass(frozen=True)
class FirmwareProfile:
    """What the prediction of PCR 7 assumes about the firmware: its name and version, Secure Boot off or on, and
    the policy variables it measures, in its order."""

    name: str
    secure_boot: bool
    variables: Tuple[SecureVariable, ...]
    description: str = ""


# Debian 12's ovmf 2022.11 (OVMF_CODE_4M.fd with a fresh OVMF_VARS_4M.fd): Secure Boot off, no key enrolled. Its
# Tcg2Dxe measures SecureBoot (one byte, 0), PK, KEK, db and dbx (absent: empty) and then the PCR 7 separator.
OVMF_2022_11 = FirmwareProfile(
    "ovmf-2022.11", False,
    (SecureVariable("SecureBoot", EFI_GLOBAL_VARIABLE, b"\x00"),
     SecureVariable("PK", EFI_GLOBAL_VARIABLE),
     SecureVariable("KEK", EFI_GLOBAL_VARIABLE),
     SecureVariable("db", EFI_IMAGE_SECURITY_DATABASE_GUID),
     SecureVariable("dbx", EFI_IMAGE_SECURITY_DATABASE_GUID)),
    "Debian 12 ovmf 2022.11 (OVMF_CODE_4M.fd, fresh OVMF_VARS_4M.fd): Secure Boot off, no keys enrolled")
FIRMWARE_PROFILES = {OVMF_2022_11.name: OVMF_2022_11}


@dataclass(frozen=True)
class Event:
    """One extend of a predicted PCR: ``digest`` is what is extended; ``data`` the event data when the digest is
    its SHA-256 (shown as hex), else b"" (a file's digest: ``description`` names the file)."""

    pcr: int
    type: str
    digest: bytes
    description: str
    data: bytes = b""

    def to_dict(self) -> Dict[str, object]:
        out: Dict[str, object] = {"pcr": self.pcr, "type": self.type, "digest": self.digest.hex(),
                                  "description": self.description}
        if self.data:
            out["data"] = self.data.hex()
        return out


def replay(events: Sequence[Event]) -> bytes:
    """The SHA-256 PCR value the events extend a zero PCR to."""
    value = bytes(32)
    for event in events:
        value = extend_digest(value, event.digest)
    return value


@dataclass(frozen=True)
class PCRPrediction:
    index: int
    value: bytes
    events: Tuple[Event, ...]

    def to_dict(self) -> Dict[str, object]:
        return {"value": self.value.hex(), "events": [event.to_dict() for event in self.events]}


@dataclass(frozen=True)
class Prediction:
    """The predicted PCRs of one UKI under one firmware profile, and what they were computed from."""

    pcrs: Dict[int, PCRPrediction]
    firmware: FirmwareProfile
    stub: str
    systemd_measure: str
    uki_sha256: bytes
    uki_authenticode: bytes
    kernel_authenticode: bytes
    cmdline: str
    sections: Dict[str, bytes] = field(default_factory=dict)  # section name -> SHA-256 of its content

    def values(self) -> Dict[int, bytes]:
        return {index: pcr.value for index, pcr in sorted(self.pcrs.items())}

    def to_dict(self) -> Dict[str, object]:
        return {
            "firmware": {"name": self.firmware.name, "secure_boot": self.firmware.secure_boot,
                         "description": self.firmware.description},
            "stub": self.stub,
            "systemd_measure": self.systemd_measure,
            "uki": {"sha256": self.uki_sha256.hex(), "authenticode_sha256": self.uki_authenticode.hex()},
            "kernel": {"authenticode_sha256": self.kernel_authenticode.hex()},
            "sections": {name: digest.hex() for name, digest in self.sections.items()},
            "cmdline": self.cmdline,
            "pcrs": {str(index): pcr.to_dict() for index, pcr in sorted(self.pcrs.items())},
        }


# --- PE/COFF ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Section:
    name: str
    virtual_size: int
    raw_size: int
    raw_pointer: int


@dataclass(frozen=True)
class PEImage:
    """The parts of a PE/COFF file the Authenticode digest and the UKI sections need, bounds-checked."""

    checksum_offset: int
    security_entry_offset: Optional[int]  # the Certificate Table directory entry, None when there is none
    certificate_size: int
    size_of_headers: int
    sections: Tuple[Section, ...]


def _u16(data: bytes, offset: int) -> int:
    return struct.unpack_from("<H", data, offset)[0]


def _u32(data: bytes, offset: int) -> int:
    return struct.unpack_from("<I", data, offset)[0]


def parse_pe(data: bytes, what: str = "uki") -> PEImage:
    """Parses the headers of a PE/COFF image; InputError naming ``what`` for anything malformed."""
    data = bytes(data)

    def bad(expected: str, got: object = None) -> InputError:
        return InputError(what, "a PE/COFF image (%s)" % expected, got)

    if len(data) < 64 or data[:2] != b"MZ":
        raise bad("an MZ header", "%d bytes starting %r" % (len(data), data[:2]))
    pe_offset = _u32(data, 0x3C)
    if pe_offset + 24 > len(data) or data[pe_offset:pe_offset + 4] != b"PE\x00\x00":
        raise bad("a PE signature at e_lfanew", "offset %d" % pe_offset)
    coff = pe_offset + 4
    section_count = _u16(data, coff + 2)
    optional_size = _u16(data, coff + 16)
    optional = coff + 20
    if section_count == 0 or optional_size < 2 or optional + optional_size > len(data):
        raise bad("sections and an optional header inside the file",
                  "%d sections, optional header of %d bytes" % (section_count, optional_size))
    magic = _u16(data, optional)
    if magic not in (_PE32, _PE32_PLUS):
        raise bad("optional header magic 0x10b or 0x20b", "0x%x" % magic)
    count_offset, directory = (optional + 92, optional + 96) if magic == _PE32 else (optional + 108, optional + 112)
    if directory > optional + optional_size:
        raise bad("an optional header holding its data directories", "%d bytes" % optional_size)
    size_of_headers = _u32(data, optional + 60)
    directory_count = _u32(data, count_offset)
    if directory_count > 16 or directory + 8 * directory_count > optional + optional_size:
        raise bad("at most 16 data directories inside the optional header", directory_count)
    security_entry = None
    certificate_size = 0
    if directory_count > _DIRECTORY_SECURITY:
        security_entry = directory + 8 * _DIRECTORY_SECURITY
        cert_offset, certificate_size = struct.unpack_from("<II", data, security_entry)
        if certificate_size and (cert_offset < size_of_headers or cert_offset + certificate_size != len(data)):
            raise bad("a certificate table at the end of the file",
                      "offset %d, %d bytes in a file of %d" % (cert_offset, certificate_size, len(data)))
    table = optional + optional_size
    table_end = table + _SECTION_HEADER * section_count
    if not table_end <= size_of_headers <= len(data):
        raise bad("a section table inside SizeOfHeaders inside the file",
                  "section table ends at %d, SizeOfHeaders %d, file %d bytes" % (table_end, size_of_headers,
                                                                                 len(data)))
    sections = []
    for number in range(section_count):
        name, virtual_size, _address, raw_size, raw_pointer = struct.unpack_from("<8sIIII", data,
                                                                                 table + number * _SECTION_HEADER)
        label = name.rstrip(b"\x00").decode("ascii", "replace")
        if raw_size and (raw_pointer < size_of_headers or raw_pointer + raw_size > len(data) - certificate_size):
            raise bad("section %s inside the file after the headers" % label,
                      "raw data at %d, %d bytes, file %d bytes" % (raw_pointer, raw_size, len(data)))
        sections.append(Section(label, virtual_size, raw_size, raw_pointer))
    ordered = sorted((s for s in sections if s.raw_size), key=lambda s: s.raw_pointer)
    for first, second in zip(ordered, ordered[1:]):
        if first.raw_pointer + first.raw_size > second.raw_pointer:
            raise bad("sections whose raw data do not overlap", "%s and %s" % (first.name, second.name))
    return PEImage(optional + 64, security_entry, certificate_size, size_of_headers, tuple(sections))


def authenticode_digest(data: bytes, what: str = "uki", algorithm: str = "sha256") -> bytes:
    """The PE image digest (Authenticode, PE/COFF "Calculating the PE Image Hash"), as edk2's measured boot
    computes it for EV_EFI_BOOT_SERVICES_APPLICATION: the headers without CheckSum and the Certificate Table entry,
    the sections by file offset, then what follows them except the certificate table."""
    data = bytes(data)
    image = parse_pe(data, what)
    digest = hashlib.new(algorithm)
    digest.update(data[:image.checksum_offset])
    if image.security_entry_offset is None:
        digest.update(data[image.checksum_offset + 4:image.size_of_headers])
    else:
        digest.update(data[image.checksum_offset + 4:image.security_entry_offset])
        digest.update(data[image.security_entry_offset + 8:image.size_of_headers])
    hashed = image.size_of_headers
    for section in sorted((s for s in image.sections if s.raw_size), key=lambda s: s.raw_pointer):
        digest.update(data[section.raw_pointer:section.raw_pointer + section.raw_size])
        hashed += section.raw_size
    end = len(data) - image.certificate_size
    if end > hashed:
        digest.update(data[hashed:end])
    return digest.digest()


def uki_sections(data: bytes, what: str = "uki") -> Dict[str, bytes]:
    """The contents of the sections systemd-stub measures (STUB_SECTIONS) that the UKI has, each its VirtualSize
    bytes, in the stub's order; InputError when a required one (REQUIRED_SECTIONS) is missing or doubled."""
    data = bytes(data)
    image = parse_pe(data, what)
    found: Dict[str, bytes] = {}
    known = dict(STUB_SECTIONS)
    for section in image.sections:
        if section.name not in known:
            continue
        if section.name in found:
            raise InputError(what, "one section %s" % section.name, "two")
        if section.virtual_size > section.raw_size:
            raise InputError("%s %s" % (what, section.name), "raw data covering its VirtualSize",
                             "VirtualSize %d, SizeOfRawData %d" % (section.virtual_size, section.raw_size))
        found[section.name] = data[section.raw_pointer:section.raw_pointer + section.virtual_size]
    missing = [name for name in REQUIRED_SECTIONS if name not in found]
    if missing:
        raise InputError(what, "a UKI with the sections %s" % ", ".join(REQUIRED_SECTIONS),
                         "no %s" % ", ".join(missing))
    return {name: found[name] for name, _option in STUB_SECTIONS if name in found}


def stub_version(data: bytes, what: str = "uki") -> str:
    """What the stub's .sdmagic section says (``#### LoaderInfo: systemd-stub 252.39-1~deb12u2 ####``), else ""."""
    data = bytes(data)
    for section in parse_pe(data, what).sections:
        if section.name == ".sdmagic":
            text = data[section.raw_pointer:section.raw_pointer + min(section.virtual_size, section.raw_size)]
            text = text.split(b"\x00")[0].decode("ascii", "replace").strip("# ")
            return text[len("LoaderInfo: "):] if text.startswith("LoaderInfo: ") else text
    return ""


def stub_cmdline(raw: bytes, what: str = "uki .cmdline") -> str:
    """The kernel command line the stub passes on: printable ASCII only, no trailing whitespace (stub versions
    differ in how they clean up control characters and a trailing newline, so the prediction refuses them)."""
    if len(raw) > MAX_CMDLINE:
        raise InputError(what, "at most %d bytes" % MAX_CMDLINE, len(raw))
    if any(byte < 0x20 or byte > 0x7E for byte in raw) or raw != raw.rstrip(b" "):
        bad = next((i for i, byte in enumerate(raw) if byte < 0x20 or byte > 0x7E), len(raw) - 1)
        raise InputError(what, "printable ASCII without control characters or trailing whitespace "
                         "(write the file without a newline)", "byte 0x%02x at offset %d" % (raw[bad], bad))
    return raw.decode("ascii")


# --- the PCRs --------------------------------------------------------------------------------------------------


def _name(event_type: int) -> str:
    return EVENT_TYPE_NAMES[event_type]


def separator(pcr: int) -> Event:
    return Event(pcr, _name(EV_SEPARATOR), hashlib.sha256(SEPARATOR_DATA).digest(), "separator", SEPARATOR_DATA)


def pcr4_events(uki_authenticode: bytes, kernel_authenticode: bytes) -> List[Event]:
    """PCR 4: the boot manager's action, the separator, the UKI the boot option starts, the kernel systemd-stub
    has the firmware load (LoadImage measures it again)."""
    return [
        Event(4, _name(EV_EFI_ACTION), hashlib.sha256(CALLING_EFI_APPLICATION).digest(),
              CALLING_EFI_APPLICATION.decode("ascii"), CALLING_EFI_APPLICATION),
        separator(4),
        Event(4, _name(EV_EFI_BOOT_SERVICES_APPLICATION), uki_authenticode, "the UKI (Authenticode SHA-256)"),
        Event(4, _name(EV_EFI_BOOT_SERVICES_APPLICATION), kernel_authenticode,
              "the UKI's .linux kernel (Authenticode SHA-256), loaded by systemd-stub"),
    ]


def pcr7_events(firmware: FirmwareProfile) -> List[Event]:
    """PCR 7 with Secure Boot off: each policy variable as UEFI_VARIABLE_DATA (EV_EFI_VARIABLE_DRIVER_CONFIG, digest
    the SHA-256 of that structure), then the separator. No EV_EFI_VARIABLE_AUTHORITY: nothing is verified."""
    if firmware.secure_boot:
        raise InputError("firmware", "a firmware profile with Secure Boot off (no db authority events predicted)",
                         firmware.name)
    events = []
    for variable in firmware.variables:
        blob = variable.uefi_variable_data()
        events.append(Event(7, _name(EV_EFI_VARIABLE_DRIVER_CONFIG), hashlib.sha256(blob).digest(),
                            "%s (%d bytes of data)" % (variable.name, len(variable.data)), blob))
    events.append(separator(7))
    return events


def pcr9_events(cmdline: str, initrd: Optional[bytes]) -> List[Event]:
    """PCR 9, extended by the Linux EFI stub: the load options systemd-stub gives it (the command line in
    UTF-16LE with its NUL), then the initrd it loads through LINUX_INITRD_MEDIA (when the UKI has one)."""
    options = (cmdline + "\x00").encode("utf-16-le")
    events = [Event(9, _name(EV_EVENT_TAG), hashlib.sha256(options).digest(),
                    "LOADED_IMAGE::LoadOptions: the .cmdline in UTF-16LE with its NUL")]
    if initrd is not None:
        events.append(Event(9, _name(EV_EVENT_TAG), hashlib.sha256(initrd).digest(), "Linux initrd: the .initrd"))
    return events


def pcr11_events(sections: Mapping[str, bytes], phases: Sequence[str] = BOOT_PHASES) -> List[Event]:
    """PCR 11: systemd-stub measures each section it knows (its name with NUL, then its content), then
    systemd-pcrphase extends each boot phase's name (no NUL)."""
    events = []
    for name, _option in STUB_SECTIONS:
        if name not in sections:
            continue
        label = (name + "\x00").encode("ascii")
        events.append(Event(11, _name(EV_IPL), hashlib.sha256(label).digest(), "section name %s" % name, label))
        events.append(Event(11, _name(EV_IPL), hashlib.sha256(sections[name]).digest(), "section %s" % name))
    for phase in phases:
        events.append(Event(11, PCR_PHASE_EXTEND, hashlib.sha256(phase.encode("ascii")).digest(),
                            "boot phase %s" % phase, phase.encode("ascii")))
    return events


def measure_pcr11(sections: Mapping[str, bytes], runner: Optional[CommandRunner] = None,
                  program: str = SYSTEMD_MEASURE, phases: Sequence[str] = BOOT_PHASES) -> Tuple[bytes, str]:
    """(PCR 11 after ``phases``, the tool's version line) as ``systemd-measure calculate`` computes it."""
    runner = runner or CommandRunner(timeout=300.0)
    version = runner.run([program, "--version"]).stdout.splitlines()[:1]
    with tempfile.TemporaryDirectory(prefix="image-prediction-") as workdir:
        argv = [program, "calculate", "--bank=sha256", "--json=short", "--phase=" + ":".join(phases)]
        for name, option in STUB_SECTIONS:
            if name in sections:
                path = os.path.join(workdir, option)
                with open(path, "wb") as handle:
                    handle.write(sections[name])
                argv.append("--%s=%s" % (option, path))
        output = runner.run(argv).stdout
    try:
        entries = json.loads(output)["sha256"]
        values = [bytes.fromhex(entry["hash"]) for entry in entries if entry.get("pcr") == 11]
    except (ValueError, KeyError, TypeError):
        raise ConstellationError("%s calculate: expected its JSON output, got %r" % (program, output[:200])) from None
    if len(values) != 1 or len(values[0]) != 32:
        raise ConstellationError("%s calculate: expected one SHA-256 PCR 11 value, got %r" % (program, output[:200]))
    return values[0], version[0] if version else ""


def predict(uki_path: str, firmware: FirmwareProfile = OVMF_2022_11, runner: Optional[CommandRunner] = None,
            systemd_measure: str = SYSTEMD_MEASURE) -> Prediction:
    """Predicts PCRs 4, 7, 9 and 11 of booting ``uki_path`` as the first boot option under ``firmware``."""
    try:
        with open(uki_path, "rb") as handle:
            data = handle.read(MAX_UKI + 1)
    except OSError as err:
        raise InputError("uki", "a readable UKI file", "%s (%s)" % (uki_path, err.strerror or type(err).__name__)) \
            from None
    if len(data) > MAX_UKI:
        raise InputError("uki", "at most %d bytes" % MAX_UKI, "%s: more" % uki_path)
    what = "uki %s" % uki_path
    uki_authenticode = authenticode_digest(data, what)
    sections = uki_sections(data, what)
    kernel_authenticode = authenticode_digest(sections[".linux"], what + " .linux")
    cmdline = stub_cmdline(sections[".cmdline"], what + " .cmdline")
    pcr11_value, measure_version = measure_pcr11(sections, runner, systemd_measure)
    events = {
        4: pcr4_events(uki_authenticode, kernel_authenticode),
        7: pcr7_events(firmware),
        9: pcr9_events(cmdline, sections.get(".initrd")),
        11: pcr11_events(sections),
    }
    pcrs = {index: PCRPrediction(index, replay(sequence), tuple(sequence)) for index, sequence in events.items()}
    if pcrs[11].value != pcr11_value:
        raise ConstellationError("PCR 11: %s computes %s, the replay of systemd-stub's and systemd-pcrphase's "
                                 "events %s (a systemd-measure that measures other sections?)"
                                 % (systemd_measure, pcr11_value.hex(), pcrs[11].value.hex()))
    return Prediction(pcrs, firmware, stub_version(data, what), measure_version, hashlib.sha256(data).digest(),
                      uki_authenticode, kernel_authenticode, cmdline,
                      {name: hashlib.sha256(content).digest() for name, content in sections.items()})


# --- the measurements document ---------------------------------------------------------------------------------


def image_set(prediction: Prediction) -> Measurements:
    """The accepted set of the image: the predicted PCRs 4, 7, 9, 11 and PCR 13 = 32 zero bytes, all enforced (an
    image's agent does not extend PCR 13, docs/image.md, "Predicted measurements")."""
    pcrs = {index: Measurement(value, False) for index, value in prediction.values().items()}
    pcrs[PCR_INDEX_AGENT] = Measurement(bytes(32), False)
    return Measurements(dict(sorted(pcrs.items())))


def document(prediction: Prediction, name: str, version: Optional[int] = None,
             base: Optional[MeasurementSets] = None) -> MeasurementSets:
    """The measurements document of the image: its set (``image_set``) named ``name``. With ``base`` (the document
    in force, for a rolling upgrade) its sets and agents are kept and the image's set added; a set of that name in
    ``base`` must be the same one. ``version``: default 0, or base's version + 1."""
    check_set_name(name, "name", "image set names")
    added = image_set(prediction)
    sets: Dict[str, Measurements] = dict(base.sets) if base is not None else {}
    if name in sets and sets[name] != added:
        raise InputError("name", "a set name the base document does not give other values (an image version names "
                         "one image)", name)
    sets[name] = added
    if version is None:
        version = base.version + 1 if base is not None else 0
    elif base is not None and version <= base.version and sets != base.sets:
        raise InputError("version", "a version above the base document's %d (agents refuse an older or equal one "
                         "that changes the sets)" % base.version, version)
    return MeasurementSets(sets, version, base.agents if base is not None else None)


def write_signed(doc: MeasurementSets, path: str, priv_key) -> Tuple[str, str]:
    """Writes ``doc`` to ``path`` and its detached signature (cosign sign-blob form, signature.sign_blob) to
    ``path.sig``, each atomically; returns both paths. ``priv_key``: signature.load_private_key_file's result."""
    text = doc.dumps().encode("utf-8")
    signed = (signature.sign_blob(priv_key, text) + "\n").encode("ascii")  # before anything is written
    sig_path = signature.signature_path(path)
    atomic_write(path, text, 0o644)
    atomic_write(sig_path, signed, 0o644)
    return path, sig_path


def keep_document(doc: MeasurementSets, path: str, priv_key=None, check_mode: bool = False) -> Dict[str, object]:
    """``doc`` at ``path``, signed with ``priv_key`` when given (``write_signed``), unless the file already holds
    exactly its bytes and, with a key, a signature by that key (ECDSA signatures are randomised: a valid one is
    kept). Without a key a signature file next to ``path`` is refused: it would no longer match. Returns
    ``{"changed", "measurements_file", "signature_file"}`` (signature_file None when unsigned)."""
    text = doc.dumps().encode("utf-8")
    sig_path = signature.signature_path(path)
    if priv_key is None and os.path.exists(sig_path):
        raise InputError("priv_key_file", "the signing key: %s would no longer match the document" % sig_path, None)
    try:
        with open(path, "rb") as handle:
            same = handle.read(len(text) + 1) == text
    except FileNotFoundError:
        same = False
    except OSError as err:
        raise InputError("dest", "a readable or absent file", "%s (%s)" % (path, err.strerror)) from None
    if same and priv_key is not None:
        try:
            signature.read_signed_file(path, priv_key.public_key())
        except ConstellationError:
            same = False
    result: Dict[str, object] = {"changed": not same, "measurements_file": path,
                                 "signature_file": sig_path if priv_key is not None else None}
    if same or check_mode:
        return result
    if priv_key is not None:
        write_signed(doc, path, priv_key)
    else:
        atomic_write(path, text, 0o644)
    return result
