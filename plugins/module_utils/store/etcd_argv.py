# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One etcd member per Coordinator: its command line, and how the cluster grows and shrinks.

The first Coordinator runs a member of a new cluster of one. A further Coordinator joins only
through the leader: the leader adds the member's peer URL (``EtcdStore.member_add``), which returns
the ``initial_cluster`` the new member starts with (``initial_cluster_state="existing"``). A dead
Coordinator is replaced by removing its member (``EtcdStore.member_remove``) and adding the new one.
"""

from __future__ import annotations

import hashlib
from typing import Iterable, List, Mapping, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError

ETCD = "/usr/bin/etcd"
CLUSTER_STATES = ("new", "existing")


def member_argv(name: str, data_dir: str, client_urls: Iterable[str], peer_url: str, initial_cluster: str,
                initial_cluster_state: str = "new", tls: Optional[Mapping[str, str]] = None,
                heartbeat_ms: int = 100, election_ms: int = 1000, etcd: str = ETCD) -> List[str]:
    """The command line of the member ``name``. ``tls`` ({"ca_cert", "cert", "key"}): https for clients
    and peers, each must show a certificate of that CA (the member's own serves all three roles)."""
    if initial_cluster_state not in CLUSTER_STATES:
        raise InputError("initial_cluster_state", "one of %s" % ", ".join(CLUSTER_STATES), initial_cluster_state)
    clients = ",".join(client_urls)
    tls_args: List[str] = []
    if tls:
        tls_args = ["--cert-file", tls["cert"], "--key-file", tls["key"],
                    "--trusted-ca-file", tls["ca_cert"], "--client-cert-auth",
                    "--peer-cert-file", tls["cert"], "--peer-key-file", tls["key"],
                    "--peer-trusted-ca-file", tls["ca_cert"], "--peer-client-cert-auth"]
    return [etcd, "--name", name, "--data-dir", data_dir,
            "--listen-client-urls", clients, "--advertise-client-urls", clients,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", initial_cluster, "--initial-cluster-state", initial_cluster_state,
            # Ignored when joining an existing cluster; tells two new clusters apart.
            "--initial-cluster-token", "constellation-" + hashlib.sha256(initial_cluster.encode()).hexdigest()[:12],
            "--heartbeat-interval", str(heartbeat_ms), "--election-timeout", str(election_ms),
            "--log-level", "warn"] + tls_args


def initial_cluster(members: Iterable[Mapping[str, object]], new_name: str, new_peer_url: str) -> str:
    """``--initial-cluster`` for a member joining ``members`` (``EtcdStore.member_list()``)."""
    entries = []
    for member in members:
        urls = list(member.get("peer_urls") or [])
        name = member.get("name") or ""
        if new_peer_url in urls:
            name = new_name  # the member just added has no name until it starts
        if not name or not urls:
            raise InputError("members", "started members with a name and peer URLs", member)
        entries.extend("%s=%s" % (name, url) for url in urls)
    if "%s=%s" % (new_name, new_peer_url) not in entries:
        entries.append("%s=%s" % (new_name, new_peer_url))
    return ",".join(entries)
