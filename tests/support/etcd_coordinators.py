# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Three Coordinators' etcd members with TLS from a cluster KMS, as the agents run them, for the store tests. Each
member runs on its own loopback address (``HOSTS``, 127.0.0.1-3), which stands for its Coordinator's VPN IP: the
registry's VPN network is 127.0.0.0/24, whose Coordinator range starts at 127.0.0.1."""

from __future__ import annotations

import base64
import os
import shutil
import time

from ansible_collections.constellation.cluster.plugins.module_utils.core.records import state_store
from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_write
from ansible_collections.constellation.cluster.plugins.module_utils.kms import ClusterKMS, MasterSecret
from ansible_collections.constellation.cluster.plugins.module_utils.store import EtcdStore, StoreError
from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd_argv import initial_cluster
from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd_pki import etcd_ca, member_credentials
from ansible_collections.constellation.cluster.plugins.module_utils.store.etcd_member import member_name
from lab.etcd import Etcd, free_ports


VPN_CIDR = "127.0.0.0/24"
HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")


def _key() -> str:
    return base64.b64encode(os.urandom(32)).decode("ascii")


class Coordinators:
    """Three etcd members as the agents run them: ``<base>/<name>/data`` and ``<base>/<name>/tls``."""

    def __init__(self, base: str):
        self.base = base
        self.kms = ClusterKMS(MasterSecret.generate())
        self.ca_key, self.ca_pem = etcd_ca(self.kms)
        self.members = {}
        self.tls = {}
        ports = {host: free_ports(2, host) for host in HOSTS}
        initial = ",".join("%s=https://%s:%d" % (member_name(h), h, ports[h][1]) for h in HOSTS)
        for host in HOSTS:
            self.members[host] = self._member(host, ports[host], initial, "new")

    def _member(self, host, ports, initial, state) -> Etcd:
        name = member_name(host)
        tls_dir = os.path.join(self.base, name, "tls")
        os.makedirs(tls_dir, exist_ok=True)
        cert, key = member_credentials(self.ca_key, self.ca_pem, name, [host])
        self.tls[host] = {"ca_cert": os.path.join(tls_dir, "ca.pem"), "cert": os.path.join(tls_dir, "member.pem"),
                          "key": os.path.join(tls_dir, "member.key")}
        for field, content in (("ca_cert", self.ca_pem), ("cert", cert), ("key", key)):
            atomic_write(self.tls[host][field], content, mode=0o600)
        return Etcd(os.path.join(self.base, name, "data"), ports[0], ports[1], host=host, name=name,
                    initial_cluster=initial, heartbeat_ms=50, election_ms=500, tls=self.tls[host],
                    initial_cluster_state=state)

    def start(self) -> "Coordinators":
        for member in self.members.values():
            member.start(wait=False)
        for member in self.members.values():
            member.wait_ready()
        with self.store(HOSTS[0]) as store:
            def add(registry):
                for dummy in HOSTS:
                    registry.add(_key(), None, "coordinator")
                registry.add(_key(), "192.0.2.11", "node")

            state_store.update_peer_registry(store, add, VPN_CIDR)
        return self

    def replace(self, host: str) -> Etcd:
        """A new member on ``host`` (fresh data), added as the agents add one: learner, start, promote."""
        with self.store(HOSTS[0]) as store:
            ports = free_ports(2, host)
            peer_url = "https://%s:%d" % (host, ports[1])
            member_id = store.member_add(peer_url, learner=True)
            initial = initial_cluster(store.member_list(), member_name(host), peer_url)
            shutil.rmtree(os.path.join(self.base, member_name(host)), ignore_errors=True)
            self.members[host] = self._member(host, ports, initial, "existing")
            self.members[host].start(wait=False)
            store.member_promote(member_id)
        return self.members[host].wait_ready()

    def store(self, host: str, timeout: float = 2) -> EtcdStore:
        """A store on the member at ``host``, once it serves reads (after a kill the others elect a leader)."""
        deadline = time.monotonic() + 15
        while True:
            try:
                return EtcdStore([self.members[host].url], timeout=timeout, tls=self.tls[host])
            except StoreError:
                if time.monotonic() >= deadline:
                    raise
            time.sleep(0.1)

    def stop(self) -> None:
        for member in self.members.values():
            member.stop()
