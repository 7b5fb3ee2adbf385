# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Keys for tests: a measurements signing key whose public key is pinned from a file, and a policy file signed
with one."""

from __future__ import annotations

from pathlib import Path
from typing import Union

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec


def measurements_key(pub_path: Union[str, Path]) -> ec.EllipticCurvePrivateKey:
    """A fresh measurements signing key (ECDSA P-256, as cosign's); its public key is written to ``pub_path``
    (PEM), the file an agent or a module pins."""
    key = ec.generate_private_key(ec.SECP256R1())
    Path(pub_path).write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                             serialization.PublicFormat.SubjectPublicKeyInfo))
    return key


def sign_policy(tmp_path, path) -> str:
    """Signs the policy file ``path`` (``path.sig``) with a fresh measurements key; returns the pinned key's path."""
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation import signature

    pub = tmp_path / "measurements.pub"
    key = measurements_key(pub)
    with open(signature.signature_path(str(path)), "w", encoding="ascii") as handle:
        with open(str(path), "rb") as policy:
            handle.write(signature.sign_blob(key, policy.read()) + "\n")
    return str(pub)
