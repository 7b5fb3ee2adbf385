# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Keys for tests: a measurements signing key whose public key is pinned from a file."""

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
