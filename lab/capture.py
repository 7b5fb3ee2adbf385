# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What crosses the lab's underlay: ``tcpdump`` on the bridge ``br0`` (the bridge namespace ``cl-<lab>-br``),
which every frame between two hosts passes, as a wire tap between real machines would see it.

``UnderlayCapture(lab)`` is a context manager: it starts tcpdump (``-U -w <pcap>``, privileges kept so it can
write into the lab's state) and returns once tcpdump listens; leaving it stops tcpdump (SIGINT, so the file is
complete) and reads the file. ``packets`` are the frames decoded by ``read_pcap`` (Ethernet, ARP, IPv4 with UDP,
TCP, ICMP; IPv6 by addresses), and the questions a test asks are functions of them:

- ``with_addresses_in(packets, network)``: frames whose headers (IP source or destination, ARP sender or target)
  name an address inside ``network`` - a pod address in the clear;
- ``not_wireguard(packets, port)``: IP frames between two hosts that are not UDP to or from WireGuard's port;
- ``contains_bytes(packets, data)``: frames whose bytes contain ``data`` anywhere (a payload in the clear).
"""

from __future__ import annotations

import ipaddress
import os
import signal
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from lab.names import LabError

PCAP_MAGIC = {b"\xd4\xc3\xb2\xa1": "<", b"\xa1\xb2\xc3\xd4": ">",  # microseconds
              b"\x4d\x3c\xb2\xa1": "<", b"\xa1\xb2\x3c\x4d": ">"}  # nanoseconds
LINKTYPE_ETHERNET = 1
ETH_IPV4, ETH_ARP, ETH_IPV6, ETH_VLAN = 0x0800, 0x0806, 0x86DD, 0x8100
IP_PROTOCOLS = {1: "icmp", 6: "tcp", 17: "udp", 58: "icmp6"}
WIREGUARD_PORT = 51820
UNDERLAY_IFACE = "br0"


@dataclass(frozen=True)
class Packet:
    """One frame on the underlay: ``kind`` is arp, ipv4, ipv6 or the EtherType in hex; ``proto`` udp, tcp, icmp,
    ... or the IP protocol number; ports 0 where there are none."""

    kind: str
    src: str = ""
    dst: str = ""
    proto: str = ""
    sport: int = 0
    dport: int = 0
    length: int = 0
    data: bytes = b""

    def addresses(self) -> List[str]:
        return [a for a in (self.src, self.dst) if a]

    def __str__(self) -> str:
        ports = ":%d > %s:%d" % (self.sport, self.dst, self.dport) if self.sport or self.dport else " > %s" % self.dst
        return "%s %s %s%s (%d bytes)" % (self.kind, self.proto, self.src, ports, self.length)


def _decode(frame: bytes, length: int) -> Packet:
    if len(frame) < 14:
        return Packet("short", length=length, data=frame)
    ethertype = struct.unpack("!H", frame[12:14])[0]
    offset = 14
    if ethertype == ETH_VLAN and len(frame) >= 18:
        ethertype, offset = struct.unpack("!H", frame[16:18])[0], 18
    body = frame[offset:]
    if ethertype == ETH_ARP and len(body) >= 28:
        return Packet("arp", str(ipaddress.IPv4Address(body[14:18])), str(ipaddress.IPv4Address(body[24:28])),
                      "arp", length=length, data=frame)
    if ethertype == ETH_IPV4 and len(body) >= 20:
        ihl = (body[0] & 0x0F) * 4
        proto_number = body[9]
        proto = IP_PROTOCOLS.get(proto_number, str(proto_number))
        sport = dport = 0
        if proto in ("udp", "tcp") and len(body) >= ihl + 4:
            sport, dport = struct.unpack("!HH", body[ihl:ihl + 4])
        return Packet("ipv4", str(ipaddress.IPv4Address(body[12:16])), str(ipaddress.IPv4Address(body[16:20])),
                      proto, sport, dport, length, frame)
    if ethertype == ETH_IPV6 and len(body) >= 40:
        proto = IP_PROTOCOLS.get(body[6], str(body[6]))
        sport = dport = 0
        if proto in ("udp", "tcp") and len(body) >= 44:
            sport, dport = struct.unpack("!HH", body[40:44])
        return Packet("ipv6", str(ipaddress.IPv6Address(body[8:24])), str(ipaddress.IPv6Address(body[24:40])),
                      proto, sport, dport, length, frame)
    return Packet("0x%04x" % ethertype, length=length, data=frame)


def read_pcap(path: Path) -> List[Packet]:
    """The frames of a pcap file (tcpdump -w); LabError for another format or link type."""
    raw = Path(path).read_bytes()
    if len(raw) < 24 or raw[:4] not in PCAP_MAGIC:
        raise LabError("%s: not a pcap file (%d bytes)" % (path, len(raw)))
    order = PCAP_MAGIC[raw[:4]]
    linktype = struct.unpack(order + "I", raw[20:24])[0]
    if linktype != LINKTYPE_ETHERNET:
        raise LabError("%s: link type %d, expected Ethernet (1)" % (path, linktype))
    packets, offset = [], 24
    while offset + 16 <= len(raw):
        caplen, origlen = struct.unpack(order + "II", raw[offset + 8:offset + 16])
        frame = raw[offset + 16:offset + 16 + caplen]
        offset += 16 + caplen
        packets.append(_decode(frame, origlen))
    return packets


def with_addresses_in(packets: List[Packet], network: str) -> List[Packet]:
    """The frames whose header addresses (IP or ARP) lie inside ``network``."""
    net = ipaddress.ip_network(network)
    out = []
    for packet in packets:
        for address in packet.addresses():
            ip = ipaddress.ip_address(address)
            if ip.version == net.version and ip in net:
                out.append(packet)
                break
    return out


def not_wireguard(packets: List[Packet], port: int = WIREGUARD_PORT) -> List[Packet]:
    """The IP frames that are not UDP from or to WireGuard's ``port`` (ARP and IPv6 neighbour discovery aside)."""
    return [p for p in packets if p.kind == "ipv4" and not (p.proto == "udp" and port in (p.sport, p.dport))]


def contains_bytes(packets: List[Packet], data: bytes) -> List[Packet]:
    return [p for p in packets if data in p.data]


class UnderlayCapture:
    """tcpdump on the lab's underlay bridge while the ``with`` block runs; ``packets`` afterwards.

    ``bpf``: a tcpdump filter expression (None: every frame). ``path``: the pcap file (default
    ``<lab state>/capture-<n>.pcap``; it stays for a look with ``tcpdump -r``)."""

    def __init__(self, lab, path: Optional[Path] = None, bpf: Optional[str] = None, iface: str = UNDERLAY_IFACE):
        self.lab = lab
        self.iface = iface
        self.bpf = bpf
        if path is None:
            n = 1
            while (Path(lab.state_dir) / ("capture-%d.pcap" % n)).exists():
                n += 1
            path = Path(lab.state_dir) / ("capture-%d.pcap" % n)
        self.path = Path(path)
        self.proc: Optional[subprocess.Popen] = None
        self.packets: List[Packet] = []

    def start(self, timeout: float = 10.0) -> "UnderlayCapture":
        argv = ["ip", "netns", "exec", self.lab.bridge_netns, "tcpdump", "-i", self.iface, "-n", "-U", "--immediate-mode",
                "-Z", "root",
                "-w", str(self.path)] + ([self.bpf] if self.bpf else [])
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # tcpdump says "listening on br0" once its socket is bound: nothing before that is missed after start().
        deadline = time.monotonic() + timeout
        line = b""
        os.set_blocking(self.proc.stderr.fileno(), False)
        while time.monotonic() < deadline:
            chunk = self.proc.stderr.read() or b""
            line += chunk
            if b"listening on" in line:
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        self._kill()
        raise LabError("tcpdump on %s of %s did not start: %s"
                       % (self.iface, self.lab.bridge_netns, line.decode(errors="replace").strip()))

    def stop(self, settle: float = 0.3, timeout: float = 5.0) -> List[Packet]:
        """Stops tcpdump once its file has not grown for ``settle`` seconds (frames still on their way are in
        it), at most after ``timeout``; returns the frames."""
        deadline, size, since = time.monotonic() + timeout, -1, time.monotonic()
        while self.proc is not None and time.monotonic() < deadline:
            now = self.path.stat().st_size if self.path.exists() else 0
            if now != size:
                size, since = now, time.monotonic()
            elif time.monotonic() - since >= settle:
                break
            time.sleep(0.05)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._kill()
        if self.proc is not None:
            self.proc.stderr.close()
        self.proc = None
        self.packets = read_pcap(self.path) if self.path.exists() else []
        return self.packets

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)

    def __enter__(self) -> "UnderlayCapture":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
