"""The lab: N simulated hosts on one machine (DESIGN.md section 5).

Each host is a network namespace ``cl-<lab>-h<i>`` joined to the others through a bridge
namespace ``cl-<lab>-br`` (which also holds the admin address .1, the "operator's machine").
Each host also gets a private mount namespace with its own ``/run`` (so ``wireguard-go``'s
UAPI sockets and pid files never collide), its own swtpm on 127.0.0.1:2321 inside its network
namespace, and a directory where its node agent runs. Nothing is created in the root network
namespace: no veth, no address, no route, so nothing is ever routed out.

Everything the lab creates can be found again from names alone (namespace prefix, state dir),
so ``down`` cleans up after a crash of ``up`` half-way, and ``up`` repairs a broken lab.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from ansible_collections.constellation.cluster.plugins.module_utils import fileutil
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import extend_digest

STATE_ROOT = Path(os.environ.get("CONSTELLATION_LAB_STATE", "/var/lib/constellation-lab"))
REPO_ROOT = Path(__file__).resolve().parent.parent
SUBNET = ipaddress.ip_network("10.42.0.0/24")
ADMIN_IP = "10.42.0.1"
FIRST_HOST_OCTET = 11
TPM_PORT = 2321
AGENT_PORT = 9000
MAX_HOSTS = 72  # 64 Nodes and their Coordinator (bench/activation.py), with room to spare
# Linux keeps ONE ARP table for all network namespaces; its hard limit gc_thresh3 (default 1024) is
# reached by a full WireGuard mesh of ~32 lab hosts (every host resolves every other's public IP), after
# which new neighbours fail ("neighbor table overflow"): connects time out or find no route. The lab
# raises the limits (never lowers them) to what its hosts need, for every lab on the machine at once.
NEIGH_ENTRIES_PER_HOST_PAIR = 2
NEIGH_MIN = (1024, 4096, 8192)
NAME_RE = re.compile(r"^[a-z0-9]{1,8}$")

# The lab's simulated measured boot: each host's boot chain measures the same named image
# into these PCRs, as firmware, kernel and command line would.
LAB_IMAGE = "constellation-lab-image-v1"
# The lab's attestation variant (attestation/choose.py): AKs trusted only through the lab CA's
# EK certificates (swtpm's local CA stands for the TPM vendor). `--variant qemu-vtpm` for the
# Constellation-compatible one.
LAB_VARIANT = "qemu-vtpm-ek"
MEASURED_PCRS = (4, 9, 11)
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


def image_digest(image: str, pcr: int) -> bytes:
    """The digest the boot chain of ``image`` extends into ``pcr``."""
    return hashlib.sha256(("%s/pcr%d" % (image, pcr)).encode()).digest()


def expected_pcr(digests: List[bytes]) -> bytes:
    """A SHA-256 PCR after extending each digest into the all-zero reset value."""
    value = bytes(32)
    for d in digests:
        value = extend_digest(value, d)
    return value


def lab_measurements(image: str = LAB_IMAGE) -> Dict[str, dict]:
    """The measurements policy of a lab image, computed from the image (never read back
    from the hosts, so a tampered host fails), in Constellation's JSON shape."""
    return {
        str(pcr): {"expected": expected_pcr([image_digest(image, pcr)]).hex(), "warnOnly": False}
        for pcr in MEASURED_PCRS
    }


def raise_neighbour_limits(hosts: int, root: str = "/proc/sys/net/ipv4/neigh/default") -> List[int]:
    """Raises the shared ARP table's gc_thresh1..3 so that ``hosts`` hosts in full mesh fit (plus the other
    labs running now); never lowers them. Returns the limits in force."""
    needed = NEIGH_ENTRIES_PER_HOST_PAIR * (hosts + 1) * (hosts + 1)
    wanted = [max(NEIGH_MIN[0], needed // 4), max(NEIGH_MIN[1], needed // 2), max(NEIGH_MIN[2], needed)]
    result = []
    # gc_thresh3 first, so that thresh1 <= thresh2 <= thresh3 holds at every step.
    for index in (2, 1, 0):
        path = os.path.join(root, "gc_thresh%d" % (index + 1))
        try:
            with open(path, encoding="ascii") as handle:
                current = int(handle.read().strip())
            if current < wanted[index]:
                with open(path, "w", encoding="ascii") as handle:
                    handle.write(str(wanted[index]))
                current = wanted[index]
        except (OSError, ValueError):
            current = -1  # not root, or no such sysctl here: the lab works up to ~30 hosts in mesh
        result.insert(0, current)
    return result


def check_coordinators(coordinators: int, hosts: int, store: str = "file") -> None:
    """LabError unless ``coordinators`` is an odd number from 1 to min(MAX_COORDINATORS, hosts)."""
    top = min(MAX_COORDINATORS, hosts)
    if isinstance(coordinators, bool) or not isinstance(coordinators, int) or not 1 <= coordinators <= top \
            or coordinators % 2 == 0:
        raise LabError("coordinators: expected an odd number from 1 to %d (at most %d, and no more than the %d "
                       "hosts; odd, so that etcd keeps a majority), got %r"
                       % (top, MAX_COORDINATORS, hosts, coordinators))
    if coordinators > 1 and store != "file":
        raise LabError("coordinators: with %d Coordinators each runs an etcd member of the cluster's store; "
                       "--store %s (one etcd beside the first Coordinator) cannot be combined with it"
                       % (coordinators, store))


# Made once per lab, while agents start in parallel threads: the init secret and the signing key.
_TRUST_LOCK = threading.Lock()


def _run(argv: List[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    proc = subprocess.run(argv, check=False, **kw)
    if check and proc.returncode != 0:
        raise LabError("%s failed (%d): %s" % (" ".join(argv), proc.returncode, (proc.stderr or "").strip()))
    return proc


def _netns_list() -> List[str]:
    out = _run(["ip", "netns", "list"], check=False).stdout or ""
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _mountpoints() -> List[str]:
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            points.append(line.split()[4].replace("\\040", " "))
    return points


def _pids_in_netns(ns: str) -> List[int]:
    out = _run(["ip", "netns", "pids", ns], check=False).stdout or ""
    return [int(p) for p in out.split() if p.isdigit()]


def _kill_all(pids: List[int], timeout: float = 3.0) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if Path("/proc/%d" % p).exists() and not _is_zombie(p)]
        if alive:
            time.sleep(0.02)
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _is_zombie(pid: int) -> bool:
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@dataclass
class Host:
    lab: "Lab"
    index: int

    @property
    def name(self) -> str:
        return "h%d" % self.index

    @property
    def netns(self) -> str:
        return "cl-%s-%s" % (self.lab.name, self.name)

    @property
    def public_ip(self) -> str:
        return str(SUBNET.network_address + FIRST_HOST_OCTET - 1 + self.index)

    @property
    def public_endpoint(self) -> str:
        return "%s:%d" % (self.public_ip, AGENT_PORT)

    @property
    def dir(self) -> Path:
        return self.lab.state_dir / "hosts" / self.name

    @property
    def mount_ns_file(self) -> Path:
        return self.lab.state_dir / "mnt" / self.name

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


@dataclass
class Lab:
    name: str = "lab"
    state_root: Path = field(default_factory=lambda: STATE_ROOT)
    inventory_dir: Optional[Path] = None

    def __post_init__(self):
        if not NAME_RE.match(self.name):
            raise LabError("lab name: expected 1-8 characters [a-z0-9], got %r" % self.name)
        self.state_root = Path(self.state_root)
        if self.inventory_dir is None:
            # The default lab's inventory is the project's inventories/lab; any other lab's
            # lives in its state directory (removed with it by `down`).
            self.inventory_dir = (REPO_ROOT / "inventories" / "lab" if self.name == "lab"
                                  else self.state_dir / "inventory")
        self._count = None

    # -- names ------------------------------------------------------------------------
    @property
    def state_dir(self) -> Path:
        return self.state_root / self.name

    @property
    def bridge_netns(self) -> str:
        return "cl-%s-br" % self.name

    @property
    def ns_prefix(self) -> str:
        return "cl-%s-" % self.name

    @property
    def ca_dir(self) -> Path:
        return self.state_dir / "ca"

    def _state(self) -> dict:
        try:
            return json.loads((self.state_dir / "state.json").read_text())
        except (OSError, ValueError):
            return {}

    def _write_state(self, **values) -> None:
        state = self._state()
        state.update(values)
        tmp = self.state_dir / "state.json.tmp"
        tmp.write_text(json.dumps(state, indent=2))
        os.replace(tmp, self.state_dir / "state.json")

    @property
    def hosts(self) -> List[Host]:
        count = self._count if self._count is not None else int(self._state().get("hosts", 0))
        return [Host(self, i) for i in range(1, count + 1)]

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise LabError("no host %r in lab %r (hosts: %s)" % (name, self.name, ", ".join(h.name for h in self.hosts)))

    def admin_run(self, argv: List[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
        """Runs argv on the admin machine: the bridge namespace, address .1."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(["ip", "netns", "exec", self.bridge_netns] + list(argv), check=check, **kw)

    # -- up -----------------------------------------------------------------------------
    def up(self, hosts: int = 3, tpm: bool = True, image: str = LAB_IMAGE, agents: bool = False,
           variant: str = LAB_VARIANT, store: str = "file", coordinators: int = 1) -> "Lab":
        from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose

        choose.spec(variant, "variant")
        if store not in LAB_STORES:
            raise LabError("store: expected one of %s, got %r" % (", ".join(LAB_STORES), store))
        if not 1 <= hosts <= MAX_HOSTS:
            raise LabError("hosts: expected 1..%d, got %d" % (MAX_HOSTS, hosts))
        if agents and not tpm:
            raise LabError("agents: the node agent needs a TPM (do not combine agents with --no-tpm)")
        check_coordinators(coordinators, hosts, store)
        state = self._state()
        if state.get("phase") == "up" and state.get("hosts") == hosts and state.get("tpm") == tpm \
                and state.get("image") == image and state.get("agents", False) == agents \
                and state.get("variant", LAB_VARIANT) == variant and state.get("store", "file") == store \
                and state.get("coordinators", 1) == coordinators and self.healthy():
            return self
        # Anything else (a crash half-way, another size): start from a clean slate.
        self.down()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._count = hosts
        # trust: the agents the lab starts itself (--agents, the operator's lab) are provisioned with the lab's
        # init secret hash and its signed measurements (tests that start agents themselves opt in).
        self._write_state(phase="building", hosts=hosts, tpm=tpm, image=image, agents=agents, variant=variant,
                          store=store, trust=agents, coordinators=coordinators)
        self._make_mount_dir()
        raise_neighbour_limits(hosts)
        self._make_bridge()
        for h in self.hosts:
            self._make_host(h)
        if tpm:
            self._start_tpms(self.hosts, image)
        if agents:
            if store == "etcd":
                self.start_etcd()
            self._start_agents(self.hosts)
        self._write_state(phase="up")
        self.write_inventory()
        return self

    @property
    def store(self) -> str:
        return self._state().get("store", "file")

    def etcd(self):
        """The Coordinator's etcd (store etcd): h1's namespace, its loopback, data in the lab's state."""
        from lab.etcd import Etcd

        return Etcd(str(self.state_dir / "etcd" / "data"), ETCD_CLIENT_PORT, ETCD_CLIENT_PORT + 1,
                    name="coordinator", netns=self.hosts[0].netns)

    def start_etcd(self):
        return self.etcd().start()

    def agent_store(self, h: Host) -> Optional[dict]:
        """The store setting of the agent on ``h`` (None: the agent's default file store)."""
        if self.store == "etcd" and h.name == self.hosts[0].name:
            return {"type": "etcd", "endpoints": ["127.0.0.1:%d" % ETCD_CLIENT_PORT]}
        return None

    @property
    def coordinators(self) -> List[Host]:
        """The lab's Coordinators: its first N hosts (``up(coordinators=N)``); the others are Nodes."""
        return self.hosts[:int(self._state().get("coordinators", 1))]

    @property
    def etcd_tmpfs_dir(self) -> Optional[Path]:
        """Where the Coordinators' etcd members keep their data: on tmpfs (etcd's fsyncs are then nearly
        free), one folder per lab and state root, removed by ``down``; None without a tmpfs."""
        from lab.etcd import tmpfs_dir

        base = tmpfs_dir()
        if base is None:
            return None
        tag = hashlib.sha256(str(self.state_dir).encode()).hexdigest()[:8]
        return Path(base) / ("constellation-lab-%s-%s" % (self.name, tag))

    def agent_etcd_member(self, h: Host) -> Optional[dict]:
        """The etcd_member setting of the agent on ``h``: a Coordinator of a lab with several (None:
        one Coordinator, or a Node)."""
        coordinators = self.coordinators
        if len(coordinators) < 2 or h.name not in {c.name for c in coordinators}:
            return None
        member = dict(LAB_ETCD_MEMBER)
        if self.etcd_tmpfs_dir is not None:
            member["data_dir"] = str(self.etcd_tmpfs_dir / h.name)
        return member

    def grow(self, hosts: int) -> List[Host]:
        """Adds hosts to a running lab (as new machines booting); returns the new ones."""
        state = self._state()
        if state.get("phase") != "up":
            raise LabError("lab %r is not up: run `python -m lab up` first" % self.name)
        old = int(state.get("hosts", 0))
        if not old < hosts <= MAX_HOSTS:
            raise LabError("hosts: expected %d..%d (the lab has %d), got %d" % (old + 1, MAX_HOSTS, old, hosts))
        self._write_state(phase="building", hosts=hosts)
        self._count = hosts
        raise_neighbour_limits(hosts)
        new = self.hosts[old:]
        for h in new:
            self._make_host(h)
        if state.get("tpm"):
            self._start_tpms(new, state.get("image", LAB_IMAGE))
        if state.get("agents"):
            self._start_agents(new)
        self._write_state(phase="up")
        self.write_inventory()
        return new

    def _make_mount_dir(self) -> None:
        # Persistent mount namespaces are bind mounts of /proc/PID/ns/mnt; the folder that
        # holds them must be a private mount (as ip netns does with /run/netns).
        mnt = self.state_dir / "mnt"
        mnt.mkdir(parents=True, exist_ok=True)
        if str(mnt) not in _mountpoints():
            _run(["mount", "--bind", str(mnt), str(mnt)])
        _run(["mount", "--make-private", str(mnt)])

    def _make_bridge(self) -> None:
        br = self.bridge_netns
        _run(["ip", "netns", "add", br])
        _run(["ip", "-n", br, "link", "set", "lo", "up"])
        _run(["ip", "-n", br, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", br, "addr", "add", "%s/%d" % (ADMIN_IP, SUBNET.prefixlen), "dev", "br0"])
        _run(["ip", "-n", br, "link", "set", "br0", "up"])

    def _make_host(self, h: Host) -> None:
        _run(["ip", "netns", "add", h.netns])
        _run(["ip", "-n", h.netns, "link", "set", "lo", "up"])
        # Both ends are created straight inside namespaces: nothing appears in the root one.
        _run(["ip", "-n", h.netns, "link", "add", "eth0", "type", "veth", "peer", "name", h.name,
              "netns", self.bridge_netns])
        _run(["ip", "-n", self.bridge_netns, "link", "set", h.name, "master", "br0", "up"])
        _run(["ip", "-n", h.netns, "addr", "add", "%s/%d" % (h.public_ip, SUBNET.prefixlen), "dev", "eth0"])
        _run(["ip", "-n", h.netns, "link", "set", "eth0", "up"])
        h.dir.mkdir(parents=True, exist_ok=True)
        (h.dir / "agent").mkdir(exist_ok=True)
        # A private mount namespace with its own /run: wireguard-go's UAPI sockets
        # (/run/wireguard), the agent's runtime files and pid files stay per host.
        h.mount_ns_file.touch()
        _run(["unshare", "--mount=%s" % h.mount_ns_file, "--propagation", "private", "sh", "-c",
              "mount -t tmpfs -o mode=0755 lab-run /run && mkdir -p /run/wireguard /run/sshd"])

    def _start_tpms(self, hosts: List[Host], image: str) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from lab.swtpm import SwTPM

        first_ever = not (self.ca_dir / "issuercert.pem").exists()
        self.ca_dir.mkdir(parents=True, exist_ok=True)
        tpms = [SwTPM(str(h.dir / "tpm"), port=TPM_PORT, ek_cert=True, ca_dir=str(self.ca_dir), netns=h.netns)
                for h in hosts]
        # The first manufacture creates the lab's local CA (the "TPM vendor"); the others
        # only ask it for certificates, so they can run side by side.
        if first_ever:
            tpms[0].start()
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda t: t.start(), tpms[1:] if first_ever else tpms))
            # The simulated boot chain measures the image into each host's TPM.
            list(pool.map(lambda h: self.measure(h, {pcr: image_digest(image, pcr) for pcr in MEASURED_PCRS}),
                          hosts))
        self._write_ek_ca()

    def _start_agents(self, hosts: List[Host]) -> None:
        """Starts the node agent on each host (in its namespaces; lab.down stops them)."""
        from concurrent.futures import ThreadPoolExecutor

        from lab.agent import start_agent

        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda h: start_agent(self, h), hosts))

    def measure(self, h: Host, digests: Dict[int, bytes]) -> None:
        """Extends PCRs of a host's TPM (inside its namespace, where its swtpm listens)."""
        args = []
        for pcr, digest in sorted(digests.items()):
            args += ["--extend", "%d=%s" % (pcr, digest.hex())]
        self.host_cmd(h, ["--tcti", h.tcti] + args)

    def host_cmd(self, h: Host, args: List[str]) -> str:
        """Runs ``python -m lab.hostcmd ARGS`` inside host h; returns its stdout."""
        proc = h.run(["env", "PYTHONPATH=%s:%s" % (REPO_ROOT / "collections", REPO_ROOT)] + self.host_python()
                     + ["-m", "lab.hostcmd"] + args, check=False)
        if proc.returncode != 0:
            raise LabError("%s: lab.hostcmd %s failed: %s" % (h.name, " ".join(args[:3]), proc.stderr.strip()[-800:]))
        return proc.stdout

    def host_python(self) -> List[str]:
        return [str(REPO_ROOT / ".venv" / "bin" / "python")] if (REPO_ROOT / ".venv").exists() else ["python3"]

    def reboot_tpm(self, name: str) -> None:
        """Stands for a reboot of the host's machine: its TPM restarts (PCRs reset, keys kept) and the
        boot chain measures the lab image again. Stop the host's agent first and start it after."""
        from lab.swtpm import SwTPM

        h = self.host(name)
        tpm = SwTPM(str(h.dir / "tpm"), port=TPM_PORT, ek_cert=True, ca_dir=str(self.ca_dir), netns=h.netns)
        tpm.adopt()
        tpm.stop(orderly=True)  # a reboot: the OS shuts the TPM down first
        tpm.start()
        self.measure(h, {pcr: image_digest(self._state().get("image", LAB_IMAGE), pcr) for pcr in MEASURED_PCRS})

    def tamper(self, name: str, pcr: int = 9) -> None:
        """Stands for a modified host: its boot chain measured something else."""
        self.measure(self.host(name), {pcr: hashlib.sha256(b"tampered boot component").digest()})

    # -- trust: the lab's init secret and measurements signing key (docs/agent.md) -------------
    @property
    def trusted_agents(self) -> bool:
        """Whether the agents the lab starts get the init secret hash and the signed policy."""
        return bool(self._state().get("trust", False))

    @property
    def init_secret_path(self) -> Path:
        return self.state_dir / "init_secret"

    def init_secret(self) -> str:
        """The lab's init secret (std base64 of 32 bytes, 0600 in the lab's state), made once per lab."""
        import base64

        with _TRUST_LOCK:  # agents start in parallel: one secret
            return self._init_secret(base64)

    def _init_secret(self, base64) -> str:
        if not self.init_secret_path.exists():
            self.state_dir.mkdir(parents=True, exist_ok=True)
            _atomic_write(self.init_secret_path, base64.b64encode(os.urandom(32)).decode() + "\n", mode=0o600)
        return self.init_secret_path.read_text().strip()

    def init_secret_hash(self, h: Host) -> str:
        """What host ``h``'s agent is provisioned with (its own init secret's SHA-256)."""
        from ansible_collections.constellation.cluster.plugins.module_utils.init_secret import init_secret_hash

        return init_secret_hash(self.init_secret(), h.public_ip)

    @property
    def measurements_pub_path(self) -> Path:
        """The lab's pinned measurements public key (PEM, ECDSA P-256, as cosign.pub)."""
        return self.state_dir / "measurements.pub"

    def _measurements_key(self):
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        from ansible_collections.constellation.cluster.plugins.module_utils.attestation.signature import (
            load_private_key)

        with _TRUST_LOCK:  # agents start in parallel: one key
            return self._measurements_key_locked(serialization, ec, load_private_key)

    def _measurements_key_locked(self, serialization, ec, load_private_key):
        path = self.state_dir / "measurements_signing_key.pem"
        if not path.exists():
            self.state_dir.mkdir(parents=True, exist_ok=True)
            key = ec.generate_private_key(ec.SECP256R1())
            _atomic_write(path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()).decode(), mode=0o600)
        key = load_private_key(path.read_bytes())
        pub = key.public_key().public_bytes(serialization.Encoding.PEM,
                                            serialization.PublicFormat.SubjectPublicKeyInfo).decode()
        if not self.measurements_pub_path.exists() or self.measurements_pub_path.read_text() != pub:
            _atomic_write(self.measurements_pub_path, pub)
        return key

    def sign_measurements(self, path: Path) -> Path:
        """Signs a policy file with the lab key (``path.sig``, cosign sign-blob form)."""
        from ansible_collections.constellation.cluster.plugins.module_utils.attestation import signature

        sig = Path(signature.signature_path(str(path)))
        _atomic_write(sig, signature.sign_blob(self._measurements_key(), path.read_bytes()) + "\n")
        return sig

    @property
    def variant(self) -> str:
        return self._state().get("variant", LAB_VARIANT)

    @property
    def ek_ca_path(self) -> Path:
        """PEM bundle of the lab CA (root and intermediate): the EK trust anchor of qemu-vtpm-ek."""
        return self.state_dir / "ek_ca.pem"

    def _write_ek_ca(self) -> None:
        names = ("swtpm-localca-rootca-cert.pem", "issuercert.pem")
        bundle = "".join((self.ca_dir / name).read_text() for name in names)
        _atomic_write(self.ek_ca_path, bundle)

    def foreign_tpm(self, name: str) -> None:
        """Stands for a host whose TPM is not from our vendor: its swtpm is replaced by one whose EK
        certificate comes from another CA, with the lab image measured as usual (so only the EK
        chain can tell). Another TPM is another machine: the agent's state folder (sealed to the old
        TPM) goes with the old one, and a running agent is restarted fresh on the new TPM."""
        from lab.swtpm import SwTPM

        h = self.host(name)
        agent_pids = self._agent_pids(h)
        _kill_all(agent_pids)
        old = SwTPM(str(h.dir / "tpm"), port=TPM_PORT, netns=h.netns)
        old.adopt()  # the running daemon, by its pid file
        old.destroy()
        foreign_ca = self.state_dir / "foreign-ca"
        foreign_ca.mkdir(parents=True, exist_ok=True)
        SwTPM(str(h.dir / "tpm"), port=TPM_PORT, ek_cert=True, ca_dir=str(foreign_ca), netns=h.netns).start()
        self.measure(h, {pcr: image_digest(self._state().get("image", LAB_IMAGE), pcr) for pcr in MEASURED_PCRS})
        shutil.rmtree(str(h.dir / "agent" / "state"), ignore_errors=True)  # lab/agent.py's agent_dir(h) / "state"
        if agent_pids:
            self._start_agents([h])

    # -- inventory ----------------------------------------------------------------------
    def write_inventory(self) -> Optional[Path]:
        """Writes the operator's inventory of this lab (hosts reached over the aTLS connection
        plugin from the admin machine's namespace) and, in the state dir, a second inventory
        that reaches the same hosts with the local connection through a wrapper shell."""
        if self.inventory_dir is None:
            return None
        import yaml

        inv = Path(self.inventory_dir)
        (inv / "group_vars" / "all").mkdir(parents=True, exist_ok=True)
        (self.state_dir / "bin").mkdir(parents=True, exist_ok=True)
        hosts = self.hosts
        state = self._state()
        host_vars, local_vars = {}, {}
        for h in hosts:
            shell = self.state_dir / "bin" / ("%s-sh" % h.name)
            # Already inside the host (a shell task run through this wrapper again): /run/netns
            # is hidden by the host's private /run, so recognise the namespace by its inode.
            net_inode = os.stat("/run/netns/%s" % h.netns).st_ino
            shell.write_text("#!/bin/sh\n"
                             "if [ \"$(readlink /proc/self/ns/net)\" = \"net:[%d]\" ]; then exec /bin/sh \"$@\"; fi\n"
                             "exec %s /bin/sh \"$@\"\n" % (net_inode, " ".join(h.nsenter_prefix)))
            shell.chmod(0o755)
            host_vars[h.name] = {
                "constellation_public_ip": h.public_ip,
                "constellation_public_endpoint": h.public_endpoint,
                "constellation_tpm_tcti": h.tcti,
            }
            local_vars[h.name] = dict(host_vars[h.name], ansible_connection="local",
                                      ansible_shell_executable=str(shell),
                                      ansible_python_interpreter=self.host_python()[0])

        count = len(self.coordinators)

        def groups(per_host):
            return {"all": {"children": {
                "coordinators": {"hosts": {h.name: per_host[h.name] for h in hosts[:count]}} if hosts else {},
                "nodes": {"hosts": {h.name: per_host[h.name] for h in hosts[count:]}},
            }}}

        header = "# Written by `python -m lab up` (lab %s); do not edit.\n" % self.name
        _atomic_write(inv / "hosts.yml", header + yaml.safe_dump(groups(host_vars), sort_keys=False))
        _atomic_write(self.local_inventory, header + yaml.safe_dump(groups(local_vars), sort_keys=False))
        measurements = lab_measurements(state.get("image", LAB_IMAGE))
        _atomic_write(inv / "measurements.json", json.dumps(measurements, indent=2) + "\n")
        # Signed with the lab's key; the inventory pins its public half (every policy load checks it).
        self.sign_measurements(inv / "measurements.json")
        _atomic_write(inv / "measurements.pub", self.measurements_pub_path.read_text())
        _atomic_write(inv / "init_secret", self.init_secret() + "\n", mode=0o600)
        if self.ek_ca_path.exists():
            _atomic_write(inv / "ek_ca.pem", self.ek_ca_path.read_text())
        admin_key = self._admin_key(inv)
        vault_pass = inv / "vault_pass"
        if not vault_pass.exists():
            _atomic_write(vault_pass, os.urandom(24).hex() + "\n", mode=0o600)
        lab_vars = {
            "constellation_lab_name": self.name,
            "constellation_lab_admin_ip": ADMIN_IP,
            "constellation_lab_tpm_ca_cert": str(self.ca_dir / "swtpm-localca-rootca-cert.pem"),
            "constellation_attestation_variant": state.get("variant", LAB_VARIANT),
            "constellation_lab_local_inventory": str(self.local_inventory),
            # kubeadm cannot be installed on lab hosts: the lab runs without Kubernetes, and says so
            # (with Kubernetes on, a host without kubeadm fails the run).
            "constellation_kubernetes": False,
            # The operator's view: every host over aTLS, attested against the image's policy.
            "ansible_connection": "constellation.cluster.atls",
            "ansible_pipelining": True,
            "ansible_python_interpreter": self.host_python()[0],
            # The signed policy file and the pinned key it must be signed with (measurements_signature).
            "constellation_measurements_path": str(inv / "measurements.json"),
            "constellation_measurements_public_key_path": str(inv / "measurements.pub"),
            # The same policy inline, for lab tools and Molecule (the playbooks read the signed file).
            "constellation_lab_measurements": measurements,
            # The lab's init secret (0600): site.yml proves it to the Coordinator, which proves each node's.
            "constellation_init_secret_file": str(inv / "init_secret"),
            "constellation_admin_priv_key_file": str(admin_key),
            # qemu-vtpm-ek: the lab CA is the EK root (a real fleet pins its TPM vendor's CAs).
            "constellation_ek_ca_path": str(inv / "ek_ca.pem"),
            # Lab only: lab addresses exist only in namespaces, so the controller's sockets are
            # opened in the admin machine's namespace (a real controller reaches nodes directly).
            "constellation_atls_netns": self.bridge_netns,
        }
        if lab_vars["constellation_attestation_variant"] == "qemu-vtpm":
            # `lab up --variant qemu-vtpm` trusts any AK: the acknowledgement every run then warns about.
            lab_vars["constellation_insecure_trust_any_ak"] = True
        _atomic_write(inv / "group_vars" / "all" / "lab.yml", header + yaml.safe_dump(lab_vars, sort_keys=False))
        return inv

    @property
    def local_inventory(self) -> Path:
        return self.state_dir / "local-inventory.yml"

    def _admin_key(self, inv: Path) -> Path:
        """The lab operator's admin key (Ed25519), made once; the agents pin its public half
        at activation."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519

        path = inv / "admin_key"
        if not path.exists():
            key = ed25519.Ed25519PrivateKey.generate()
            pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
            _atomic_write(path, pem.decode(), mode=0o600)
            pub = key.public_key().public_bytes(serialization.Encoding.PEM,
                                                serialization.PublicFormat.SubjectPublicKeyInfo)
            _atomic_write(inv / "admin_key.pub", pub.decode())
        return path

    # -- status -------------------------------------------------------------------------
    def status(self) -> List[dict]:
        existing = set(_netns_list())
        rows = []
        for h in self.hosts:
            rows.append({
                "host": h.name,
                "netns": h.netns in existing,
                "public_ip": h.public_ip,
                "mount_ns": str(h.mount_ns_file) in _mountpoints(),
                "tpm": self._tpm_alive(h),
                "agent": self._agent_alive(h),
            })
        return rows

    def _tpm_alive(self, h: Host) -> bool:
        pidfile = h.dir / "tpm" / "swtpm.pid"
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            return False
        return Path("/proc/%d" % pid).exists() and not _is_zombie(pid)

    def _agent_pids(self, h: Host) -> List[int]:
        if h.netns not in _netns_list():
            return []
        pids = []
        for pid in _pids_in_netns(h.netns):
            try:
                if b"constellation-agent" in Path("/proc/%d/cmdline" % pid).read_bytes() and not _is_zombie(pid):
                    pids.append(pid)
            except OSError:
                continue
        return pids

    def _agent_alive(self, h: Host) -> bool:
        return bool(self._agent_pids(h))

    def healthy(self) -> bool:
        state = self._state()
        if state.get("phase") != "up" or self.bridge_netns not in _netns_list():
            return False
        for row in self.status():
            if not (row["netns"] and row["mount_ns"] and (row["tpm"] or not state.get("tpm"))
                    and (row["agent"] or not state.get("agents"))):
                return False
        if state.get("agents") and state.get("store", "file") == "etcd":
            return any(Path("/proc/%d/comm" % pid).exists() and Path("/proc/%d/comm" % pid).read_text().strip() == "etcd"
                       for pid in _pids_in_netns(self.hosts[0].netns))
        return True

    # -- down ---------------------------------------------------------------------------
    def down(self) -> None:
        """Removes every namespace, process, mount and file of this lab; safe to repeat."""
        namespaces = [ns for ns in _netns_list() if ns.startswith(self.ns_prefix)]
        pids = []
        for ns in namespaces:
            pids += _pids_in_netns(ns)
        _kill_all(sorted(set(pids)))
        mnt = str(self.state_dir / "mnt")
        for point in sorted((p for p in _mountpoints() if p == mnt or p.startswith(mnt + "/")), reverse=True):
            _run(["umount", "-l", point], check=False)
        for ns in namespaces:
            _run(["ip", "netns", "del", ns], check=False)
        if self.state_dir.exists():
            shutil.rmtree(self.state_dir, ignore_errors=True)
        if self.etcd_tmpfs_dir is not None and self.etcd_tmpfs_dir.exists():
            shutil.rmtree(self.etcd_tmpfs_dir, ignore_errors=True)
        if self.inventory_dir is not None and (Path(self.inventory_dir) / "hosts.yml").exists():
            shutil.rmtree(self.inventory_dir, ignore_errors=True)
        self._count = 0


def _atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    fileutil.atomic_write(str(path), text.encode("utf-8"), mode)
