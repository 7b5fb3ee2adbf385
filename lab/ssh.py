# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An sshd per lab host (``lab up --bare``): what a bare Debian host offers before its agent is installed
(playbooks/bootstrap.yml reaches it over SSH as root with the lab's key).

The lab's key pair and the known hosts file live in ``<state dir>/ssh``; each host's host key, sshd
configuration, pid file and log in ``<host dir>/ssh``. sshd runs in the host's network and mount
namespaces (so a session sees the host's own ``/run``), on its public IP, port 22. The controller (root
namespace) cannot route to the lab's addresses: ssh reaches them through ``<state dir>/bin/ssh-proxy``,
a ProxyCommand that relays the connection from the admin machine's namespace (lab/ssh_proxy.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Dict, List

from lab.names import REPO_ROOT, Host, LabError, bridge_netns
from lab.procs import is_zombie
from lab.trust import write_text

SSHD = "/usr/sbin/sshd"
SSH_PORT = 22


def ssh_dir(state_dir: Path) -> Path:
    return Path(state_dir) / "ssh"


def key_path(state_dir: Path) -> Path:
    """The lab's SSH private key (0600): root on every host accepts it."""
    return ssh_dir(state_dir) / "id_ed25519"


def known_hosts_path(state_dir: Path) -> Path:
    return ssh_dir(state_dir) / "known_hosts"


def proxy_path(state_dir: Path) -> Path:
    return Path(state_dir) / "bin" / "ssh-proxy"


def _keygen(path: Path, comment: str) -> None:
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise LabError("ssh-keygen %s failed: %s" % (path, proc.stderr.strip()))


def ensure_lab_key(state_dir: Path, lab_name: str, python: List[str]) -> Path:
    """The lab's key pair, its authorized_keys and the ProxyCommand wrapper, made once per lab."""
    key = key_path(state_dir)
    _keygen(key, "constellation-lab-%s" % lab_name)
    key.chmod(0o600)
    write_text(ssh_dir(state_dir) / "authorized_keys", Path(str(key) + ".pub").read_text(), mode=0o600)
    proxy = proxy_path(state_dir)
    proxy.parent.mkdir(parents=True, exist_ok=True)
    write_text(proxy, "#!/bin/sh\n# ssh ProxyCommand of lab %s: relays HOST PORT from the admin machine's namespace.\n"
                      "exec ip netns exec %s %s %s \"$1\" \"$2\"\n"
               % (lab_name, bridge_netns(lab_name), python[0], REPO_ROOT / "lab" / "ssh_proxy.py"), mode=0o755)
    return key


def _host_dir(h: Host) -> Path:
    return Path(h.dir) / "ssh"


def start_sshd(h: Host, state_dir: Path) -> None:
    """Starts sshd in the host's namespaces (it forks into the background); its host key is made once."""
    folder = _host_dir(h)
    host_key = folder / "ssh_host_ed25519_key"
    _keygen(host_key, "root@%s" % h.name)
    config = folder / "sshd_config"
    write_text(config, "\n".join([
        "# sshd of lab host %s (lab/ssh.py)" % h.name,
        "ListenAddress %s:%d" % (h.public_ip, SSH_PORT),
        "HostKey %s" % host_key,
        "PidFile %s" % (folder / "sshd.pid"),
        "AuthorizedKeysFile %s" % (ssh_dir(state_dir) / "authorized_keys"),
        "PermitRootLogin prohibit-password",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "UseDNS no",
        "Subsystem sftp internal-sftp",
        ""]))
    log = folder / "sshd.log"
    # /run/sshd (the privilege separation folder) is made in the host's /run by network.make_host.
    proc = h.run(["sh", "-c", "mkdir -p /run/sshd && exec %s -f %s -E %s" % (SSHD, config, log)], check=False)
    if proc.returncode != 0:
        raise LabError("sshd on %s did not start: %s %s" % (h.name, proc.stderr.strip(), _tail(log)))
    known = known_hosts_path(state_dir)
    line = "%s %s" % (h.public_ip, " ".join(Path(str(host_key) + ".pub").read_text().split()[:2]))
    lines = [ln for ln in (known.read_text().splitlines() if known.exists() else [])
             if ln.split(" ", 1)[0] != h.public_ip]
    write_text(known, "\n".join(lines + [line]) + "\n")


def sshd_pid(h: Host) -> int:
    """sshd's pid on the host, 0 when it does not run."""
    try:
        pid = int((_host_dir(h) / "sshd.pid").read_text().strip())
    except (OSError, ValueError):
        return 0
    return 0 if is_zombie(pid) else pid


def _tail(path: Path) -> str:
    try:
        return " / ".join(path.read_text(errors="replace").splitlines()[-5:])
    except OSError:
        return ""


def inventory_vars(state_dir: Path, lab_name: str) -> Dict[str, str]:
    """What playbooks/bootstrap.yml needs to reach the lab's hosts over SSH (the lab's group variables)."""
    return {
        "ansible_user": "root",
        "ansible_ssh_private_key_file": str(key_path(state_dir)),
        # The lab's addresses exist only in its namespaces: the ProxyCommand relays from the admin machine's.
        # Its own control sockets: another lab's hosts have the same addresses.
        "ansible_ssh_common_args": "-o ProxyCommand='%s %%h %%p' -o UserKnownHostsFile=%s "
                                   "-o StrictHostKeyChecking=yes -o IdentitiesOnly=yes"
                                   % (proxy_path(state_dir), known_hosts_path(state_dir)),
        "ansible_control_path_dir": str(ssh_dir(state_dir) / "cp"),
    }


def host_vars(h: Host) -> Dict[str, str]:
    """Per host: the node_agent role's folders in the host's own folder (the lab's hosts share one file
    system), its TPM, and no systemd (the agent runs under start-stop-daemon)."""
    root = Path(h.dir) / "node"
    return {
        "node_agent_config_dir": str(root / "etc"),
        "node_agent_state_dir": str(root / "state"),
        "node_agent_unit_dir": str(root / "systemd"),
        "node_agent_tcti": h.tcti,
        "node_agent_service_manager": "process",
    }
