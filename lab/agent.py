# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Runs the node agent on lab hosts: ``start_agent(lab, host, **config) -> Popen``, ``stop_agent``.

The config is written to ``<host dir>/agent/config.json``; the agent runs inside the host's
network and mount namespaces (``h.popen``), with its swtpm's TCTI and the lab image's policy.
Its JSON log goes to ``<host dir>/agent/agent.log``.

A host runs the checkout's agent, or the copy installed on it (``install_agent``: ``<host dir>/install``,
the node_agent role's layout), which a reboot (``Lab.reboot``) starts again: an agent upgrade replaces that copy.
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Protocol

from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_write
from lab import snp
from lab.azure_hcl import CERT_FOLDER
from lab.image import LAB_IMAGE
from lab.names import AGENT_PORT, REPO_ROOT, Host


class AgentLab(Protocol):
    """What an agent needs of its lab (lab.lab.Lab is one)."""

    variant: str
    trusted_agents: bool
    measurements_pub_path: Path
    ek_ca_path: Path
    amd_roots_path: Path

    def sign_measurements(self, path: Path) -> Path: ...

    def init_secret_hash(self, h: Host) -> str: ...

    def agent_store(self, h: Host) -> Optional[dict]: ...

    def agent_etcd_member(self, h: Host) -> Optional[dict]: ...

    def host_python(self) -> List[str]: ...

    def host_cmd(self, h: Host, args: List[str]) -> str: ...


def agent_dir(host: Host) -> Path:
    return Path(host.dir) / "agent"


def read_sealed(lab: AgentLab, host: Host, name: str) -> Optional[bytes]:
    """A file of the agent's sealed state (core/at_rest.py: ``store.json``, ``state_disk.key``), unsealed with the
    host's TPM in its current state: what root on the genuine host can do, and a copy elsewhere cannot."""
    path = agent_dir(host) / "state" / name
    if not path.exists():
        return None
    return base64.b64decode(lab.host_cmd(host, ["--tcti", host.tcti, "--unseal-file", str(path)]).strip())


def agent_vpn_priv_key(lab: AgentLab, host: Host) -> str:
    """The agent's WireGuard private key, from its sealed store (it is kept in no other file)."""
    store = json.loads(read_sealed(lab, host, "store.json"))
    return json.loads(base64.b64decode(store["items"]["nodeState"]))["vpn_priv_key"]


def write_config(lab: AgentLab, host: Host, trust: Optional[bool] = None, **config: Any) -> Path:
    """``trust`` (default: the lab's, true for ``lab up --agents``): the agent is provisioned with the
    lab's init secret hash (its own). Every lab agent gets a policy signed with the lab's pinned key."""
    directory = agent_dir(host)
    directory.mkdir(parents=True, exist_ok=True)
    policy = directory / "measurements.json"
    if not policy.exists():
        policy.write_text(json.dumps(snp.measurements(LAB_IMAGE, lab.variant), indent=2))
    trust = lab.trusted_agents if trust is None else trust
    doc: Dict[str, Any] = {
        "state_dir": str(directory / "state"),
        "public_endpoint": "%s:%d" % (host.public_ip, AGENT_PORT),
        "tcti": host.tcti,
        "variant": lab.variant,
        "measurements": str(policy),
        "update_interval": 0.5,
        "join_interval": 0.5,
        # The lab's re-attestation (at most 30 s, as the issue asks); tests set it shorter.
        "reattest_interval": 30,
        "reattest_unreachable_limit": 4,
    }
    # Every lab agent pins the lab's measurements key and gets its policy signed when the lab writes it (the agent
    # refuses an unsigned one unless insecure_unsigned_measurements is set); a policy file changed later (by the
    # agent: signed documents only, or by a test that alters it) is never signed again here.
    if not Path(str(policy) + ".sig").exists():
        lab.sign_measurements(policy)
    doc["measurements_pub_key"] = str(lab.measurements_pub_path)
    if trust:
        doc["init_secret_hash"] = lab.init_secret_hash(host)
    else:  # an untrusted lab agent: the explicit opt-out the agent requires (it warns on every start)
        doc["insecure_unauthenticated_activation"] = True
    if lab.variant == "qemu-vtpm":  # `lab up --variant qemu-vtpm`: its acknowledgement (warned on every start)
        doc["insecure_trust_any_ak"] = True
    if lab.ek_ca_path.exists():
        doc["ek_ca"] = str(lab.ek_ca_path)
    if snp.uses_snp(lab.variant):  # the lab's AMD is the root; the host's platform service signs the reports
        doc["amd_roots"] = str(lab.amd_roots_path)
        source = snp.report_source(lab.variant, host)
        if source is not None:
            doc["snp_report_source"] = source
        if lab.variant in snp.HCL_VARIANTS:  # the VCEK the lab's "THIM" cached (lab/azure_hcl.py)
            doc["amd_cert_cache"] = str(host.dir / CERT_FOLDER)
    store = lab.agent_store(host)
    if store is not None:
        doc["store"] = store
    etcd_member = lab.agent_etcd_member(host)
    if etcd_member is not None:  # a Coordinator of a lab with several (lab up --coordinators N)
        doc["etcd_member"] = etcd_member
    doc.update({k: v for k, v in config.items() if v is not None})
    path = directory / "config.json"
    atomic_write(str(path), json.dumps(doc, indent=2).encode("utf-8"), 0o644)
    return path


def start_agent(lab: AgentLab, host: Host, wait: bool = True, kill_after_event: Optional[str] = None,
                trust: Optional[bool] = None, agent_root: Optional[Path] = None, **config: Any) -> subprocess.Popen:
    """Starts the agent on host (config keys as docs/agent.md); waits until its port answers.
    ``kill_after_event``: fault tests only; the agent dies (as under SIGKILL) right after it logs it.
    ``agent_root``: run another copy of the agent (``bin/constellation-agent`` and ``collections/``
    under it, as ``copy_agent`` makes) instead of the checkout's; by default the host's installed one
    (``install_agent``), if any."""
    return launch_agent(lab, host, write_config(lab, host, trust, **config), wait, kill_after_event, agent_root)


def launch_agent(lab: AgentLab, host: Host, path: Path, wait: bool = True, kill_after_event: Optional[str] = None,
                 agent_root: Optional[Path] = None) -> subprocess.Popen:
    """Starts the agent on host with the configuration file ``path`` as it is (a reboot keeps the configuration)."""
    log = open(agent_dir(host) / "agent.log", "ab")
    # GOMAXPROCS=1 for the host's wireguard-go (started by the agent, which passes its environment
    # on): a simulated host shares the machine's cores with every other one, and a Go runtime that
    # believes it owns them all keeps idle threads spinning for work - at 64 hosts that was the
    # largest CPU cost of an activation (bench/activation.py).
    # Another copy runs with its own collection only: the collection's packages are namespace packages, so a
    # module that copy lacks would otherwise be imported from the checkout's, behind its back.
    agent_root = agent_root or installed_agent(host)
    pythonpath = "%s:%s" % (REPO_ROOT / "collections", REPO_ROOT) if agent_root is None else Path(agent_root) / "collections"
    env = ["env", "PYTHONPATH=%s" % pythonpath, "TSS2_LOG=all+none", "GOMAXPROCS=1"]
    if kill_after_event:
        env.append("CONSTELLATION_AGENT_TEST_KILL_AFTER_EVENT=%s" % kill_after_event)
    program = Path(agent_root or REPO_ROOT) / "bin" / "constellation-agent"
    proc = host.popen(env + lab.host_python() + [str(program), "--config", str(path)],
                      stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    log.close()
    if wait:
        wait_listening(host, proc)
    return proc


CODE_DIR = Path("collections") / "ansible_collections" / "constellation" / "cluster" / "plugins" / "module_utils"


def copy_agent(dest: Path, source: Path = REPO_ROOT) -> Path:
    """A copy of the agent of ``source`` (a checkout or an exported release: its program and the collection's
    module_utils) at ``dest``, for a test that changes it; ``start_agent(agent_root=dest)`` runs it."""
    import shutil

    dest, source = Path(dest), Path(source)
    (dest / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(str(source / "bin" / "constellation-agent"), str(dest / "bin" / "constellation-agent"))
    shutil.copytree(str(source / "plugins" / "module_utils"), str(dest / CODE_DIR),
                    ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def install_dir(host: Host) -> Path:
    """Where the host's installed agent lives (the node_agent role's node_agent_install_dir on a real host)."""
    return Path(host.dir) / "install"


def installed_agent(host: Host) -> Optional[Path]:
    """The host's installed agent (``install_agent``), or None: it runs the checkout's."""
    root = install_dir(host)
    return root if (root / "bin" / "constellation-agent").exists() else None


def install_agent(host: Host, source: Path = REPO_ROOT) -> Path:
    """Installs the agent of ``source`` on the host (made beside, then swapped in whole); its next start, and
    every reboot, runs that copy. A running agent keeps running the code it loaded."""
    import shutil

    root = install_dir(host)
    new = root.parent / (root.name + ".new")
    shutil.rmtree(str(new), ignore_errors=True)
    copy_agent(new, source)
    if root.exists():
        old = root.parent / (root.name + ".old")
        shutil.rmtree(str(old), ignore_errors=True)
        root.rename(old)
        new.rename(root)
        shutil.rmtree(str(old), ignore_errors=True)
    else:
        new.rename(root)
    return root


def wait_listening(host: Host, proc: Optional[subprocess.Popen] = None, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError("agent on %s exited with %s: %s" % (host.name, proc.returncode, tail_log(host)))
        out = host.run(["ss", "-Hltn", "sport = :%d" % AGENT_PORT], check=False).stdout
        if out.strip():
            return
        time.sleep(0.1)
    raise RuntimeError("agent on %s did not listen within %.0f s: %s" % (host.name, timeout, tail_log(host)))


def stop_agent(proc: subprocess.Popen, timeout: float = 10.0, sig: int = signal.SIGTERM) -> int:
    """Stops that agent (SIGTERM: clean shutdown; SIGKILL: a crash). Returns its exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    return proc.returncode


def tail_log(host: Host, lines: int = 20) -> str:
    try:
        return "\n".join((agent_dir(host) / "agent.log").read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
