# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Opening an attested, admin-authenticated connection to a node agent (used by the relay, or
per task when ``persist`` is 0). Validators come from the one chooser through
``attestation.policy.AttestationSettings``, as for the cluster actions."""

from __future__ import annotations

import socket

from ansible.errors import AnsibleConnectionFailure

from ansible_collections.constellation.cluster.plugins.plugin_utils.atls.settings import Settings, split_endpoint


def _warn(text: str) -> None:
    """Ansible's display, imported only when there is something to say: the relay process (which
    imports this module) pays for ansible.utils.display (and the configuration it loads, about
    60 ms) only then."""
    from ansible.utils.display import Display

    Display().warning(text)


def tcp_socket(settings: Settings) -> socket.socket:
    """A TCP connection to the endpoint, in the lab's namespace where one is set (netns.py)."""
    from ansible_collections.constellation.cluster.plugins.module_utils.netns import create_connection

    return create_connection(split_endpoint(settings.endpoint), settings.timeout, settings.netns)


def validators_for(settings: Settings, playbook_pid=None) -> list:
    """The validators of the host's policy, from the one chooser, through the same settings as the
    cluster actions. Raises AnsibleConnectionFailure naming the reason. With ``playbook_pid``
    (qemu-vtpm-ek) they share the run's certified AKs (certified_aks.py): a peer the run enrolled once is
    attested without enrolling again."""
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import settings_from_args
    from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError
    from ansible_collections.constellation.cluster.plugins.plugin_utils import certified_aks

    try:
        attestation = settings_from_args({"variant": settings.variant, "measurements": settings.measurements,
                                          "ek_ca_path": settings.ek_ca_path, "netns": settings.netns,
                                          "amd_roots": getattr(settings, "amd_roots", None),
                                          "insecure_trust_any_ak": getattr(settings, "insecure_trust_any_ak", False),
                                          "timeout": settings.timeout,
                                          "attestation_timeout": settings.attestation_timeout})
        if playbook_pid is not None:
            attestation.trust = certified_aks.share(attestation.trust, settings.control_path_dir, playbook_pid)
        return attestation.validators()
    except ConstellationError as err:
        raise AnsibleConnectionFailure("%s: %s" % (settings.endpoint, err)) from None


def _refusal(where: str, err, what: str) -> AnsibleConnectionFailure:
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import pcr_mismatch_text

    table = pcr_mismatch_text(getattr(err, "checks", None))
    return AnsibleConnectionFailure("%s: %s, nothing was sent: %s%s" % (where, what, err, " [%s]" % table if table else ""))


def prove_again(settings: Settings, client, validators) -> None:
    """A fresh proof on a kept connection (``Attest``): a new nonce, a new quote bound to this very
    connection, validated against the policy. On refusal the connection is closed and
    AnsibleConnectionFailure says why (the host is unreachable for this task)."""
    from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
        AttestationError, ConstellationError)

    try:
        validation = client.attest_again(validators, settings.attestation_timeout)
    except AttestationError as err:
        client.close()
        raise _refusal(settings.endpoint, err, "fresh attestation refused on the kept connection") from None
    except (ConstellationError, OSError) as err:
        client.close()
        raise AnsibleConnectionFailure("%s: fresh attestation failed on the kept connection: %s"
                                       % (settings.endpoint, err)) from None
    for warning in validation.warnings:
        _warn("%s: %s" % (settings.endpoint, warning))


def open_admin_client(settings: Settings, validators=None):
    """An AgentClient on a TLS connection whose peer passed attestation and which proved the admin
    key. Raises AnsibleConnectionFailure naming the reason."""
    from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
        AttestationError, ConstellationError)
    from ansible_collections.constellation.cluster.plugins.module_utils.rpc.admin_key import load_priv_key
    from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient, connect_enrolling
    from ansible_collections.constellation.cluster.plugins.module_utils.rpc.framing import RemoteError

    where = settings.endpoint
    if validators is None:
        validators = validators_for(settings)
    try:
        if settings.admin_priv_key_pem is not None:  # a vault file, decrypted in memory (settings.py)
            key_data = settings.admin_priv_key_pem.encode("utf-8")
        else:
            with open(settings.admin_priv_key_file, "rb") as handle:
                key_data = handle.read()
        priv_key = load_priv_key(key_data, settings.admin_priv_key_passphrase)
    except OSError as err:
        raise AnsibleConnectionFailure("admin_priv_key_file: cannot read %s: %s"
                                       % (settings.admin_priv_key_file, err.strerror)) from None
    except ConstellationError as err:
        raise AnsibleConnectionFailure("admin_priv_key_file %s: %s" % (settings.admin_priv_key_file, err)) from None

    def connect(with_validators):
        try:
            sock = tcp_socket(settings)
        except OSError as err:
            raise AnsibleConnectionFailure("%s: cannot connect: %s" % (where, err.strerror or err)) from None
        return AgentClient.connect(where, with_validators, sock=sock, timeout=settings.timeout)

    try:
        # qemu-vtpm-ek: a node whose AK is not certified yet is enrolled first (EnrollAK), then attested.
        client = connect_enrolling(connect, validators)
    except AttestationError as err:
        raise _refusal(where, err, "attestation refused") from None
    except ConstellationError as err:
        raise AnsibleConnectionFailure("%s: %s" % (where, err)) from None
    try:
        client.admin_auth(priv_key)
    except RemoteError as err:
        client.close()
        if err.kind == "StateError":
            raise AnsibleConnectionFailure("%s: attested, but the admin channel is refused: %s" % (where, err)) from None
        if err.kind == "AccessDenied":
            raise AnsibleConnectionFailure("%s: attested, but not authorised: %s (is %s the admin key pinned at "
                                           "activation?)" % (where, err, settings.admin_priv_key_file)) from None
        raise AnsibleConnectionFailure("%s: AdminAuth failed: %s: %s" % (where, err.kind, err)) from None
    except ConstellationError as err:
        client.close()
        raise AnsibleConnectionFailure("%s: AdminAuth failed: %s" % (where, err)) from None
    for warning in client.attested.validation.warnings:
        _warn("%s: %s" % (where, warning))
    return client
