# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pods in the lab (``python -m lab pod add|del|exec|list``): no kubelet runs here, so a pod is a network
namespace inside a host, attached by the real CNI plugins with the node's own conflist, as a container runtime
does (the collection's ``pod_network/cni.py``: ``CNI_COMMAND=ADD`` chained through the list, ``DEL`` in reverse).

Per host, its private mount namespace (lab/network.py) has its own ``/etc/cni`` and ``/var/lib/cni``: bind
mounts of ``<host dir>/cni/etc`` and ``<host dir>/cni/lib``, so the product writes its default paths (the
conflist ``/etc/cni/net.d/10-constellation.conflist``, host-local's leases under ``/var/lib/cni``) and each host
keeps its own. The mount points themselves are two empty folders of the machine's root file system, made once.

Names: pod NAME of host HOST is the network namespace ``pod-NAME`` in that host's own ``/run/netns`` (the host's
``/run`` is a tmpfs of its mount namespace, as containerd keeps its pods' namespaces in the node's
``/var/run/netns``); it is not visible in the machine's ``ip netns list``. It is reached from the root by
entering the host's mount namespace and running ``ip netns exec pod-NAME`` there (``Host.run``); its CNI
container ID is ``lab-pod-NAME`` and its interface ``eth0``. The CNI plugins run inside the host (its network
and mount namespaces: ``cni0`` and the veths' host ends are the host's, the leases its own), by
``python -m lab.pods`` with the host's Python, as lab.hostcmd runs.

``lab down`` stops the processes in every host's pods (``pids_in_pods``) with the hosts' own, and the pods'
namespaces go with the hosts' mount namespaces.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import List

from ansible_collections.constellation.cluster.plugins.module_utils.pod_network.conflist import CONFLIST_PATH
from lab.names import REPO_ROOT, Host, LabError, host_python

POD_NETNS_PREFIX = "pod-"
POD_IFNAME = "eth0"
CONTAINER_ID_PREFIX = "lab-pod-"
POD_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,15}$")
# (folder under <host dir>/cni, path inside the host): the folders the pod network writes.
CNI_MOUNTS = (("etc", "/etc/cni"), ("lib", "/var/lib/cni"))


def check_pod_name(name: str) -> str:
    if not isinstance(name, str) or not POD_NAME_RE.match(name):
        raise LabError("pod name: expected 1-16 characters [a-z0-9-] starting with a letter or digit, got %r"
                       % (name,))
    return name


def pod_netns(name: str) -> str:
    """The network namespace of pod ``name``, in its host's ``/run/netns``."""
    return POD_NETNS_PREFIX + check_pod_name(name)


# -- each host's own /etc/cni and /var/lib/cni -------------------------------------------------------------
def cni_dir(h: Host, which: str) -> Path:
    return h.dir / "cni" / which


def prepare_cni_dirs(h: Host) -> None:
    """The host's folders under its lab state, and the (empty) mount points in the root file system."""
    for which, target in CNI_MOUNTS:
        cni_dir(h, which).mkdir(parents=True, exist_ok=True)
        os.makedirs(target, exist_ok=True)


def cni_mount_script(h: Host) -> str:
    """A shell command, run inside the host's mount namespace, that bind-mounts its CNI folders (idempotent)."""
    return " && ".join("{ mountpoint -q %s || mount --bind %s %s; }"
                       % (target, shlex.quote(str(cni_dir(h, which))), target) for which, target in CNI_MOUNTS)


def ensure_cni_mounts(h: Host) -> None:
    """Mounts the host's CNI folders when they are not (a lab built before they existed)."""
    prepare_cni_dirs(h)
    proc = h.run(["sh", "-c", cni_mount_script(h)], check=False)
    if proc.returncode != 0:
        raise LabError("%s: mounting its /etc/cni and /var/lib/cni failed: %s" % (h.name, proc.stderr.strip()))


def has_cni_mounts(h: Host) -> bool:
    """Whether the host's /etc/cni and /var/lib/cni are its own."""
    script = " && ".join("mountpoint -q %s" % target for _which, target in CNI_MOUNTS)
    return h.run(["sh", "-c", script], check=False).returncode == 0


def pids_in_pods(mount_ns_file: Path) -> List[int]:
    """The processes in the pods of the host whose mount namespace is ``mount_ns_file``."""
    script = ('cd /run/netns 2>/dev/null || exit 0; for n in %s*; do [ -e "$n" ] && ip netns pids "$n"; done; exit 0'
              % POD_NETNS_PREFIX)
    proc = subprocess.run(["nsenter", "--mount=%s" % mount_ns_file, "sh", "-c", script],
                          capture_output=True, text=True, check=False)
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


# -- pods, from the root -------------------------------------------------------------------------------------
def _inside(h: Host, args: List[str], python: List[str]) -> subprocess.CompletedProcess:
    return h.run(["env", "PYTHONPATH=%s:%s" % (REPO_ROOT / "collections", REPO_ROOT)] + list(python)
                 + ["-m", "lab.pods"] + args, check=False)


def add(h: Host, name: str, python: List[str] = None) -> dict:
    """Creates pod ``name`` on host ``h`` through the CNI plugins and the host's conflist; returns
    ``{"host", "pod", "netns", "ip", "cidr", "interfaces"}`` (``ip``: the pod's address, ``cidr`` with its prefix)."""
    check_pod_name(name)
    ensure_cni_mounts(h)
    proc = _inside(h, ["add", name], python or host_python())
    if proc.returncode != 0:
        raise LabError("%s: pod add %s failed: %s" % (h.name, name, proc.stderr.strip()[-1500:]))
    result = json.loads(proc.stdout)
    address = next((a for a in result.pop("addresses", []) if "." in a), None)
    if address is None:
        raise LabError("%s: pod %s got no IPv4 address from the CNI plugins: %s" % (h.name, name, proc.stdout.strip()))
    return {"host": h.name, "pod": name, "netns": pod_netns(name), "ip": address.split("/")[0], "cidr": address,
            "interfaces": result.get("interfaces", [])}


def delete(h: Host, name: str, python: List[str] = None) -> None:
    """Stops the pod's processes, runs CNI DEL and removes its namespace; a pod that is gone is no error."""
    check_pod_name(name)
    proc = _inside(h, ["del", name], python or host_python())
    if proc.returncode != 0:
        raise LabError("%s: pod del %s failed: %s" % (h.name, name, proc.stderr.strip()[-1500:]))


def names(h: Host) -> List[str]:
    """The pods of host ``h``."""
    proc = h.run(["sh", "-c", "ls /run/netns 2>/dev/null; exit 0"], check=False)
    return sorted(n[len(POD_NETNS_PREFIX):] for n in proc.stdout.split() if n.startswith(POD_NETNS_PREFIX))


def exec_argv(name: str, argv: List[str]) -> List[str]:
    """The command that runs ``argv`` in pod ``name`` from inside its host (``Host.run``/``Host.popen`` it)."""
    return ["ip", "netns", "exec", pod_netns(name)] + list(argv)


def _existing(h: Host, name: str) -> str:
    present = names(h)
    if name not in present:
        raise LabError("%s: no pod %r (pods: %s)" % (h.name, name, ", ".join(present) or "none"))
    return name


def run(h: Host, name: str, argv: List[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    """Runs ``argv`` inside pod ``name`` of host ``h`` (LabError when there is no such pod)."""
    _existing(h, name)
    return h.run(exec_argv(name, argv), check=check, **kw)


def popen(h: Host, name: str, argv: List[str], **kw) -> subprocess.Popen:
    """Starts ``argv`` inside pod ``name`` of host ``h`` (``lab down`` stops it with the lab)."""
    _existing(h, name)
    return h.popen(exec_argv(name, argv), **kw)


# -- inside the host (python -m lab.pods) --------------------------------------------------------------------
def _cni():
    from ansible_collections.constellation.cluster.plugins.module_utils.pod_network import cni

    return cni


def _netns_path(name: str) -> str:
    return "/run/netns/%s" % pod_netns(name)


def _inside_add(name: str, conflist: str) -> int:
    if not os.path.exists(conflist):
        sys.stderr.write("no conflist %s on this host: the pod network is not applied here (site.yml, tag "
                         "podnet)\n" % conflist)
        return 1
    if os.path.exists(_netns_path(name)):
        sys.stderr.write("pod %s exists (its namespace %s)\n" % (name, _netns_path(name)))
        return 1
    cni = _cni()
    doc = cni.load_conflist(conflist)
    made = subprocess.run(["ip", "netns", "add", pod_netns(name)], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        sys.stderr.write("ip netns add %s: %s" % (pod_netns(name), made.stderr))
        return 1
    try:
        # CNI.add tears the pod down with DEL when a plugin fails; the namespace is ours to remove.
        result = cni.CNI().add(doc, CONTAINER_ID_PREFIX + name, _netns_path(name), POD_IFNAME)
    except Exception as err:  # pylint: disable=broad-except  # nothing left behind, then the error
        subprocess.run(["ip", "netns", "del", pod_netns(name)], check=False)
        sys.stderr.write("CNI ADD of pod %s: %s\n" % (name, err))
        return 1
    sys.stdout.write(json.dumps(dict(result, addresses=cni.result_addresses(result))) + "\n")
    return 0


def _inside_del(name: str, conflist: str) -> int:
    path = _netns_path(name)
    if not os.path.exists(path):
        return 0
    pids = subprocess.run(["ip", "netns", "pids", pod_netns(name)], capture_output=True, text=True,
                          check=False).stdout.split()
    if pids:
        from lab.procs import kill_all

        kill_all([int(p) for p in pids if p.isdigit()])
    if os.path.exists(conflist):
        cni = _cni()
        try:
            cni.CNI().delete(cni.load_conflist(conflist), CONTAINER_ID_PREFIX + name, path, POD_IFNAME)
        except Exception as err:  # pylint: disable=broad-except
            sys.stderr.write("CNI DEL of pod %s: %s\n" % (name, err))
            return 1
    proc = subprocess.run(["ip", "netns", "del", pod_netns(name)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="lab.pods", description="run inside a lab host: pod add|del NAME")
    p.add_argument("cmd", choices=("add", "del"))
    p.add_argument("name")
    p.add_argument("--conflist", default=CONFLIST_PATH)
    args = p.parse_args(argv)
    try:
        check_pod_name(args.name)
    except LabError as err:
        sys.stderr.write("%s\n" % err)
        return 2
    if args.cmd == "add":
        return _inside_add(args.name, args.conflist)
    return _inside_del(args.name, args.conflist)


if __name__ == "__main__":
    sys.exit(main())
