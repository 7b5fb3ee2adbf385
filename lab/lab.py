# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab: N simulated hosts on one machine (docs/site.md, "The lab").

Each host is a network namespace ``cl-<lab>-h<i>`` joined to the others through a bridge
namespace ``cl-<lab>-br`` (which also holds the admin address .1, the "operator's machine").
Each host also gets a private mount namespace with its own ``/run`` (so ``wireguard-go``'s
UAPI sockets and pid files never collide), its own swtpm on 127.0.0.1:2321 inside its network
namespace, and a directory where its node agent runs.

Everything the lab creates can be found again from names alone (namespace prefix, state dir),
so ``down`` cleans up after a crash of ``up`` half-way, and ``up`` repairs a broken lab.

``Lab`` composes the lab's parts, one module each: names (lab/names.py), the state record
(lab/state.py), the network (lab/network.py), the TPMs and measured boot (lab/tpms.py, lab/image.py),
the trust material (lab/trust.py), the inventories (lab/inventory.py) and the agents (lab/agent.py).
It reads its state record once (``Lab(...)``) and writes it whole when ``up``/``grow``/``down`` change it.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from lab import network, pods, snp, ssh, tpms
from lab.agent import agent_dir, install_agent, launch_agent, start_agent
from lab.etcd import Etcd, tmpfs_dir
from lab.image import LAB_IMAGE
from lab.inventory import local_inventory_path, write_inventory
from lab.names import (ETCD_CLIENT_PORT, LAB_ETCD_MEMBER, LAB_STORES, LAB_VARIANT, MAX_COORDINATORS, MAX_HOSTS,
                       REPO_ROOT, STATE_ROOT, Host, LabError, bridge_netns, check_name, host_cmd, host_python,
                       hosts_of, ns_prefix)
from lab.network import raise_neighbour_limits
from lab.procs import is_zombie, kill_all, mountpoints, netns_list, pids_in_netns
from lab.state import LabState
from lab.trust import LabTrust


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


@dataclass
class Lab:
    name: str = "lab"
    state_root: Path = field(default_factory=lambda: STATE_ROOT)
    inventory_dir: Optional[Path] = None

    def __post_init__(self):
        check_name(self.name)
        self.state_root = Path(self.state_root)
        if self.inventory_dir is None:
            # The default lab's inventory is the project's inventories/lab; any other lab's
            # lives in its state directory (removed with it by `down`).
            self.inventory_dir = (REPO_ROOT / "inventories" / "lab" if self.name == "lab"
                                  else self.state_dir / "inventory")
        self.trust = LabTrust(self.state_dir)
        self.state = LabState.load(self.state_dir)

    def _save(self) -> None:
        self.state.save(self.state_dir)

    # -- names ------------------------------------------------------------------------
    @property
    def state_dir(self) -> Path:
        return self.state_root / self.name

    @property
    def bridge_netns(self) -> str:
        return bridge_netns(self.name)

    @property
    def ns_prefix(self) -> str:
        return ns_prefix(self.name)

    @property
    def ca_dir(self) -> Path:
        return self.trust.ca_dir

    @property
    def hosts(self) -> List[Host]:
        return hosts_of(self.name, self.state_dir, self.state.hosts)

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise LabError("no host %r in lab %r (hosts: %s)" % (name, self.name, ", ".join(h.name for h in self.hosts)))

    @property
    def coordinators(self) -> List[Host]:
        """The lab's Coordinators: its first N hosts (``up(coordinators=N)``); the others are Nodes."""
        return self.hosts[:self.state.coordinators]

    @property
    def store(self) -> str:
        return self.state.store

    @property
    def variant(self) -> str:
        return self.state.variant

    @property
    def uses_snp(self) -> bool:
        """Whether the lab's hosts attest with SEV-SNP reports of their lab platform (lab/snp.py)."""
        return snp.uses_snp(self.variant)

    @property
    def trusted_agents(self) -> bool:
        """Whether the agents the lab starts get the init secret hash and the signed policy."""
        return self.state.trust

    def admin_run(self, argv: List[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
        """Runs argv on the admin machine: the bridge namespace, address .1."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(["ip", "netns", "exec", self.bridge_netns] + list(argv), check=check, **kw)

    # -- up and grow ------------------------------------------------------------------
    def up(self, hosts: int = 3, tpm: bool = True, image: str = LAB_IMAGE, agents: bool = False,
           variant: str = LAB_VARIANT, store: str = "file", coordinators: int = 1, bare: bool = False) -> "Lab":
        """``bare``: bare hosts (no agent, an sshd each: lab/ssh.py), what playbooks/bootstrap.yml starts from."""
        from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose

        choose.spec(variant, "variant")
        if store not in LAB_STORES:
            raise LabError("store: expected one of %s, got %r" % (", ".join(LAB_STORES), store))
        if not 1 <= hosts <= MAX_HOSTS:
            raise LabError("hosts: expected 1..%d, got %d" % (MAX_HOSTS, hosts))
        if agents and not tpm:
            raise LabError("agents: the node agent needs a TPM (do not combine agents with --no-tpm)")
        if bare and agents:
            raise LabError("bare: bare hosts have no agent (playbooks/bootstrap.yml installs it); do not combine "
                           "--bare with --agents")
        check_coordinators(coordinators, hosts, store)
        # trust: the agents the lab starts itself (--agents, the operator's lab) are provisioned with the lab's
        # init secret hash and its signed measurements (tests that start agents themselves opt in).
        wanted = LabState(phase="building", hosts=hosts, tpm=tpm, image=image, agents=agents, variant=variant,
                          store=store, trust=agents, coordinators=coordinators, sshd=bare)
        self.state = LabState.load(self.state_dir)
        if self.state.phase == "up" and self.state.same_build(wanted) and self.healthy():
            return self
        # Anything else (a crash half-way, another size): start from a clean slate.
        self.down()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.state = wanted
        self._save()
        network.make_mount_dir(self.state_dir)
        raise_neighbour_limits(hosts)
        network.make_bridge(self.bridge_netns)
        for h in self.hosts:
            network.make_host(h, self.bridge_netns)
        if tpm:
            tpms.start_tpms(self.hosts, image, self.trust, self.host_python())
        self._start_platforms(self.hosts)
        self._start_sshds(self.hosts)
        if agents:
            if store == "etcd":
                self.start_etcd()
            self._start_agents(self.hosts)
        self.state.phase = "up"
        self._save()
        self.write_inventory()
        return self

    def grow(self, hosts: int) -> List[Host]:
        """Adds hosts to a running lab (as new machines booting); returns the new ones."""
        self.state = LabState.load(self.state_dir)
        if self.state.phase != "up":
            raise LabError("lab %r is not up: run `python -m lab up` first" % self.name)
        old = self.state.hosts
        if not old < hosts <= MAX_HOSTS:
            raise LabError("hosts: expected %d..%d (the lab has %d), got %d" % (old + 1, MAX_HOSTS, old, hosts))
        self.state.phase, self.state.hosts = "building", hosts
        self._save()
        raise_neighbour_limits(hosts)
        new = self.hosts[old:]
        for h in new:
            network.make_host(h, self.bridge_netns)
        if self.state.tpm:
            tpms.start_tpms(new, self.state.image, self.trust, self.host_python())
        self._start_platforms(new)
        self._start_sshds(new)
        if self.state.agents:
            self._start_agents(new)
        self.state.phase = "up"
        self._save()
        self.write_inventory()
        return new

    def _start_platforms(self, hosts: List[Host]) -> None:
        """The SEV-SNP variants: the lab's AMD (made once) and each host's platform service (lab/snp.py)."""
        if not self.uses_snp:
            return
        self.trust.amd.ensure()
        for h in hosts:
            snp.start_platform(h, self.state.image_of(h.name), self.variant, self.host_python())
            self._boot_hcl(h)

    def _boot_hcl(self, h: Host) -> None:
        """``azure-sev-snp``: what Azure's paravisor does at each boot, in the host's swtpm (lab/azure_hcl.py: the AK,
        the HCL report of the host's platform in NV 0x01400001, the VCEK cache)."""
        if self.variant in snp.HCL_VARIANTS and self.state.tpm:
            host_cmd(h, ["--tcti", h.tcti, "--azure-hcl", str(h.dir), str(h.state_dir)], self.host_python())

    def _start_sshds(self, hosts: List[Host]) -> None:
        """``up --bare``: the lab's SSH key (once) and an sshd on each host (lab/ssh.py)."""
        if not self.state.sshd:
            return
        ssh.ensure_lab_key(self.state_dir, self.name, self.host_python())
        for h in hosts:
            ssh.start_sshd(h, self.state_dir)

    def _start_agents(self, hosts: List[Host]) -> None:
        """Starts the node agent on each host (in its namespaces; lab.down stops them)."""
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda h: start_agent(self, h), hosts))

    # -- the Coordinators' store ----------------------------------------------------------
    def etcd(self) -> Etcd:
        """The Coordinator's etcd (store etcd): h1's namespace, its loopback, data in the lab's state."""
        return Etcd(str(self.state_dir / "etcd" / "data"), ETCD_CLIENT_PORT, ETCD_CLIENT_PORT + 1,
                    name="coordinator", netns=self.hosts[0].netns)

    def start_etcd(self) -> Etcd:
        return self.etcd().start()

    def agent_store(self, h: Host) -> Optional[dict]:
        """The store setting of the agent on ``h`` (None: the agent's default file store)."""
        if self.store == "etcd" and h.name == self.hosts[0].name:
            return {"type": "etcd", "endpoints": ["127.0.0.1:%d" % ETCD_CLIENT_PORT]}
        return None

    @property
    def etcd_tmpfs_dir(self) -> Optional[Path]:
        """Where the Coordinators' etcd members keep their data: on tmpfs (etcd's fsyncs are then nearly
        free), one folder per lab and state root, removed by ``down``; None without a tmpfs."""
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

    # -- TPMs and measured boot (lab/tpms.py) ----------------------------------------------
    def host_python(self) -> List[str]:
        return host_python()

    def host_cmd(self, h: Host, args: List[str]) -> str:
        """Runs ``python -m lab.hostcmd ARGS`` inside host h; returns its stdout."""
        return host_cmd(h, args, self.host_python())

    def measure(self, h: Host, digests: Dict[int, bytes]) -> None:
        tpms.measure(h, digests, self.host_python())

    def reboot_tpm(self, name: str) -> None:
        """A reboot of the host's machine (tpms.reboot) into the image it booted last. Stop the host's agent first
        and start it after."""
        tpms.reboot(self.host(name), self.state.image_of(name), self.trust, self.host_python())

    def reimage(self, name: str, image: str) -> None:
        """A reboot of the host's machine into another image (its boot chain measures ``image`` into PCRs 4, 9,
        11: image.lab_measurements(image) is its policy). A running lab agent is stopped before and started after,
        as the machine's init would, with the configuration it had (a test's agent included) and from the code
        installed on the host (``install_agent``; the checkout's where none is)."""
        if not image or "/" in image:
            raise LabError("image: expected an image name, got %r" % image)
        h = self.host(name)
        agent_pids = self._agent_pids(h)
        kill_all(agent_pids)
        self.state.host_images[name] = image
        if image == self.state.image:
            self.state.host_images.pop(name)
        self._save()
        tpms.reboot(h, image, self.trust, self.host_python())
        if self.uses_snp:
            snp.reimaged(h, image)
            self._boot_hcl(h)
        if agent_pids:
            launch_agent(self, h, agent_dir(h) / "config.json")

    def reboot(self, name: str) -> None:
        """A reboot of the host's machine into the image it booted last: what an agent upgrade needs (PCR 13
        returns to zero only at a reboot, docs/site.md, "Upgrade the agent"). The agent is stopped, the TPM
        rebooted, and the agent started again from the host's installed code with its configuration."""
        self.reimage(name, self.state.image_of(name))

    def stop_agent(self, name: str) -> None:
        """The host's agent stops (kill_all: SIGTERM, then SIGKILL): to the cluster the host is dead - its endpoint
        refuses connections. ``reboot`` starts it again (a reboot resets PCR 15: recover.yml brings it back)."""
        kill_all(self._agent_pids(self.host(name)))

    def install_agent(self, name: str, source: Path = REPO_ROOT) -> Path:
        """Installs the agent of ``source`` (a checkout or an exported release) on the host: its next start and
        every reboot run that copy (lab/agent.py's install_agent)."""
        return install_agent(self.host(name), Path(source))

    def tamper(self, name: str, pcr: int = 9) -> None:
        """Stands for a modified host: its boot chain measured something else."""
        tpms.tamper(self.host(name), pcr, self.host_python())

    def tamper_snp(self, name: str, what: str) -> None:
        """Stands for a modified guest or platform of an SEV-SNP host (lab/snp.py's ``tamper``: ``debug``,
        ``measurement``, ``tcb``, ``foreign``; ``genuine`` undoes them). Its next report shows it."""
        if not self.uses_snp:
            raise LabError("snp: lab %r runs variant %s, which uses no SEV-SNP report" % (self.name, self.variant))
        h = self.host(name)
        snp.tamper(h, what, self.state.image_of(name))

    def foreign_tpm(self, name: str) -> None:
        """Stands for a host whose TPM is not from our vendor (tpms.replace_with_foreign); a running agent
        is restarted fresh on the new TPM."""
        h = self.host(name)
        agent_pids = self._agent_pids(h)
        kill_all(agent_pids)
        tpms.replace_with_foreign(h, self.state_dir, self.state.image, self.host_python())
        if agent_pids:
            self._start_agents([h])

    # -- pods (lab/pods.py) ------------------------------------------------------------------
    def pod_add(self, host: str, name: str) -> dict:
        """Pod ``name`` on ``host``: a network namespace attached by the CNI plugins with the host's conflist."""
        return pods.add(self.host(host), name, self.host_python())

    def pod_del(self, host: str, name: str) -> None:
        pods.delete(self.host(host), name, self.host_python())

    def pod_run(self, host: str, name: str, argv: List[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
        """Runs ``argv`` inside pod ``name`` of ``host``."""
        return pods.run(self.host(host), name, argv, check=check, **kw)

    def pods(self, host: str) -> List[str]:
        return pods.names(self.host(host))

    # -- trust material (lab/trust.py) ------------------------------------------------------
    @property
    def init_secret_path(self) -> Path:
        return self.trust.init_secret_path

    def init_secret(self) -> str:
        return self.trust.init_secret()

    def init_secret_hash(self, h: Host) -> str:
        """What host ``h``'s agent is provisioned with (its own init secret's SHA-256)."""
        return self.trust.init_secret_hash(h.public_ip)

    @property
    def measurements_pub_path(self) -> Path:
        return self.trust.measurements_pub_path

    def sign_measurements(self, path: Path) -> Path:
        return self.trust.sign_measurements(path)

    @property
    def ek_ca_path(self) -> Path:
        return self.trust.ek_ca_path

    @property
    def amd_roots_path(self) -> Path:
        return self.trust.amd_roots_path

    # -- inventory (lab/inventory.py) ---------------------------------------------------------
    def write_inventory(self) -> Optional[Path]:
        if self.inventory_dir is None:
            return None
        return write_inventory(Path(self.inventory_dir), self.name, self.state_dir, self.state, self.hosts,
                               len(self.coordinators), self.trust, self.host_python())

    @property
    def local_inventory(self) -> Path:
        return local_inventory_path(self.state_dir)

    # -- status -------------------------------------------------------------------------
    def status(self) -> List[dict]:
        existing = set(netns_list())
        mounts = mountpoints()
        rows = [{
            "host": h.name,
            "netns": h.netns in existing,
            "public_ip": h.public_ip,
            "mount_ns": str(h.mount_ns_file) in mounts,
            "cni_dirs": str(h.mount_ns_file) in mounts and pods.has_cni_mounts(h),
            "tpm": self._tpm_alive(h),
            "agent": bool(self._agent_pids(h, existing)),
            "sshd": bool(ssh.sshd_pid(h)),
        } for h in self.hosts]
        if self.state.phase and self.uses_snp:
            for row, h in zip(rows, self.hosts):
                row.update(snp.status(h))
        return rows

    @staticmethod
    def _tpm_alive(h: Host) -> bool:
        try:
            pid = int((h.dir / "tpm" / "swtpm.pid").read_text().strip())
        except (OSError, ValueError):
            return False
        return not is_zombie(pid)

    @staticmethod
    def _agent_pids(h: Host, existing: Optional[set] = None) -> List[int]:
        """The pids of the agents running on ``h`` (by their command line, in its namespace)."""
        if h.netns not in (existing if existing is not None else netns_list()):
            return []
        pids = []
        for pid in pids_in_netns(h.netns):
            try:
                if b"constellation-agent" in Path("/proc/%d/cmdline" % pid).read_bytes() and not is_zombie(pid):
                    pids.append(pid)
            except OSError:
                continue
        return pids

    def healthy(self) -> bool:
        state = self.state
        if state.phase != "up" or self.bridge_netns not in netns_list():
            return False
        for row in self.status():
            if not (row["netns"] and row["mount_ns"] and row["cni_dirs"] and (row["tpm"] or not state.tpm)
                    and (row["agent"] or not state.agents) and (row["sshd"] or not state.sshd)
                    and row.get("snp_platform", True)):
                return False
        if state.agents and state.store == "etcd":
            return any(_comm(pid) == "etcd" for pid in pids_in_netns(self.hosts[0].netns))
        return True

    # -- down ---------------------------------------------------------------------------
    def down(self) -> None:
        """Removes every namespace, process, mount and file of this lab; safe to repeat."""
        network.remove(self.ns_prefix, self.state_dir)
        if self.etcd_tmpfs_dir is not None and self.etcd_tmpfs_dir.exists():
            shutil.rmtree(self.etcd_tmpfs_dir, ignore_errors=True)
        if self.inventory_dir is not None and (Path(self.inventory_dir) / "hosts.yml").exists():
            shutil.rmtree(self.inventory_dir, ignore_errors=True)
        self.state = LabState()


def _comm(pid: int) -> str:
    try:
        return Path("/proc/%d/comm" % pid).read_text().strip()
    except OSError:
        return ""
