# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The etcd member a Coordinator's agent runs (agent config ``etcd_member``, docs/store.md).

Clients and peers talk to it on the Coordinator's VPN IP only (inside WireGuard), over TLS from the
chain of trust (``etcd_pki``: every Coordinator derives the same CA from the KMS; the member makes its
own key and certificate at each start). Its process is the agent's child; a pid file lets an agent
that was killed end the member it left behind before it starts a new one on the same ports.

``start(vpn_ip, kms, initial_cluster)``: a new cluster of one (``None``) or a learner joining a running
cluster (``initial_cluster`` from the leader, which added it); returns once the member serves TCP.
``open_store(vpn_ip)``: an ``EtcdStore`` on this member, once it serves a linearizable read (a learner
does not: open the store after the leader promoted it).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from typing import Any, Dict, Mapping, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError, StateError
from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_write
from ansible_collections.constellation.cluster.plugins.module_utils.store.base import StoreError
from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd import EtcdStore
from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd_argv import ETCD, member_argv
from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd_pki import etcd_ca, member_credentials

CONFIG_KEYS = ("data_dir", "client_port", "peer_port", "binary", "heartbeat_ms", "election_ms")
READY_TIMEOUT = 30.0
STOP_TIMEOUT = 5.0


def member_name(vpn_ip: str) -> str:
    return "coordinator-" + vpn_ip.replace(".", "-").replace(":", "-")


class EtcdMember:
    """One Coordinator's etcd member (``core.ports.ClusterStoreMember``)."""

    def __init__(self, data_dir: str, client_port: int = 2379, peer_port: int = 2380, binary: str = ETCD,
                 heartbeat_ms: int = 100, election_ms: int = 1000, ready_timeout: float = READY_TIMEOUT):
        self.data_dir = os.path.abspath(data_dir)
        self.client_port = client_port
        self.peer_port = peer_port
        self.binary = binary
        self.heartbeat_ms = heartbeat_ms
        self.election_ms = election_ms
        self.ready_timeout = ready_timeout
        self._proc: Optional[subprocess.Popen] = None
        self._tls: Optional[Dict[str, str]] = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any], state_dir: str) -> "EtcdMember":
        """From the agent config's ``etcd_member`` mapping; InputError names a bad key."""
        if not isinstance(config, Mapping):
            raise InputError("etcd_member", "a mapping (docs/store.md)", type(config).__name__)
        unknown = set(config) - set(CONFIG_KEYS)
        if unknown:
            raise InputError("etcd_member", "only the keys %s" % ", ".join(CONFIG_KEYS), sorted(str(k) for k in unknown))
        for name in ("client_port", "peer_port"):
            value = config.get(name, 2379 if name == "client_port" else 2380)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
                raise InputError("etcd_member." + name, "a port number between 1 and 65535", value)
        for name, low, high in (("heartbeat_ms", 10, 5000), ("election_ms", 50, 50000)):
            value = config.get(name, 100 if name == "heartbeat_ms" else 1000)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise InputError("etcd_member." + name, "milliseconds between %d and %d" % (low, high), value)
        for name in ("data_dir", "binary"):
            if name in config and (not isinstance(config[name], str) or not config[name]):
                raise InputError("etcd_member." + name, "a path", config[name])
        member = cls(config.get("data_dir") or os.path.join(state_dir, "etcd"), config.get("client_port", 2379),
                     config.get("peer_port", 2380), config.get("binary", ETCD), config.get("heartbeat_ms", 100),
                     config.get("election_ms", 1000))
        if member.client_port == member.peer_port:
            raise InputError("etcd_member.peer_port", "another port than client_port", member.peer_port)
        return member

    # -- addresses
    @staticmethod
    def member_name(vpn_ip: str) -> str:
        return member_name(vpn_ip)

    def peer_url(self, vpn_ip: str) -> str:
        return "https://%s:%d" % (vpn_ip, self.peer_port)

    def client_url(self, vpn_ip: str) -> str:
        return "https://%s:%d" % (vpn_ip, self.client_port)

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def running(self) -> bool:
        """Whether the member process this agent started still runs (False before a start and after a stop)."""
        return self.pid is not None

    def has_data(self) -> bool:
        """Whether this member ran before (its data directory holds a member)."""
        return os.path.isdir(os.path.join(self.data_dir, "data", "member"))

    # -- life cycle
    def start(self, vpn_ip: str, kms: Any, initial_cluster: Optional[str] = None) -> None:
        """Starts the member: a new cluster of one, or (``initial_cluster``) joining a running one;
        with data from an earlier run, that data decides (etcd ignores the initial cluster then)."""
        if self.pid is not None:
            return
        if not os.path.exists(self.binary):
            raise StateError("etcd_member: %s is missing (apt-get install etcd-server)" % self.binary)
        os.makedirs(self.data_dir, mode=0o700, exist_ok=True)
        self._end_left_behind()
        self._tls = self._credentials(vpn_ip, kms)
        name, peer_url = member_name(vpn_ip), self.peer_url(vpn_ip)
        argv = member_argv(name, os.path.join(self.data_dir, "data"), [self.client_url(vpn_ip)], peer_url,
                           initial_cluster or "%s=%s" % (name, peer_url),
                           "existing" if initial_cluster else "new", tls=self._tls,
                           heartbeat_ms=self.heartbeat_ms, election_ms=self.election_ms, etcd=self.binary)
        with open(os.path.join(self.data_dir, "etcd.log"), "ab") as log:
            self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)  # pylint: disable=consider-using-with
        atomic_write(os.path.join(self.data_dir, "etcd.pid"), b"%d\n" % self._proc.pid, mode=0o600)
        self._wait(lambda: self._serves_tcp(vpn_ip), "accept connections on %s" % self.client_url(vpn_ip))

    def open_store(self, vpn_ip: str, prefix: Optional[str] = None) -> EtcdStore:
        """An EtcdStore on this member once it serves a linearizable read (it has a leader, and it
        votes: a learner does not serve reads)."""
        if self._tls is None:
            raise StateError("etcd_member: the member is not started")
        opened = []

        def ready() -> bool:
            try:
                kwargs = {"prefix": prefix} if prefix else {}
                opened.append(EtcdStore([self.client_url(vpn_ip)], timeout=5, tls=self._tls, **kwargs))
                return True
            except StoreError:
                return False

        self._wait(ready, "serve reads at %s" % self.client_url(vpn_ip))
        return opened[0]

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT)

    # -- helpers
    def _credentials(self, vpn_ip: str, kms: Any) -> Dict[str, str]:
        ca_key, ca_pem = etcd_ca(kms)
        cert, key = member_credentials(ca_key, ca_pem, member_name(vpn_ip), [vpn_ip])
        tls_dir = os.path.join(self.data_dir, "tls")
        os.makedirs(tls_dir, mode=0o700, exist_ok=True)
        paths = {"ca_cert": os.path.join(tls_dir, "ca.pem"), "cert": os.path.join(tls_dir, "member.pem"),
                 "key": os.path.join(tls_dir, "member.key")}
        for name, content in (("ca_cert", ca_pem), ("cert", cert), ("key", key)):
            atomic_write(paths[name], content, mode=0o600)
        return paths

    def _end_left_behind(self) -> None:
        """A member whose agent was killed still runs (and holds the ports): end it."""
        try:
            with open(os.path.join(self.data_dir, "etcd.pid"), encoding="ascii") as handle:
                pid = int(handle.read().strip())
            with open("/proc/%d/cmdline" % pid, "rb") as handle:
                cmdline = handle.read().split(b"\0")
        except (OSError, ValueError):
            return
        if os.path.join(self.data_dir, "data").encode() not in cmdline:
            return  # another process reuses that pid
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + STOP_TIMEOUT
        while os.path.exists("/proc/%d" % pid) and time.monotonic() < deadline:
            time.sleep(0.05)

    def _serves_tcp(self, vpn_ip: str) -> bool:
        try:
            with socket.create_connection((vpn_ip, self.client_port), timeout=1):
                return True
        except OSError:
            return False

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                code = self._proc.returncode if self._proc is not None else None
                raise StateError("etcd_member: etcd exited (%s) before it could %s: %s" % (code, what, self._log_tail()))
            if ready():
                return
            time.sleep(0.05)
        raise StateError("etcd_member: etcd did not %s within %.0f s: %s" % (what, self.ready_timeout, self._log_tail()))

    def _log_tail(self) -> str:
        try:
            with open(os.path.join(self.data_dir, "etcd.log"), "rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - 600))
                return handle.read().decode("utf-8", "replace").strip().replace("\n", " | ")[-600:]
        except OSError:
            return "(no log)"
