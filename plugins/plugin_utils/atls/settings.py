# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The atls connection plugin's options, validated, as one record (``Settings``) that the relay
process can be given as JSON. Every error names the option and what was expected."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional

from ansible.errors import AnsibleError


class SettingsError(AnsibleError):
    """An option has a value the plugin cannot use; names the option and what was expected."""


@dataclass
class Settings:
    endpoint: str
    variant: str
    measurements: Optional[Dict[str, Any]]
    admin_priv_key_file: str
    timeout: float
    attestation_timeout: float
    command_timeout: float
    persist: float
    control_path_dir: str
    netns: Optional[str]
    warm_interpreter: bool = True
    ek_ca_path: Optional[str] = None
    amd_roots: Optional[str] = None  # the SEV-SNP variants' AMD roots (None: AMD's pinned roots)
    fresh_proof: bool = True
    prestart: bool = True
    insecure_trust_any_ak: bool = False  # the acknowledgement variant qemu-vtpm needs
    # A vault-encrypted admin key, decrypted in memory by the task's worker (it has the run's vault secrets) and
    # given to the relay on its stdin with the rest (to_json); never written. A passphrase-protected key's
    # passphrase. Neither is shown.
    admin_priv_key_pem: Optional[str] = field(default=None, repr=False)
    admin_priv_key_passphrase: Optional[str] = field(default=None, repr=False)

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Settings":
        return cls(**json.loads(text))

    def control_path(self, playbook_pid: str) -> str:
        """One relay per (playbook run, endpoint, policy, admin key, namespace): a changed policy
        or key never reuses a connection attested under another one."""
        try:
            with open(self.admin_priv_key_file, "rb") as handle:
                key_digest = hashlib.sha256(handle.read()).hexdigest()
        except OSError:
            key_digest = ""
        material = json.dumps([playbook_pid, self.endpoint, self.variant, self.measurements, key_digest,
                               self.netns, _file_digest(self.ek_ca_path), self.fresh_proof]
                              + ([_file_digest(self.amd_roots)] if self.amd_roots else [])
                              + ([True] if self.insecure_trust_any_ak else []), sort_keys=True)
        return os.path.join(self.control_path_dir, "atls-%s.sock" % hashlib.sha256(material.encode()).hexdigest()[:20])


def _file_digest(path: Optional[str]) -> str:
    if not path:
        return ""
    if os.path.isdir(path):  # a folder of CA files: every file's name and content
        try:
            names = sorted(os.listdir(path))
        except OSError:
            return ""
        return hashlib.sha256(json.dumps([[n, _file_digest(os.path.join(path, n))] for n in names
                                          if os.path.isfile(os.path.join(path, n))]).encode()).hexdigest()
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return ""


def split_endpoint(endpoint: str):
    """(host, port) of ``endpoint`` (encoding.parse_endpoint), as a SettingsError."""
    from ansible_collections.constellation.cluster.plugins.module_utils.encoding import parse_endpoint
    from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError

    try:
        return parse_endpoint(endpoint, "endpoint")
    except InputError as err:
        raise SettingsError(str(err)) from None


def _load_policy_file(path: str, public_key_path: Optional[str] = None) -> Dict[str, Any]:
    """The policy document of a JSON or YAML file (attestation/policy.py reads it); with a pinned
    public key, only after its detached signature verified."""
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import (
        read_policy_document)
    from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError

    try:
        return read_policy_document(path, public_key_path=public_key_path)
    except ConstellationError as err:
        raise SettingsError(str(err)) from None


def _boolean(name: str, value: Any, default: bool = True) -> bool:
    from ansible.module_utils.parsing.convert_bool import boolean

    if value is None:
        return default
    try:
        return boolean(value, strict=True)
    except TypeError:
        raise SettingsError("%s: expected a boolean, got %r" % (name, value)) from None


def _positive(name: str, value: Any, allow_zero: bool = False) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SettingsError("%s: expected a number of seconds, got %r" % (name, value)) from None
    if number < 0 or (number == 0 and not allow_zero) or number > 86400:
        interval = "[0, 86400]" if allow_zero else "(0, 86400]"
        raise SettingsError("%s: expected seconds in %s, got %r" % (name, interval, value))
    return number


def settings_from_options(get_option: Callable[[str], Any]) -> Settings:
    """Validates the plugin's options; every error names the option and what was expected."""
    endpoint = get_option("endpoint")
    if endpoint:
        endpoint = str(endpoint)
    else:
        host = get_option("host")
        port = get_option("port")
        if not host:
            raise SettingsError("host: expected the node's address (or set endpoint)")
        endpoint = "[%s]:%s" % (host, port) if ":" in str(host) else "%s:%s" % (host, port)
    split_endpoint(endpoint)

    from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose

    from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError

    variant = get_option("attestation_variant") or choose.DEFAULT_VARIANT
    if variant not in choose.VARIANT_NAMES:
        raise SettingsError("attestation_variant: expected one of %s, got %r" % (", ".join(choose.VARIANT_NAMES),
                                                                                 variant))
    insecure_trust_any_ak = _boolean("insecure_trust_any_ak", get_option("insecure_trust_any_ak"), default=False)
    try:  # the one rule (attestation/choose.py): dummy only in tests, qemu-vtpm only acknowledged
        choose.check_variant_allowed(variant, insecure_trust_any_ak, "attestation_variant")
    except InputError as err:
        raise SettingsError("%s (variable constellation_%s)" % (err, err.field)) from None
    ek_ca_path = get_option("ek_ca_path") or None
    if choose.spec(variant).needs_ek_ca:
        if not ek_ca_path:
            raise SettingsError("ek_ca_path: expected the PEM file (or folder of PEM files) of the CA(s) that TPMs' "
                                "EK certificates chain to (constellation_ek_ca_path), for variant %s" % variant)
        ek_ca_path = os.path.abspath(os.path.expanduser(str(ek_ca_path)))
        if not (os.path.isfile(ek_ca_path) or os.path.isdir(ek_ca_path)):
            raise SettingsError("ek_ca_path: expected a readable PEM file or a folder of them, got %s" % ek_ca_path)
    else:
        ek_ca_path = None
    amd_roots = get_option("amd_roots") or None
    if amd_roots is not None and choose.spec(variant).needs_amd_roots:
        amd_roots = os.path.abspath(os.path.expanduser(str(amd_roots)))
        if not (os.path.isfile(amd_roots) or os.path.isdir(amd_roots)):
            raise SettingsError("amd_roots: expected a readable PEM file or a folder of them, got %s" % amd_roots)
    else:
        amd_roots = None
    inline, path = get_option("measurements"), get_option("measurements_file")
    if inline is not None and path:
        raise SettingsError("measurements and measurements_file are mutually exclusive: set one")
    public_key_path = get_option("measurements_pub_key_file") or None
    if public_key_path and inline is not None:
        raise SettingsError("measurements: a pinned measurements_pub_key_file needs a signed measurements_file, "
                            "not inline measurements")
    measurements = _load_policy_file(path, public_key_path) if path else inline
    if measurements is not None and not isinstance(measurements, dict):
        raise SettingsError("measurements: expected a mapping of PCR index to measurement, got %s"
                            % type(measurements).__name__)
    if variant != "dummy":
        if not measurements:
            raise SettingsError("measurements: expected a measurements policy (measurements or measurements_file) "
                                "for variant %s; an empty policy would accept any TPM" % variant)
        validate_policy(measurements, path or "inline measurements")  # validate now: a typo must not surface as "unreachable" later

    key_file = get_option("admin_priv_key_file")
    if not key_file:
        raise SettingsError("admin_priv_key_file: expected the path of the admin's private key "
                            "(constellation_admin_priv_key_file)")
    key_file = os.path.abspath(os.path.expanduser(str(key_file)))
    if not os.path.isfile(key_file):
        raise SettingsError("admin_priv_key_file: expected a readable private key file, got %s" % key_file)
    key_pem = _vaulted_key(key_file)
    passphrase = get_option("admin_priv_key_passphrase") or None

    netns = get_option("netns") or None
    if netns is not None and (not isinstance(netns, str) or "/" in netns or netns in (".", "..")):
        raise SettingsError("netns: expected the name of a network namespace in /run/netns, got %r" % netns)

    return Settings(
        endpoint=endpoint,
        variant=variant,
        measurements=measurements if variant != "dummy" else None,
        admin_priv_key_file=key_file,
        timeout=_positive("connect_timeout", get_option("connect_timeout")),
        attestation_timeout=_positive("attestation_timeout", get_option("attestation_timeout")),
        command_timeout=_positive("command_timeout", get_option("command_timeout") or 0, allow_zero=True),
        persist=_positive("persist", get_option("persist") or 0, allow_zero=True),
        control_path_dir=os.path.abspath(os.path.expanduser(str(get_option("control_path_dir") or "~/.ansible/cp"))),
        netns=netns,
        warm_interpreter=_boolean("warm_interpreter", get_option("warm_interpreter")),
        ek_ca_path=ek_ca_path,
        amd_roots=amd_roots,
        fresh_proof=_boolean("fresh_proof", get_option("fresh_proof")),
        prestart=_boolean("prestart", get_option("prestart")),
        insecure_trust_any_ak=insecure_trust_any_ak,
        admin_priv_key_pem=key_pem,
        admin_priv_key_passphrase=str(passphrase) if passphrase is not None else None,
    )


def _vaulted_key(key_file: str) -> Optional[str]:
    """The admin key of an Ansible Vault file, decrypted in memory (None: the file is not vault-encrypted)."""
    from ansible.parsing.vault import is_encrypted_file

    try:
        with open(key_file, "rb") as handle:
            if not is_encrypted_file(handle):
                return None
    except OSError as err:
        raise SettingsError("admin_priv_key_file: cannot read %s: %s (constellation_admin_priv_key_file)"
                            % (key_file, err.strerror)) from None
    from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
    from ansible_collections.constellation.cluster.plugins.plugin_utils.admin_key import read_key_file

    try:
        return read_key_file(key_file).decode("utf-8")
    except InputError as err:
        raise SettingsError("%s (constellation_admin_priv_key_file)" % err) from None
    except UnicodeDecodeError:
        raise SettingsError("admin_priv_key_file: expected a PEM or OpenSSH private key in the vault file %s"
                            % key_file) from None


def validate_policy(measurements: Dict[str, Any], source: str = "inline measurements"):
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import parse_policy
    from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError

    try:
        policy = parse_policy(measurements)
    except (ConstellationError, ValueError, TypeError) as err:
        raise SettingsError("measurements: %s" % err) from None
    if not all(m.pcrs or m.snp is not None for m in policy.sets.values()):
        raise SettingsError("measurements: expected at least one PCR: an empty policy would accept any TPM")
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import require_enforced_pcr

    try:
        require_enforced_pcr(policy, source, "measurements")
    except ConstellationError as err:
        raise SettingsError(str(err)) from None
    return policy
