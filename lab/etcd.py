# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A real etcd (Debian's etcd-server 3.4) on loopback, for the lab and the tests.

``Etcd(data_dir, client_port, peer_port).start()`` runs ``/usr/bin/etcd`` as its own process
(its pid is kept; ``stop()`` ends exactly that process), waits until the client port answers,
and ``endpoint`` gives ``127.0.0.1:<client_port>`` for ``EtcdStore``. Restarting with the same
``data_dir`` keeps the data. A tmpfs directory (/dev/shm) keeps the fsyncs cheap.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from typing import List, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.errors import StateError
from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_write
from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd_argv import ETCD, member_argv

_READY_TIMEOUT = 10.0
_STOP_TIMEOUT = 5.0


def free_ports(count: int, bindaddr: str = "127.0.0.1") -> List[int]:
    """``count`` distinct ports that were free just now (held open together while choosing)."""
    socks = []
    try:
        for dummy in range(count):
            sock = socket.socket()
            sock.bind((bindaddr, 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def tmpfs_dir() -> Optional[str]:
    """/dev/shm if it is a writable directory (etcd's fsyncs are then nearly free), else None."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


class Etcd:
    """One single-member etcd: ``start()``, ``stop()``, ``endpoint``."""

    def __init__(self, data_dir: str, client_port: int, peer_port: int, host: str = "127.0.0.1",
                 name: str = "lab", extra_args: Optional[List[str]] = None, netns: Optional[str] = None,
                 initial_cluster: Optional[str] = None, heartbeat_ms: int = 10, election_ms: int = 100,
                 tls: Optional[dict] = None, initial_cluster_state: str = "new"):
        self.netns = netns  # run inside this network namespace (a lab host's), on its loopback
        # "name=peer_url,..." of every member of the cluster (EtcdCluster); None: a cluster of one.
        self.initial_cluster = initial_cluster
        self.initial_cluster_state = initial_cluster_state  # "existing": joins a running cluster
        self.heartbeat_ms = heartbeat_ms
        self.election_ms = election_ms
        # {"ca_cert", "cert", "key"} (paths): https for clients and peers, each must show a certificate
        # of that CA; the same cert serves as this member's server, peer and client certificate.
        self.tls = dict(tls) if tls else None
        self.data_dir = os.path.abspath(data_dir)
        self.client_port = int(client_port)
        self.peer_port = int(peer_port)
        self.host = host
        self.name = name
        self.extra_args = list(extra_args or [])
        self.log_path = self.data_dir.rstrip("/") + ".log"
        self._proc: Optional[subprocess.Popen] = None

    @property
    def endpoint(self) -> str:
        return "%s:%d" % (self.host, self.client_port)

    @property
    def url(self) -> str:
        return "%s://%s" % ("https" if self.tls else "http", self.endpoint)

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc is not None else None

    @property
    def peer_url(self) -> str:
        return "%s://%s:%d" % ("https" if self.tls else "http", self.host, self.peer_port)

    def argv(self) -> List[str]:
        return (["ip", "netns", "exec", self.netns] if self.netns else []) + member_argv(
            self.name, self.data_dir, [self.url], self.peer_url,
            self.initial_cluster or "%s=%s" % (self.name, self.peer_url), self.initial_cluster_state,
            tls=self.tls, heartbeat_ms=self.heartbeat_ms, election_ms=self.election_ms) + self.extra_args

    def start(self, wait: bool = True) -> "Etcd":
        """Starts etcd and (``wait``) waits until it serves a linearizable read. A member of a new
        cluster serves none before a majority runs: EtcdCluster starts them all, then waits."""
        if self._proc is not None and self._proc.poll() is None:
            return self
        if not os.path.exists(ETCD):
            raise StateError("%s is missing (apt-get install etcd-server)" % ETCD)
        os.makedirs(self.data_dir, mode=0o700, exist_ok=True)
        os.chmod(self.data_dir, 0o700)
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                          start_new_session=True)
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self) -> "Etcd":
        if self.netns:
            from lab.netns import NetNS

            with NetNS(self.netns) as ns:
                self._wait_ready(lambda: ns.run(self._ready))
        else:
            self._wait_ready(self._ready)
        return self

    def _wait_ready(self, ready) -> None:
        deadline = time.monotonic() + _READY_TIMEOUT
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                rc = self._proc.returncode
                self._proc = None
                raise StateError("etcd exited with %d at start-up: %s" % (rc, self._log_tail()))
            if ready():
                return
            time.sleep(0.02)
        self.stop()
        raise StateError("etcd on %s not ready within %.0f s: %s" % (self.endpoint, _READY_TIMEOUT, self._log_tail()))

    def _ready(self) -> bool:
        # A linearizable read succeeds only once the member has a leader.
        req = urllib.request.Request(self.url + "/v3/kv/range", data=json.dumps({"key": "AA=="}).encode(),
                                     headers={"Content-Type": "application/json"})
        context = None
        if self.tls:
            context = ssl.create_default_context(cafile=self.tls["ca_cert"])
            context.load_cert_chain(self.tls["cert"], self.tls["key"])
        try:
            with urllib.request.urlopen(req, timeout=1, context=context) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def _log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as handle:
                return handle.read()[-800:].decode("utf-8", "replace").strip()
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Ends this etcd (SIGTERM to its pid, SIGKILL after a grace period); the data dir stays."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=_STOP_TIMEOUT)

    def kill(self) -> None:
        """SIGKILL (a crash), for tests of recovery."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=_STOP_TIMEOUT)

    def destroy(self) -> None:
        """Stops etcd and removes its data dir and log."""
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        try:
            os.unlink(self.log_path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> "Etcd":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class EtcdCluster:
    """``size`` etcd members of one new cluster on loopback (free ports), data under ``base_dir``:
    ``start()`` starts every member, then waits until each serves a linearizable read (a majority
    runs); ``members[i]`` is an :class:`Etcd` to stop, kill or start again; ``endpoints`` lists
    every member's client endpoint for ``EtcdStore``."""

    def __init__(self, base_dir: str, size: int = 3, heartbeat_ms: int = 50, election_ms: int = 500,
                 kms=None):
        """``kms``: a ClusterKMS; with it, TLS everywhere from the etcd CA derived from its master
        secret (store/etcd_pki.py) and ``client_tls`` for ``EtcdStore(tls=...)``."""
        if size < 1:
            raise ValueError("an etcd cluster needs at least one member")
        ports = free_ports(2 * size)
        names = ["m%d" % i for i in range(size)]
        self.client_tls: Optional[dict] = None
        tls_of = {}
        if kms is not None:
            from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd_pki import (
                etcd_ca, member_credentials)

            ca_key, ca_pem = etcd_ca(kms)
            os.makedirs(base_dir, exist_ok=True)
            for who in names + ["client"]:
                cert, key = member_credentials(ca_key, ca_pem, who, [])
                paths = {"ca_cert": os.path.join(base_dir, "ca.pem"), "cert": os.path.join(base_dir, who + ".pem"),
                         "key": os.path.join(base_dir, who + ".key")}
                for path, data in ((paths["ca_cert"], ca_pem), (paths["cert"], cert), (paths["key"], key)):
                    atomic_write(path, data, mode=0o600)  # the keys are private; the rest does no harm so
                tls_of[who] = paths
            self.client_tls = tls_of["client"]
        scheme = "https" if kms is not None else "http"
        initial = ",".join("%s=%s://127.0.0.1:%d" % (name, scheme, ports[2 * i + 1]) for i, name in enumerate(names))
        self.members = [Etcd(os.path.join(base_dir, name), ports[2 * i], ports[2 * i + 1], name=name,
                             initial_cluster=initial, heartbeat_ms=heartbeat_ms, election_ms=election_ms,
                             tls=tls_of.get(name))
                        for i, name in enumerate(names)]

    @property
    def endpoints(self) -> List[str]:
        return [member.url for member in self.members]

    def start(self) -> "EtcdCluster":
        try:
            for member in self.members:
                member.start(wait=False)
            for member in self.members:
                member.wait_ready()
        except Exception:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for member in self.members:
            member.stop()

    def __enter__(self) -> "EtcdCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
