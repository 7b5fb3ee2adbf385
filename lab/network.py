# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's network: a bridge namespace (the admin machine, .1) and per host a network namespace joined to
it by a veth pair, plus a private mount namespace with its own ``/run`` and its own ``/etc/cni`` and
``/var/lib/cni`` (lab/pods.py). Nothing is created in the root network namespace: no veth, no address, no
route, so nothing is ever routed out."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import List

from lab.names import ADMIN_IP, SUBNET, Host
from lab.pods import cni_mount_script, pids_in_pods, prepare_cni_dirs
from lab.procs import kill_all, mountpoints, netns_list, pids_in_netns, run

# Linux keeps ONE ARP table for all network namespaces; its hard limit gc_thresh3 (default 1024) is
# reached by a full WireGuard mesh of ~32 lab hosts (every host resolves every other's public IP), after
# which new neighbours fail ("neighbor table overflow"): connects time out or find no route. The lab
# raises the limits (never lowers them) to what its hosts need, for every lab on the machine at once.
NEIGH_ENTRIES_PER_HOST_PAIR = 2
NEIGH_MIN = (1024, 4096, 8192)


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


def make_mount_dir(state_dir: Path) -> None:
    # Persistent mount namespaces are bind mounts of /proc/PID/ns/mnt; the folder that
    # holds them must be a private mount (as ip netns does with /run/netns).
    mnt = state_dir / "mnt"
    mnt.mkdir(parents=True, exist_ok=True)
    if str(mnt) not in mountpoints():
        run(["mount", "--bind", str(mnt), str(mnt)])
    run(["mount", "--make-private", str(mnt)])


def make_bridge(br: str) -> None:
    run(["ip", "netns", "add", br])
    run(["ip", "-n", br, "link", "set", "lo", "up"])
    run(["ip", "-n", br, "link", "add", "br0", "type", "bridge"])
    run(["ip", "-n", br, "addr", "add", "%s/%d" % (ADMIN_IP, SUBNET.prefixlen), "dev", "br0"])
    run(["ip", "-n", br, "link", "set", "br0", "up"])


def make_host(h: Host, br: str) -> None:
    run(["ip", "netns", "add", h.netns])
    run(["ip", "-n", h.netns, "link", "set", "lo", "up"])
    # Both ends are created straight inside namespaces: nothing appears in the root one.
    run(["ip", "-n", h.netns, "link", "add", "eth0", "type", "veth", "peer", "name", h.name, "netns", br])
    run(["ip", "-n", br, "link", "set", h.name, "master", "br0", "up"])
    run(["ip", "-n", h.netns, "addr", "add", "%s/%d" % (h.public_ip, SUBNET.prefixlen), "dev", "eth0"])
    run(["ip", "-n", h.netns, "link", "set", "eth0", "up"])
    h.dir.mkdir(parents=True, exist_ok=True)
    (h.dir / "agent").mkdir(exist_ok=True)
    # A private mount namespace with its own /run: wireguard-go's UAPI sockets
    # (/run/wireguard), the agent's runtime files and pid files stay per host; and its own /etc/cni and
    # /var/lib/cni (the pod network's conflist and IPAM leases, lab/pods.py).
    prepare_cni_dirs(h)
    h.mount_ns_file.touch()
    run(["unshare", "--mount=%s" % h.mount_ns_file, "--propagation", "private", "sh", "-c",
         "mount -t tmpfs -o mode=0755 lab-run /run && mkdir -p /run/wireguard /run/sshd && "
         + cni_mount_script(h)])


def remove(prefix: str, state_dir: Path) -> None:
    """Stops every process in the namespaces named ``prefix*``, unmounts the mount namespaces under
    ``state_dir/mnt``, deletes the namespaces and the state folder; safe to repeat."""
    namespaces = [ns for ns in netns_list() if ns.startswith(prefix)]
    pids = []
    for ns in namespaces:
        pids += pids_in_netns(ns)
    mnt = str(state_dir / "mnt")
    mounted = mountpoints()
    for ns_file in sorted((state_dir / "mnt").glob("*")) if (state_dir / "mnt").is_dir() else []:
        if str(ns_file) in mounted:
            pids += pids_in_pods(ns_file)  # processes in the hosts' pods (lab/pods.py)
    kill_all(sorted(set(pids)))
    for point in sorted((p for p in mountpoints() if p == mnt or p.startswith(mnt + "/")), reverse=True):
        run(["umount", "-l", point], check=False)
    for ns in namespaces:
        run(["ip", "netns", "del", ns], check=False)
    if state_dir.exists():
        shutil.rmtree(state_dir, ignore_errors=True)
