# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kubeadm join chain for the unit tests, on the kubeadm TEST DOUBLE (tests/support/kubeadm_fixtures.py): a
kubelet's certificate signing request, the double's live bootstrap tokens, an active Coordinator's Core with a kubeadm
provider and a Node recorded as a kubelet."""

from __future__ import annotations

import ipaddress
import json
import os

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ansible_collections.constellation.cluster.plugins.module_utils import core as core_mod
from ansible_collections.constellation.cluster.plugins.module_utils import kms
from ansible_collections.constellation.cluster.plugins.module_utils.store import MemoryStore
from ansible_collections.constellation.cluster.plugins.module_utils.wireguard import generate_priv_key, pub_key_from_priv_key
from ansible_collections.constellation.cluster.tests.support.core_fakes import MemoryTPM, RecordingVPN, admin_pem


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
