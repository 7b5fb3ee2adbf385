# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The admin's side of the admin channel for the unit tests: an ed25519 admin key pair (the private key and
its PEM public key) and a client of an agent's pubapi that accepts the dummy attestation."""

from __future__ import annotations

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import DummyValidator
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient


def keypair():
    key = ed25519.Ed25519PrivateKey.generate()
    return key, key.public_key().public_bytes(serialization.Encoding.PEM,
                                              serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def _connect(endpoint):
    return AgentClient.connect(endpoint, [DummyValidator()])
