# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lab's trust material, each made once per lab in its state folder (docs/agent.md): the init secret
(its hash per host provisions the agents), the measurements signing key (its public half is pinned), the
EK CA bundle (the lab CA stands for the TPM vendor), the lab's AMD (lab/amd.py: it stands for AMD on the SEV-SNP
variants) and the operator's admin key."""

from __future__ import annotations

import base64
import os
import threading
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from ansible_collections.constellation.cluster.plugins.module_utils import fileutil
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import signature
from ansible_collections.constellation.cluster.plugins.module_utils.kms.init_secret import init_secret_hash
from lab.amd import AMDChain, lab_chain

# Made once per lab, while agents start in parallel threads: the init secret and the signing key.
_LOCK = threading.Lock()
CA_FILES = ("swtpm-localca-rootca-cert.pem", "issuercert.pem")


def write_text(path: Path, text: str, mode: int = 0o644) -> None:
    fileutil.atomic_write(str(path), text.encode("utf-8"), mode)


class LabTrust:
    """The trust material of the lab whose state folder is ``state_dir``."""

    def __init__(self, state_dir: Path):
        self.state_dir = Path(state_dir)

    @property
    def ca_dir(self) -> Path:
        """The lab CA's folder (swtpm's local CA: the TPM vendor of the lab's hosts)."""
        return self.state_dir / "ca"

    @property
    def init_secret_path(self) -> Path:
        return self.state_dir / "init_secret"

    def init_secret(self) -> str:
        """The lab's init secret (std base64 of 32 bytes, 0600 in the lab's state), made once per lab."""
        with _LOCK:  # agents start in parallel: one secret
            if not self.init_secret_path.exists():
                self.state_dir.mkdir(parents=True, exist_ok=True)
                write_text(self.init_secret_path, base64.b64encode(os.urandom(32)).decode() + "\n", mode=0o600)
            return self.init_secret_path.read_text().strip()

    def init_secret_hash(self, public_ip: str) -> str:
        """What the agent of the host at ``public_ip`` is provisioned with (its own init secret's SHA-256)."""
        return init_secret_hash(self.init_secret(), public_ip)

    @property
    def measurements_pub_path(self) -> Path:
        """The lab's pinned measurements public key (PEM, ECDSA P-256, as cosign.pub)."""
        return self.state_dir / "measurements.pub"

    @property
    def measurements_key_path(self) -> Path:
        """The lab's measurements signing key (PEM, PKCS#8, 0600): what an operator keeps offline."""
        return self.state_dir / "measurements_signing_key.pem"

    def measurements_key(self):
        with _LOCK:  # agents start in parallel: one key
            path = self.measurements_key_path
            if not path.exists():
                self.state_dir.mkdir(parents=True, exist_ok=True)
                key = ec.generate_private_key(ec.SECP256R1())
                write_text(path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()).decode(), mode=0o600)
            key = signature.load_private_key(path.read_bytes())
            pub = key.public_key().public_bytes(serialization.Encoding.PEM,
                                                serialization.PublicFormat.SubjectPublicKeyInfo).decode()
            if not self.measurements_pub_path.exists() or self.measurements_pub_path.read_text() != pub:
                write_text(self.measurements_pub_path, pub)
            return key

    def sign_measurements(self, path: Path) -> Path:
        """Signs a policy file with the lab key (``path.sig``, cosign sign-blob form)."""
        sig = Path(signature.signature_path(str(path)))
        write_text(sig, signature.sign_blob(self.measurements_key(), Path(path).read_bytes()) + "\n")
        return sig

    @property
    def ek_ca_path(self) -> Path:
        """PEM bundle of the lab CA (root and intermediate): the EK trust anchor of qemu-vtpm-ek."""
        return self.state_dir / "ek_ca.pem"

    def write_ek_ca(self) -> None:
        write_text(self.ek_ca_path, "".join((self.ca_dir / name).read_text() for name in CA_FILES))

    @property
    def amd(self) -> AMDChain:
        """The lab's AMD (``<state>/amd``), made by ``ensure()`` once per lab."""
        return lab_chain(self.state_dir)

    @property
    def amd_roots_path(self) -> Path:
        """PEM bundle of the lab's ASK, ASVK and ARK: the ``amd_roots`` of the SEV-SNP variants."""
        return self.amd.roots_path

    @staticmethod
    def admin_key(inv: Path) -> Path:
        """The lab operator's admin key (Ed25519) in inventory ``inv``, made once; the agents pin its
        public half at activation."""
        path = inv / "admin_key"
        if not path.exists():
            key = ed25519.Ed25519PrivateKey.generate()
            pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
            write_text(path, pem.decode(), mode=0o600)
            pub = key.public_key().public_bytes(serialization.Encoding.PEM,
                                                serialization.PublicFormat.SubjectPublicKeyInfo)
            write_text(inv / "admin_key.pub", pub.decode())
        return path
