# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kubeadm join chain for the unit tests, on the kubeadm TEST DOUBLE (tests/support/kubeadm_fixtures.py): a
kubelet's certificate signing request and the double's live bootstrap tokens."""

from __future__ import annotations

import ipaddress
import json
import os

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


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
