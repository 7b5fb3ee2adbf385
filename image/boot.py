# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""``python -m image boot``: the image under QEMU as a cloud VM would run it - q35, OVMF (Secure Boot off), a
swtpm TPM 2.0 on the CRB interface whose EK certificate comes from the given CA (the lab CA in tests), the disk
read-only on virtio-blk, a per-node settings disk and a state disk (by serial), the agent's port forwarded to
127.0.0.1 and the serial console in a log file. TCG only (no nested KVM here); every wait has a hard timeout."""

from __future__ import annotations

import fcntl
import json
import shutil
import signal
import socket
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.agent.config import MAX_NODE_SETTINGS
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError

from image.contents import AGENT_PORT
from image.paths import NODE_SETTINGS_SERIAL, OVMF_CODE, OVMF_VARS, STATE_DISK_SERIAL
from image.run import ImageError
from lab.swtpm import SwTPM, free_port

STATE_DISK_BYTES = 64 * 1024 * 1024  # LUKS2 header (16 MiB) + dm-integrity: cryptsetup wipes it all under TCG
LOCK_PATH = "/tmp/qemu-image.lock"  # one QEMU at a time on this machine (flock)


def write_node_settings(path: Path, settings: Dict[str, Any]) -> Path:
    """The per-node settings disk: one JSON object, NUL-padded to a whole number of 4 KiB blocks."""
    data = json.dumps(settings, sort_keys=True).encode()
    if len(data) > MAX_NODE_SETTINGS:
        raise ImageError("node settings: at most %d bytes of JSON, got %d" % (MAX_NODE_SETTINGS, len(data)))
    path.write_bytes(data + bytes(-len(data) % 4096))
    return path


def tls_answers(port: int, timeout: float = 5.0) -> bool:
    """Whether a TLS server answers on 127.0.0.1:``port`` (QEMU's forward accepts even when nothing listens in
    the guest, and then closes: only a server hello tells the agent is up)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            with ctx.wrap_socket(sock):
                return True
    except (ssl.SSLEOFError, ssl.SSLZeroReturnError, ConnectionError, socket.timeout, OSError) as err:
        if isinstance(err, ssl.SSLError) and not isinstance(err, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
            return True  # the server spoke TLS (and refused this client's handshake)
        return False


def _serial_disk(name: str, path: Path, serial: str, readonly: bool) -> List[str]:
    """A raw virtio disk the guest finds at /dev/disk/by-id/virtio-<serial>."""
    return ["-drive", "if=none,id=%s,format=raw,file=%s%s" % (name, path, ",readonly=on" if readonly else ""),
            "-device", "virtio-blk-pci,drive=%s,serial=%s" % (name, serial)]


class Guest:
    """One QEMU guest booting ``disk``: ``start()``, ``wait_agent()``, ``stop()``; ``serial_log`` to read."""

    def __init__(self, disk: Path, work: Path, ca_dir: Path, node_settings: Optional[Path] = None,
                 port: int = 0, memory_mib: int = 1536, extra_args: Optional[List[str]] = None):
        self.disk = Path(disk).resolve()
        self.work = Path(work).resolve()
        self.ca_dir = Path(ca_dir).resolve()
        self.node_settings = node_settings
        self.port = port or free_port()
        self.memory_mib = memory_mib
        self.extra_args = extra_args or []
        self.serial_log = self.work / "serial.log"
        self.tpm_dir = self.work / "tpm"
        self.sock = self.work / "swtpm.sock"
        self.qemu: Optional[subprocess.Popen] = None
        self.swtpm: Optional[subprocess.Popen] = None
        self.started_at = 0.0
        self._lock = None

    @property
    def endpoint(self) -> str:
        return "127.0.0.1:%d" % self.port

    @property
    def pid(self) -> Optional[int]:
        return self.qemu.pid if self.qemu else None

    def _tpm(self) -> None:
        """A manufactured TPM (EK certificate from the CA, lab/swtpm.py), then swtpm on a UNIX control socket."""
        if not (self.tpm_dir / "tpm2-00.permall").exists():
            # lab.swtpm manufactures the TPM on its first start; that TCP daemon is stopped again at once.
            for attempt in range(5):
                try:
                    SwTPM(str(self.tpm_dir), free_port(), ek_cert=True, ca_dir=str(self.ca_dir)).start().stop()
                    break
                except (ConstellationError, OSError):  # a port taken meanwhile: another pair
                    if attempt == 4:
                        raise
        if self.sock.exists():
            self.sock.unlink()
        self.swtpm = subprocess.Popen(  # pylint: disable=consider-using-with
            ["swtpm", "socket", "--tpm2", "--tpmstate", "dir=%s" % self.tpm_dir,
             "--ctrl", "type=unixio,path=%s" % self.sock, "--log", "file=%s,level=1" % (self.work / "swtpm.log"),
             "--terminate"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not self.sock.exists():
            if time.monotonic() > deadline or self.swtpm.poll() is not None:
                raise ImageError("swtpm did not open its control socket %s" % self.sock)
            time.sleep(0.05)

    def qemu_argv(self) -> List[str]:
        vars_fd = self.work / "OVMF_VARS.fd"
        argv = ["qemu-system-x86_64", "-accel", "tcg", "-machine", "q35", "-smp", "1", "-m", str(self.memory_mib),
                "-nodefaults", "-display", "none", "-monitor", "none", "-no-reboot",
                "-serial", "file:%s" % self.serial_log,
                "-drive", "if=pflash,format=raw,unit=0,readonly=on,file=%s" % OVMF_CODE,
                "-drive", "if=pflash,format=raw,unit=1,file=%s" % vars_fd,
                # The image is the only boot option (no DVD, no network boot): PCR 4 then holds one boot attempt.
                "-drive", "if=none,id=boot,format=raw,readonly=on,file=%s" % self.disk,
                "-device", "virtio-blk-pci,drive=boot,bootindex=0",
                *_serial_disk("state", self.work / "state.raw", STATE_DISK_SERIAL, readonly=False),
                "-chardev", "socket,id=chrtpm,path=%s" % self.sock,
                "-tpmdev", "emulator,id=tpm0,chardev=chrtpm", "-device", "tpm-crb,tpmdev=tpm0",
                "-netdev", "user,id=n0,hostfwd=tcp:127.0.0.1:%d-:%d" % (self.port, AGENT_PORT),
                "-device", "virtio-net-pci,netdev=n0,romfile="]
        if self.node_settings is not None:
            argv += _serial_disk("node", Path(self.node_settings).resolve(), NODE_SETTINGS_SERIAL, readonly=True)
        return argv + self.extra_args

    def _take_lock(self, timeout: float = 900.0) -> None:
        """One QEMU at a time on this machine: flock(2) on LOCK_PATH (as ``flock /tmp/qemu-image.lock``)."""
        self._lock = open(LOCK_PATH, "a")  # pylint: disable=consider-using-with
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self._lock.close()
                    self._lock = None
                    raise ImageError("another QEMU boot held %s for %.0f s" % (LOCK_PATH, timeout)) from None
                time.sleep(1)

    def start(self) -> "Guest":
        self.work.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        shutil.copyfile(OVMF_VARS, self.work / "OVMF_VARS.fd")  # fresh firmware variables: a first boot
        state = self.work / "state.raw"
        if not state.exists():
            with open(state, "wb") as handle:
                handle.truncate(STATE_DISK_BYTES)
        if self.serial_log.exists():
            self.serial_log.unlink()
        self._tpm()
        self.started_at = time.monotonic()
        with open(self.work / "qemu.log", "wb") as log:
            self.qemu = subprocess.Popen(  # pylint: disable=consider-using-with
                self.qemu_argv(), stdout=log, stderr=subprocess.STDOUT)
        return self

    def serial(self) -> str:
        try:
            return self.serial_log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def wait_serial(self, text: str, timeout: float) -> float:
        """Seconds since start until ``text`` shows on the serial console; ImageError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.serial():
                return time.monotonic() - self.started_at
            if self.qemu is not None and self.qemu.poll() is not None:
                break
            time.sleep(1)
        raise ImageError("%r not on the serial console within %.0f s; its end:\n%s"
                         % (text, timeout, "\n".join(self.serial().splitlines()[-25:])))

    def wait_agent(self, timeout: float = 300.0) -> float:
        """Seconds since start until the agent answers TLS on the forwarded port; ImageError after ``timeout``
        (or when QEMU exits), with the serial log's end."""
        deadline = self.started_at + timeout
        while time.monotonic() < deadline:
            if self.qemu is not None and self.qemu.poll() is not None:
                raise ImageError("QEMU exited (%s) before the agent served; serial log end:\n%s"
                                 % (self.qemu.returncode, "\n".join(self.serial().splitlines()[-25:])))
            if tls_answers(self.port, timeout=3):
                return time.monotonic() - self.started_at
            time.sleep(2)
        raise ImageError("the agent did not serve on %s within %.0f s; serial log end:\n%s"
                         % (self.endpoint, timeout, "\n".join(self.serial().splitlines()[-25:])))

    def wait_exit(self) -> None:
        """Until QEMU exits (the guest powered off)."""
        if self.qemu is not None:
            self.qemu.wait()

    def tls_answers(self) -> bool:
        """Whether the agent answers TLS on the forwarded port right now."""
        return tls_answers(self.port, timeout=3)

    def stop(self) -> None:
        """Power off (QEMU killed by its pid: the disk is read-only, the state disk may be dropped) and swtpm."""
        for proc in (self.qemu, self.swtpm):
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.qemu = self.swtpm = None
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None

    def __enter__(self) -> "Guest":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
