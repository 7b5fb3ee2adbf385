# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The base class of the controller-side cluster actions (agent_state, activate_coordinator,
activate_nodes, recover_peer): argument validation (with deprecated aliases), attestation
settings, error reporting. The actions themselves only say what to do (``act``)."""

from __future__ import annotations

import os

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import (
    ATTESTATION_ARGUMENT_SPEC, attested_options, pcr_rows, settings_from_args)
from ansible_collections.constellation.cluster.plugins.module_utils.encoding import b64decode
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    AttestationError, ConstellationError, MissingDependency)
from ansible_collections.constellation.cluster.plugins.plugin_utils import certified_aks, quiet_library_warnings

# Imported here, once, by the playbook process: its strategy loads an action's class before it forks
# a worker per host and task, so the workers inherit these modules (the aTLS client, the RPC client,
# the vTPM validators and tpm2-pytss) instead of importing them again for every task.
# pylint: disable=unused-import,wrong-import-position
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import all_variants as _variants  # noqa: F401
from ansible_collections.constellation.cluster.plugins.module_utils.rpc import client as _client  # noqa: F401
from ansible_collections.constellation.cluster.plugins.plugin_utils import controller as _controller  # noqa: F401
# pylint: enable=unused-import,wrong-import-position

display = Display()


def control_path_dir(templar, task_vars) -> str:
    """The atls connection's private folder (its option control_path_dir) as a task sees it
    (variable, environment, default): the run's certified AKs are kept there (certified_aks.py)."""
    value = (task_vars or {}).get("constellation_atls_control_path_dir")
    if value is not None:
        try:
            value = templar.template(value)
        except Exception:  # pylint: disable=broad-except
            value = None
    return str(value or os.environ.get("CONSTELLATION_ATLS_CONTROL_PATH_DIR") or certified_aks.DEFAULT_DIR)


def controller_lacks(err) -> str:
    """The message of a MissingDependency raised on the controller (it names the package, the Python and the fix)."""
    return "the controller cannot run this task: %s" % err


def valid_args(spec: dict) -> frozenset:
    """Every name an action accepts: options and their (deprecated) aliases."""
    names = list(ATTESTATION_ARGUMENT_SPEC) + list(spec)
    for option in list(ATTESTATION_ARGUMENT_SPEC.values()) + list(spec.values()):
        names.extend(option.get("aliases", []))
        names.extend(alias["name"] for alias in option.get("deprecated_aliases", []))
    return frozenset(names)


def validated_args(spec: dict, task_args) -> dict:
    """The task's arguments validated against the attestation options and ``spec``; a deprecated alias warns."""
    validation = ArgumentSpecValidator(**attested_options(spec)).validate(task_args)
    if validation.error_messages:
        raise AnsibleActionFail("; ".join(validation.error_messages))
    for deprecation in validation._deprecations:  # pylint: disable=protected-access
        display.deprecated(deprecation["msg"], version=deprecation.get("version"),
                           collection_name=deprecation.get("collection_name"))
    return validation.validated_parameters


class ClusterAction(ActionBase):
    """Runs on the controller whatever the host; subclasses set SPEC and implement ``act``."""

    TRANSFERS_FILES = False
    _requires_connection = False
    SPEC: dict = {}

    def run(self, tmp=None, task_vars=None):
        quiet_library_warnings()
        result = super().run(tmp, task_vars)
        del tmp
        self._task_vars = task_vars or {}
        args = validated_args(self.SPEC, self._task.args)
        try:
            settings = settings_from_args(args, self._loader.get_basedir())
            # A peer enrolled once in this run (qemu-vtpm-ek) is not enrolled again; every connection
            # is still attested in full (certified_aks.py).
            settings.trust = certified_aks.share(settings.trust, control_path_dir(self._templar, task_vars), os.getppid())
            result.update(self.act(args, settings))
            if settings.warnings:  # an insecure variant, acknowledged: said on every run
                result["warnings"] = list(settings.warnings) + list(result.get("warnings") or [])
        except MissingDependency as err:  # this controller's fault, never the peer's: nothing was asked of it
            result.update(failed=True, changed=False, msg=controller_lacks(err))
        except AttestationError as err:
            result.update(failed=True, changed=False, msg="attestation refused, nothing was sent: %s" % err,
                          pcrs=pcr_rows(getattr(err, "checks", [])))
        except ConstellationError as err:
            result.update(failed=True, changed=False, msg=str(err))
            if getattr(err, "rows", None):
                result["nodes"] = err.rows
        return result

    def act(self, args, settings):  # pragma: no cover - abstract
        raise NotImplementedError

    @staticmethod
    def cluster_id_arg(args):
        value = args.get("cluster_id")
        if not value:
            return None
        return b64decode(value, "cluster_id", 32)

    _task_vars: dict = {}

    def load_admin_priv_key(self, path):
        """The admin key of ``path``: an Ansible Vault file is decrypted in memory with the play's vault secrets,
        a passphrase-protected key opened with the variable constellation_admin_key_passphrase."""
        from ansible_collections.constellation.cluster.plugins.plugin_utils.admin_key import (
            PASSPHRASE_VARIABLE, load_admin_key)

        passphrase = self._task_vars.get(PASSPHRASE_VARIABLE)
        if passphrase:
            passphrase = self._templar.template(passphrase)
        vault = getattr(self._loader, "_vault", None)
        return load_admin_key(path, passphrase or None, vault_secrets=getattr(vault, "secrets", None))
