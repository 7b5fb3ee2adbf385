# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One software TPM (swtpm) per simulated host.

The lab and the tests start real swtpm daemons on loopback ports. When EK or platform
certificates are wanted, ``swtpm_setup`` manufactures the TPM first, with a private
``swtpm-localca.conf`` whose CA state lives in ``ca_dir`` so the system's local CA
(/var/lib/swtpm-localca) is never touched. Several TPMs may share one ``ca_dir``: they are
then certified by the same CA, which is how a verifier pins "TPMs of this fleet".
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from typing import List, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    ExternalCommandError,
    StateError,
)
from lab.procs import alive

_READY_TIMEOUT = 5.0


def free_port(bindaddr: str = "127.0.0.1") -> int:
    """A port P such that P and P+1 (swtpm's control channel) were both free just now."""
    for _attempt in range(50):
        with socket.socket() as first:
            first.bind((bindaddr, 0))
            port = first.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket() as second:
                try:
                    second.bind((bindaddr, port + 1))
                except OSError:
                    continue
                return port
    raise StateError("no two consecutive free ports found on %s" % bindaddr)


class SwTPM:
    """A swtpm daemon: ``start()``, ``stop()``, ``tcti`` for tpm2-pytss."""

    def __init__(self, state_dir: str, port: int, bindaddr: str = "127.0.0.1",
                 ek_cert: bool = False, ca_dir: Optional[str] = None,
                 netns: Optional[str] = None, pcr_banks: str = "sha256"):
        if ek_cert and not ca_dir:
            raise ValueError("ek_cert=True needs a ca_dir for the private local CA")
        self.state_dir = os.path.abspath(state_dir)
        self.port = port
        self.bindaddr = bindaddr
        self.ek_cert = ek_cert
        self.ca_dir = os.path.abspath(ca_dir) if ca_dir else None
        self.netns = netns
        # Banks swtpm_setup activates; a TPM started without swtpm_setup keeps libtpms'
        # default (sha1, sha256, sha384, sha512).
        self.pcr_banks = pcr_banks
        self._pid_file = os.path.join(self.state_dir, "swtpm.pid")
        self._pid: Optional[int] = None

    @property
    def tcti(self) -> str:
        return "swtpm:host=%s,port=%d" % (self.bindaddr, self.port)

    def ca_cert_path(self) -> str:
        """The self-signed root of the private local CA (a verifier's trust anchor)."""
        self._need_ca()
        return os.path.join(self.ca_dir, "swtpm-localca-rootca-cert.pem")

    def issuer_cert_path(self) -> str:
        """The intermediate CA that signs EK certificates."""
        self._need_ca()
        return os.path.join(self.ca_dir, "issuercert.pem")

    def ca_cert_paths(self) -> List[str]:
        return [self.ca_cert_path(), self.issuer_cert_path()]

    def _need_ca(self) -> None:
        if not self.ca_dir:
            raise StateError("this swtpm has no ca_dir")

    def _wrap(self, argv: List[str]) -> List[str]:
        if self.netns:
            return ["ip", "netns", "exec", self.netns] + argv
        return argv

    def _run(self, argv: List[str]) -> None:
        proc = subprocess.run(self._wrap(argv), capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise ExternalCommandError(argv, proc.returncode, proc.stderr + proc.stdout)

    def _write_ca_config(self) -> str:
        os.makedirs(self.ca_dir, mode=0o700, exist_ok=True)
        localca = os.path.join(self.ca_dir, "swtpm-localca.conf")
        with open(localca, "w", encoding="utf-8") as handle:
            handle.write("statedir = %s\n" % self.ca_dir)
            handle.write("signingkey = %s\n" % os.path.join(self.ca_dir, "signkey.pem"))
            handle.write("issuercert = %s\n" % os.path.join(self.ca_dir, "issuercert.pem"))
            handle.write("certserial = %s\n" % os.path.join(self.ca_dir, "certserial"))
        setup = os.path.join(self.state_dir, "swtpm_setup.conf")
        with open(setup, "w", encoding="utf-8") as handle:
            handle.write("create_certs_tool = /usr/bin/swtpm_localca\n")
            handle.write("create_certs_tool_config = %s\n" % localca)
            handle.write("create_certs_tool_options = /etc/swtpm-localca.options\n")
            handle.write("active_pcr_banks = %s\n" % self.pcr_banks)
        return setup

    def _manufacture(self) -> None:
        setup = self._write_ca_config()
        argv = ["swtpm_setup", "--tpm2", "--tpmstate", self.state_dir,
                "--create-ek-cert", "--create-platform-cert", "--lock-nvram",
                "--pcr-banks", self.pcr_banks, "--config", setup]
        try:
            self._run(argv)
        except ExternalCommandError:
            # Seen once under heavy load with several labs side by side: swtpm_setup's certificate
            # step failed and the same call passed right after. Start over once from an empty state.
            state = os.path.join(self.state_dir, "tpm2-00.permall")
            if os.path.exists(state):
                os.unlink(state)
            time.sleep(0.2)
            self._run(argv)

    def _has_tpm_state(self) -> bool:
        return os.path.exists(os.path.join(self.state_dir, "tpm2-00.permall"))

    def start(self) -> "SwTPM":
        if self._pid is not None:
            return self
        os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
        if self.ek_cert and not self._has_tpm_state():
            self._manufacture()
        if os.path.exists(self._pid_file):
            os.unlink(self._pid_file)
        addr = "bindaddr=%s" % self.bindaddr
        self._run(["swtpm", "socket", "--tpm2",
                   "--tpmstate", "dir=%s" % self.state_dir,
                   "--server", "type=tcp,port=%d,%s" % (self.port, addr),
                   "--ctrl", "type=tcp,port=%d,%s" % (self.port + 1, addr),
                   "--flags", "not-need-init,startup-clear",
                   "--daemon", "--pid", "file=%s" % self._pid_file])
        deadline = time.monotonic() + _READY_TIMEOUT
        while time.monotonic() < deadline:
            if os.path.exists(self._pid_file):
                with open(self._pid_file, encoding="ascii") as handle:
                    text = handle.read().strip()
                if text:
                    self._pid = int(text)
                    break
            time.sleep(0.01)
        if self._pid is None:
            raise StateError("swtpm on port %d wrote no pid file within %.0f s" % (self.port, _READY_TIMEOUT))
        return self

    def stop(self, orderly: bool = False) -> None:
        """Stops the daemon (by its pid) and waits for it to exit; the state dir stays. ``orderly``: for a TPM
        that starts again (a reboot), TPM2_Shutdown first, as an operating system does: without it the next
        start counts a failed authorization (the dictionary-attack protection of an unorderly power loss),
        and a few reboots would lock the TPM's AK out."""
        pid, self._pid = self._pid, None
        if pid is None:
            return
        if orderly:
            subprocess.run(self._wrap(["tpm2_shutdown", "-T", self.tcti]), capture_output=True, check=False,
                           timeout=_READY_TIMEOUT, env=dict(os.environ, TSS2_LOG="all+none"))
        # CMD_SHUTDOWN on the control channel ends swtpm at once; SIGTERM takes it ~1-2 s.
        subprocess.run(self._wrap(["swtpm_ioctl", "--tcp", "%s:%d" % (self.bindaddr, self.port + 1), "-s"]),
                       capture_output=True, check=False, timeout=_READY_TIMEOUT)
        try:
            os.kill(pid, 0)
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + _READY_TIMEOUT
        while time.monotonic() < deadline:
            if not alive(pid):
                break
            time.sleep(0.01)
        else:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if os.path.exists(self._pid_file):
            os.unlink(self._pid_file)

    def adopt(self) -> "SwTPM":
        """Takes over a daemon started earlier for this state dir (by its pid file), so that
        stop() and destroy() reach it from another process or object."""
        try:
            with open(self._pid_file, encoding="ascii") as handle:
                self._pid = int(handle.read().strip())
        except (OSError, ValueError):
            self._pid = None
        return self

    def destroy(self) -> None:
        """Stops the daemon and removes its state (not the shared CA)."""
        self.stop()
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> "SwTPM":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
