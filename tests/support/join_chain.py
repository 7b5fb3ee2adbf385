# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kubeadm join chain for the unit tests, on the kubeadm TEST DOUBLE (tests/support/kubeadm_fixtures.py): a
kubelet's certificate signing request, the double's live bootstrap tokens, an active Coordinator's Core with a kubeadm
provider and a Node recorded as a kubelet, and ``Cluster``: a Coordinator whose vpnapi is served on loopback, where
the VPN is 127.77.0.0/16 and each client binds the source address of the peer it claims to be."""

from __future__ import annotations

import ipaddress
import json
import os
import socket

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import NameOID

from ansible_collections.constellation.cluster.plugins.module_utils import core as core_mod
from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.module_utils.agent.peer_view import CorePeerView
from ansible_collections.constellation.cluster.plugins.module_utils.agent.wiring import vpnapi_handlers
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.join_provider import JoinProvider
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import schema
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.server import FrameServer
from ansible_collections.constellation.cluster.plugins.module_utils.store import MemoryStore
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import generate_priv_key, pub_key_from_priv_key
from ansible_collections.constellation.cluster.tests.support.core_fakes import MemoryTPM, RecordingVPN, admin_pem
from ansible_collections.constellation.cluster.tests.support.kubeadm_fixtures import KUBEADM_DOUBLE


def make_csr(cn="system:node:worker-0", orgs=("system:nodes",), sans=("worker-0", "10.118.0.11")):
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    names.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name(names))
    general = []
    for value in sans:
        try:
            general.append(x509.IPAddress(ipaddress.ip_address(value)))
        except ValueError:
            general.append(x509.DNSName(value))
    if general:
        builder = builder.add_extension(x509.SubjectAlternativeName(general), critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.DER), key


def live_tokens(control_plane_dir):
    with open(os.path.join(control_plane_dir, ".kubeadm-double", "state.json"), encoding="utf-8") as handle:
        return json.load(handle)["tokens"]


def kubeadm_coordinator(tmp_path, provider):
    """An active Coordinator's Core whose kubeadm provider is ``provider``."""
    state_dir = tmp_path / "coordinator"
    state_dir.mkdir()
    coordinator = core_mod.Core(MemoryStore(), MemoryTPM(), RecordingVPN(), str(state_dir), "10.42.0.10",
                                core_mod.new_disk_uuid())
    coordinator.recovery.load()
    coordinator.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), admin_pem())
    coordinator.kubernetes.kubeadm_provider = provider
    return coordinator


def kubelet_node(coordinator, name):
    """Records a Node that will be the kubelet ``name`` (public IP 10.42.0.2N for worker-N): (its VPN IP, its
    kubelet CSR)."""
    vpn_ip = coordinator.coordinator.reserve_node_ip()
    coordinator.activation.record_node(vpn_ip, pub_key_from_priv_key(generate_priv_key()), "10.42.0.%d" % (20 + int(name[-1])),
                                       core_mod.new_disk_uuid())
    csr, _key = make_csr(cn="system:node:" + name, sans=(name, vpn_ip))
    return vpn_ip, csr


VPN_CIDR = "127.77.0.0/16"


class LoopbackVPN(RecordingVPN):
    vpn_cidr = VPN_CIDR


class Cluster:
    def __init__(self, tmp_path, control_plane_dir, provider=True):
        self.control_plane_dir = control_plane_dir
        state_dir = tmp_path / "coordinator"
        state_dir.mkdir()
        self.core = core_mod.Core(MemoryStore(), MemoryTPM(), LoopbackVPN(), str(state_dir), "10.42.0.10",
                                  core_mod.new_disk_uuid())
        self.core.recovery.load()
        admin = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
        self.core.coordinator.activate_as_coordinator(kms.MasterSecret.generate().to_uri(), os.urandom(32), admin,
                                                      cluster_config={"vpn_cidr": VPN_CIDR})
        self.core.kubernetes.kubeadm_provider = JoinProvider(KUBEADM_DOUBLE, control_plane_dir) if provider else None
        self.api = vpnapi_handlers(self.core)
        self.server = FrameServer("vpnapi", ("127.77.0.1", 0), self.api.handlers(), accept_check=self.api.accept_check,
                                  apis=(schema.VPNAPI,), peer_view=CorePeerView(self.core)).start()
        self.port = self.server.address[1]
        self.keys = {}

    def add_node(self, public_ip, control_plane=False, name=None):
        """A node recorded as an activation records it (the admin's name for it, its disk UUID, the admin's
        control-plane designation, its WireGuard key); its agent's private key is kept in ``keys``."""
        vpn_ip = self.core.coordinator.reserve_node_ip()
        if name is not None:  # ActivateAdditionalNodes' node_names (the inventory name), or a join's admission
            self.core.kubernetes.name_node(vpn_ip, name, "ActivateAdditionalNodes")
        priv_key = generate_priv_key()
        self.core.activation.record_node(vpn_ip, pub_key_from_priv_key(priv_key), public_ip, core_mod.new_disk_uuid(),
                                         control_plane)
        self.keys[vpn_ip] = priv_key
        return vpn_ip

    def client(self, source_ip, authenticate=True):
        """A connection from ``source_ip``; with ``authenticate`` (the agent's side) PeerAuth with the
        agent's WireGuard private key first."""
        sock = socket.create_connection(("127.77.0.1", self.port), timeout=10, source_address=(source_ip, 0))
        client = AgentClient.connect_plain("127.77.0.1:%d" % self.port, sock=sock, timeout=10)
        if authenticate and source_ip in self.keys:
            client.peer_auth(self.keys[source_ip], self.core.context.vpn_pub_key)
        return client

    def tokens(self):
        return live_tokens(self.control_plane_dir)
