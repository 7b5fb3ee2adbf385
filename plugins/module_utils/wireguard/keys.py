# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""WireGuard keys (X25519 through cryptography) and key files, and the shared constants."""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass

from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_write
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError

try:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
except ImportError:  # pragma: no cover - reported by the modules via HAS_CRYPTOGRAPHY
    HAS_CRYPTOGRAPHY = False
else:
    HAS_CRYPTOGRAPHY = True


VPN_CIDR = "10.118.0.0/16"
LISTEN_PORT = 51820
PERSISTENT_KEEPALIVE = 10
MTU = 1420
KEY_FILE_MODE = 0o600
# wireguard-go refuses to start without this where no kernel module exists (docs/wireguard.md, "Environment notes").
WIREGUARD_GO_ENV = {"WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD": "1"}


# --------------------------------------------------------------------------- keys


def _raw_private(priv_key: X25519PrivateKey) -> bytes:
    return priv_key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


def _raw_public(priv_key: X25519PrivateKey) -> bytes:
    return priv_key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def generate_priv_key() -> str:
    """A new X25519 private key, std-base64 as ``wg genkey`` prints it."""
    return base64.b64encode(_raw_private(X25519PrivateKey.generate())).decode("ascii")


def key_bytes(key: str, field_name: str = "key") -> bytes:
    """Decode a std-base64 WireGuard key (44 characters, 32 bytes) or raise InputError."""
    if not isinstance(key, str):
        raise InputError(field_name, "a base64 WireGuard key (44 characters)", type(key).__name__)
    try:
        raw = base64.b64decode(key.strip(), validate=True)
    except (ValueError, TypeError):
        raw = b""
    if len(raw) != 32:
        # Never echo the value: this function also checks private keys.
        raise InputError(field_name, "a base64 WireGuard key (44 characters, 32 bytes)", "%d characters" % len(key))
    return raw


def pub_key_from_priv_key(priv_key: str) -> str:
    """The public key (std-base64) of a std-base64 private key, as ``wg pubkey`` prints it."""
    raw = key_bytes(priv_key, "priv_key")
    return base64.b64encode(_raw_public(X25519PrivateKey.from_private_bytes(raw))).decode("ascii")


def normalize_pub_key(pub_key: str, field_name: str = "pub_key") -> str:
    return base64.b64encode(key_bytes(pub_key, field_name)).decode("ascii")


@dataclass(frozen=True)
class KeyFileState:
    """What a private key file looks like, without its content."""

    exists: bool
    pub_key: str | None = None
    mode: int | None = None

    @property
    def mode_ok(self) -> bool:
        return self.mode == KEY_FILE_MODE


def read_key_file(path: str) -> KeyFileState:
    """Inspect a private key file; the key itself stays inside this function."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return KeyFileState(exists=False)
    with open(path, "r", encoding="ascii", errors="replace") as handle:
        content = handle.read().strip()
    try:
        pub_key = pub_key_from_priv_key(content)
    except InputError:
        raise InputError("priv_key_file", "a file holding one base64 WireGuard private key", path) from None
    return KeyFileState(exists=True, pub_key=pub_key, mode=st.st_mode & 0o7777)


def ensure_key_file(path: str, check_mode: bool = False) -> tuple[KeyFileState, bool]:
    """Create the private key file if absent (on this host, never sent anywhere) and force mode 0600.

    Returns the state after the call and whether anything changed (or would, in check mode).
    """
    state = read_key_file(path)
    if state.exists and state.mode_ok:
        return state, False
    if check_mode:
        return state, True
    if not state.exists:
        atomic_write(path, (generate_priv_key() + "\n").encode("ascii"), KEY_FILE_MODE)
    else:
        os.chmod(path, KEY_FILE_MODE)
    return read_key_file(path), True
