# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""TCG PC Client crypto-agile event log: parse, replay the SHA-256 bank, check against a quote.

Layout (TCG PC Client Platform Firmware Profile, "Spec ID Event03"): a first event in the old
SHA-1 format whose data is the TCG_EfiSpecIDEvent (algorithm list and digest sizes), then
TCG_PCR_EVENT2 records ``pcrIndex, eventType, count, {algId, digest}*, eventSize, event``,
all little-endian. EV_NO_ACTION records are not extended; a StartupLocality record sets the
initial value of PCR 0.

What is checked (as go-tpm-tools' replay does for the PCRs it covers): every PCR that has
events in the log must replay to the quoted value. PCRs without events are not constrained by
the log (PCR 15 is extended at runtime by the node lock and is in no firmware log).
We do not interpret events into a machine state (secure boot variables, grub commands):
the measurements policy is what constrains those values.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError

EV_NO_ACTION = 0x00000003
EV_SEPARATOR = 0x00000004
EV_POST_CODE = 0x00000001
EV_IPL = 0x0000000D
EV_EFI_BOOT_SERVICES_APPLICATION = 0x80000003
EV_EVENT_TAG = 0x00000006
EV_EFI_VARIABLE_DRIVER_CONFIG = 0x80000001
EV_EFI_ACTION = 0x80000007
_SPEC_ID = b"Spec ID Event03\x00"
_STARTUP_LOCALITY = b"StartupLocality\x00"
_SHA256 = 0x000B
_SHA1 = 0x0004
_MAX_EVENTS = 100000
_MAX_DIGESTS = 16


@dataclass(frozen=True)
class Event:
    pcr: int
    event_type: int
    digests: Dict[int, bytes]  # TPM alg id -> digest
    data: bytes


class _Reader:
    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def take(self, size: int, what: str) -> bytes:
        if size < 0 or self.pos + size > len(self.data):
            raise AttestationError("event log is truncated (reading %s at offset %d)" % (what, self.pos))
        chunk = self.data[self.pos:self.pos + size]
        self.pos += size
        return chunk

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def u16(self, what: str) -> int:
        return struct.unpack("<H", self.take(2, what))[0]

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def done(self) -> bool:
        return self.pos >= len(self.data)


def parse(raw: bytes) -> Tuple[Dict[int, int], List[Event]]:
    """Returns ({alg id: digest size}, events). Refuses a log that is not crypto-agile."""
    reader = _Reader(raw)
    pcr = reader.u32("header pcrIndex")
    event_type = reader.u32("header eventType")
    reader.take(20, "header SHA-1 digest")
    header = _Reader(reader.take(reader.u32("header eventSize"), "header event"))
    if pcr != 0 or event_type != EV_NO_ACTION or header.take(16, "Spec ID signature") != _SPEC_ID:
        raise AttestationError("event log is not a crypto-agile TCG log (no \"Spec ID Event03\" header); "
                               "SHA-1-only logs are not accepted")
    header.u32("platformClass")
    header.take(4, "spec version, errata, uintnSize")
    count = header.u32("numberOfAlgorithms")
    if not 0 < count <= _MAX_DIGESTS:
        raise AttestationError("event log header lists %d algorithms" % count)
    sizes: Dict[int, int] = {}
    for _attempt in range(count):
        alg = header.u16("algorithmId")
        sizes[alg] = header.u16("digestSize")
    if _SHA256 not in sizes:
        raise AttestationError("event log has no SHA-256 digests")
    events: List[Event] = []
    while not reader.done():
        if len(events) >= _MAX_EVENTS:
            raise AttestationError("event log has more than %d events" % _MAX_EVENTS)
        pcr = reader.u32("pcrIndex")
        event_type = reader.u32("eventType")
        n_digests = reader.u32("digest count")
        if n_digests > _MAX_DIGESTS:
            raise AttestationError("event %d lists %d digests" % (len(events), n_digests))
        digests: Dict[int, bytes] = {}
        for _attempt in range(n_digests):
            alg = reader.u16("digest algorithmId")
            if alg not in sizes:
                raise AttestationError("event %d uses algorithm 0x%04x not declared in the header" % (len(events), alg))
            digests[alg] = reader.take(sizes[alg], "digest")
        data = reader.take(reader.u32("eventSize"), "event data")
        if pcr >= 24:
            raise AttestationError("event %d names PCR %d" % (len(events), pcr))
        events.append(Event(pcr, event_type, digests, data))
    return sizes, events


def replay(events: Iterable[Event]) -> Dict[int, bytes]:
    """SHA-256 PCR values the events produce, for the PCRs that have events."""
    values: Dict[int, bytes] = {}
    for number, event in enumerate(events):
        if event.event_type == EV_NO_ACTION:
            if event.pcr == 0 and event.data.startswith(_STARTUP_LOCALITY) and len(event.data) > 16:
                values[0] = bytes(31) + event.data[16:17]
            continue
        digest = event.digests.get(_SHA256)
        if digest is None:
            raise AttestationError("event %d (PCR %d) has no SHA-256 digest" % (number, event.pcr))
        values[event.pcr] = hashlib.sha256(values.get(event.pcr, bytes(32)) + digest).digest()
    return values


def replay_and_check(raw: bytes, quoted: Mapping[int, bytes]) -> Dict[int, bytes]:
    """Replays the log and requires each PCR it covers to equal the quoted value."""
    _sizes, events = parse(raw)
    replayed = replay(events)
    for index in sorted(replayed):
        if index not in quoted:
            raise AttestationError("event log has events for PCR %d, which the quote does not cover" % index)
        if replayed[index] != quoted[index]:
            raise AttestationError("event log replay: PCR %d replays to %s, quoted %s"
                                   % (index, replayed[index].hex(), quoted[index].hex()))
    return replayed


def build(events: Iterable[Tuple[int, int, bytes, Optional[bytes]]]) -> bytes:
    """A crypto-agile log with SHA-256 digests: (pcr, event_type, data, digest or None=SHA-256(data)).

    The lab writes one for its simulated boot, so issuers carry a log that replays to the PCRs."""
    spec = (_SPEC_ID + struct.pack("<I", 0) + bytes([0, 2, 0, 2]) + struct.pack("<I", 1)
            + struct.pack("<HH", _SHA256, 32) + b"\x00")
    out = [struct.pack("<II", 0, EV_NO_ACTION) + bytes(20) + struct.pack("<I", len(spec)) + spec]
    for pcr, event_type, data, digest in events:
        digest = digest if digest is not None else hashlib.sha256(data).digest()
        out.append(struct.pack("<III", pcr, event_type, 1) + struct.pack("<H", _SHA256) + digest
                   + struct.pack("<I", len(data)) + data)
    return b"".join(out)
