# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a lab and its hosts are called and where their parts live: the lab's constants, its error, and
``Host`` (a namespace, an address, a folder), all computed from the lab's name and state folder alone, so
that ``down`` finds everything again after a crash. Imports nothing else of the lab."""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import List

STATE_ROOT = Path(os.environ.get("CONSTELLATION_LAB_STATE", "/var/lib/constellation-lab"))
REPO_ROOT = Path(__file__).resolve().parent.parent
SUBNET = ipaddress.ip_network("10.42.0.0/24")
ADMIN_IP = "10.42.0.1"
FIRST_HOST_OCTET = 11
TPM_PORT = 2321
AGENT_PORT = 9000
MAX_HOSTS = 72  # 64 Nodes and their Coordinator (bench/activation.py), with room to spare
NAME_RE = re.compile(r"^[a-z0-9]{1,8}$")
# The lab's attestation variant (attestation/choose.py): AKs trusted only through the lab CA's
# EK certificates (swtpm's local CA stands for the TPM vendor). `--variant qemu-vtpm` for the
# Constellation-compatible one.
LAB_VARIANT = "qemu-vtpm-ek"
# The Coordinator's store: "file" (in its state directory) or "etcd" (a real etcd of its own, in the
# Coordinator host's namespace on its loopback, as a Coordinator on a real node would run it).
LAB_STORES = ("file", "etcd")
ETCD_CLIENT_PORT = 2379
# Coordinators (`--coordinators N`): the first N hosts, an odd number (an etcd majority), at most 7
# (etcd's advice for a cluster's size). With N > 1 each Coordinator's agent runs an etcd member
# (agent config etcd_member) with the lab's short timing, its data on tmpfs when there is one.
MAX_COORDINATORS = 7
LAB_ETCD_MEMBER = {"heartbeat_ms": 50, "election_ms": 500}


class LabError(Exception):
    pass


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise LabError("lab name: expected 1-8 characters [a-z0-9], got %r" % name)
    return name


def bridge_netns(lab_name: str) -> str:
    """The bridge namespace, which is also the admin machine (address .1)."""
    return "cl-%s-br" % lab_name


def ns_prefix(lab_name: str) -> str:
    return "cl-%s-" % lab_name


@dataclass(frozen=True)
class Host:
    """Simulated host ``h<index>`` of lab ``lab_name`` whose state lives under ``state_dir``."""

    lab_name: str
    state_dir: Path
    index: int

    @property
    def name(self) -> str:
        return "h%d" % self.index

    @property
    def netns(self) -> str:
        return "cl-%s-%s" % (self.lab_name, self.name)

    @property
    def public_ip(self) -> str:
        return str(SUBNET.network_address + FIRST_HOST_OCTET - 1 + self.index)

    @property
    def public_endpoint(self) -> str:
        return "%s:%d" % (self.public_ip, AGENT_PORT)

    @property
    def dir(self) -> Path:
        return self.state_dir / "hosts" / self.name

    @property
    def mount_ns_file(self) -> Path:
        return self.state_dir / "mnt" / self.name

    @property
    def tcti(self) -> str:
        return "swtpm:host=127.0.0.1,port=%d" % TPM_PORT

    @property
    def nsenter_prefix(self) -> List[str]:
        return ["nsenter", "--mount=%s" % self.mount_ns_file, "--net=/run/netns/%s" % self.netns]

    def run(self, argv: List[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
        """Runs argv inside this host's network and mount namespaces."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(self.nsenter_prefix + list(argv), check=check, **kw)

    def popen(self, argv: List[str], **kw) -> subprocess.Popen:
        return subprocess.Popen(self.nsenter_prefix + list(argv), **kw)


def hosts_of(lab_name: str, state_dir: Path, count: int) -> List[Host]:
    return [Host(lab_name, state_dir, i) for i in range(1, count + 1)]


def host_python() -> List[str]:
    """The Python a lab host runs the agent and lab.hostcmd with: the checkout's .venv when there is one."""
    return [str(REPO_ROOT / ".venv" / "bin" / "python")] if (REPO_ROOT / ".venv").exists() else ["python3"]


def host_cmd(h: Host, args: List[str], python: List[str]) -> str:
    """Runs ``python -m lab.hostcmd ARGS`` inside host h; returns its stdout."""
    proc = h.run(["env", "PYTHONPATH=%s:%s" % (REPO_ROOT / "collections", REPO_ROOT)] + list(python)
                 + ["-m", "lab.hostcmd"] + args, check=False)
    if proc.returncode != 0:
        raise LabError("%s: lab.hostcmd %s failed: %s" % (h.name, " ".join(args[:3]), proc.stderr.strip()[-800:]))
    return proc.stdout
