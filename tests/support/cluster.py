# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The admin's side of a lab cluster, for tests that drive real agents without Ansible: the admin
key pair, the cluster's master secret and measurement salt (so its cluster ID and the disk keys the
KMS derives), sockets from the admin machine (the bridge namespace) and the agents it started.

``lab_cluster(...)`` is the one way a test module builds its lab and cluster (a module fixture's body)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from typing import Dict, Iterator, Optional, Type, TypeVar

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from ansible_collections.constellation.cluster.plugins.module_utils import kms
from lab.agent import agent_dir, read_sealed, start_agent, stop_agent
from lab.image import lab_measurements
from lab.lab import Lab
from lab.netns import NetNS
from tests.support.procs import wait_gone

_C = TypeVar("_C", bound="LabCluster")


class LabCluster:
    # The policy the admin's client attests against (None: the lab image's); a subclass may accept more.
    policy = None

    def __init__(self, lab: Lab):
        self.lab = lab
        self.hosts = {h.name: h for h in lab.hosts}
        self.admin = NetNS(lab.bridge_netns)
        self.procs: Dict[str, object] = {}
        self.admin_key = ed25519.Ed25519PrivateKey.generate()
        self.admin_pem = self.admin_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
        self.secret = kms.MasterSecret.generate()
        self.salt = os.urandom(32)
        self.cluster_id = kms.ClusterKMS(self.secret).cluster_id(self.salt)
        self._ek_trust = None

    def start(self, name: str, **config):
        """Starts the agent on ``name`` (config keys as docs/agent.md, and start_agent's options)."""
        self.hosts = {h.name: h for h in self.lab.hosts}  # the lab may have grown
        if config.get("coordinator_public_endpoint"):  # join mode: the Coordinators' key, as the role derives it
            config.setdefault("coordinator_pub_key", kms.coordinator_pub_key(kms.ClusterKMS(self.secret)))
        self.procs[name] = start_agent(self.lab, self.hosts[name], **config)
        return self.procs[name]

    def client(self, name: str):
        """An AgentClient to ``name`` from the admin machine, attested against the lab image's policy
        without PCR 15 (fresh or activated alike; callers read PCR 15 from ``attested_pcrs()``). A lab of
        ``qemu-vtpm-ek`` trusts the AK through the lab CA (enrolled once per host), one of ``qemu-vtpm`` any AK."""
        from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose
        from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
            Measurements)
        from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient, connect_enrolling
        from ansible_collections.constellation.cluster.plugins.module_utils.agent.pubapi import coordinator_policy

        h = self.hosts[name]
        policy = coordinator_policy(self.policy or Measurements.from_dict(lab_measurements()))
        if self.lab.variant == "qemu-vtpm-ek":
            if self._ek_trust is None:  # one registry of enrolled AKs for this admin
                self._ek_trust = choose.load_trust("qemu-vtpm-ek", str(self.lab.ek_ca_path))
            validator = choose.validator("qemu-vtpm-ek", policy, self._ek_trust)
        else:
            validator = choose.validator("qemu-vtpm", policy, insecure_trust_any_ak=True)
        return connect_enrolling(lambda v: AgentClient.connect(h.public_endpoint, v, sock=self.admin.connect((h.public_ip, 9000))),
                                 [validator])

    def state(self, name: str) -> dict:
        """GetState; on an activated peer after AdminAuth (before it, anyone gets only state and role)."""
        from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import RemoteError

        with self.client(name) as c:
            state = c.get_state()
            if state.get("state") in ("ActivatingNodes", "NodeWaitingForClusterJoin", "IsNode"):
                try:
                    c.admin_auth(self.admin_key)
                except RemoteError:  # not our admin key: the public answer
                    return state
                state = c.get_state()
            return state

    def stop(self, name: str, sig=signal.SIGTERM) -> int:
        return stop_agent(self.procs.pop(name), sig=sig)

    def activate(self, via: str, nodes=(), coordinators=()) -> dict:
        """The admin asks the Coordinator ``via`` to activate these Nodes (and further Coordinators)."""
        with self.client(via) as c:
            c.admin_auth(self.admin_key)
            return c.activate_additional_nodes([self.hosts[n].public_endpoint for n in nodes],
                                               coordinator_public_endpoints=[self.hosts[n].public_endpoint
                                                                             for n in coordinators])

    def etcd_pid(self, name: str) -> Optional[int]:
        """The pid of the etcd member the agent on ``name`` runs (its pid file), if any."""
        try:
            return int((agent_dir(self.hosts[name]) / "state" / "etcd" / "etcd.pid").read_text())
        except (OSError, ValueError):
            return None

    def kill_coordinator(self, name: str, timeout: float = 10.0) -> None:
        """A crash of the host's services: its agent and its etcd member, SIGKILL."""
        pid = self.etcd_pid(name)
        self.stop(name, sig=signal.SIGKILL)
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                return
            wait_gone(pid, timeout, interval=0.05)

    def events(self, name: str, event: str) -> list:
        """The agent log records of ``event`` on ``name``."""
        rows = []
        try:
            for line in (agent_dir(self.hosts[name]) / "agent.log").read_text(errors="replace").splitlines():
                if '"event": "%s"' % event in line:
                    rows.append(json.loads(line))
        except (OSError, ValueError):
            pass
        return rows

    def snapshot(self, *names) -> dict:
        """What must never change on a peer: its VPN IP, WireGuard key and disk key, by name."""
        rows = {}
        for name in names:
            state = self.state(name)
            rows[name] = (state["vpn_ip"], state["vpn_pub_key"], self.disk_key(name))
        return rows

    def wg_peers(self, name: str) -> set:
        return set(self.hosts[name].run(["wg", "show", "wg0", "peers"], check=False).stdout.split())

    def disk_key(self, name: str) -> Optional[bytes]:
        return read_sealed(self.lab, self.hosts[name], "state_disk.key")

    def expected_disk_key(self, name: str) -> bytes:
        """The disk key the cluster's KMS derives for the disk UUID this host reports."""
        uuid = (agent_dir(self.hosts[name]) / "state" / "disk_uuid").read_text().strip()
        return kms.ClusterKMS(self.secret).state_disk_key(uuid)

    def close(self) -> None:
        for name in list(self.procs):
            try:
                self.stop(name)
            except Exception:  # pylint: disable=broad-except
                pass
        self.admin.close()


@contextlib.contextmanager
def lab_cluster(name: str, hosts: int, cls: Type[_C] = LabCluster, **up) -> Iterator[_C]:
    """``with lab_cluster(name, hosts, variant=...) as cluster:`` a lab of ``hosts`` hosts with TPMs (``up``:
    Lab.up's other options) and its ``cls`` cluster; when the block ends (a failed set-up in it included) the
    cluster's agents are stopped and the lab is removed."""
    lab = Lab(name, inventory_dir=None)
    up.setdefault("tpm", True)
    try:
        lab.up(hosts=hosts, **up)
        made = cls(lab)
        try:
            yield made
        finally:
            made.close()
    finally:
        lab.down()
