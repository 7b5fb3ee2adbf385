# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The base class of the controller-side cluster actions (agent_state, activate_coordinator,
activate_nodes, recover_peer): argument validation (with deprecated aliases), attestation
settings, error reporting. The actions themselves only say what to do (``act``)."""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import (
    ATTESTATION_ARGUMENT_SPEC, ATTESTATION_MUTUALLY_EXCLUSIVE, pcr_rows, settings_from_args)
from ansible_collections.constellation.cluster.plugins.module_utils.encoding import b64decode
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    AttestationError, ConstellationError, InputError)

display = Display()


def valid_args(spec: dict) -> frozenset:
    """Every name an action accepts: options and their (deprecated) aliases."""
    names = list(ATTESTATION_ARGUMENT_SPEC) + list(spec)
    for option in spec.values():
        names.extend(option.get("aliases", []))
        names.extend(alias["name"] for alias in option.get("deprecated_aliases", []))
    return frozenset(names)


class ClusterAction(ActionBase):
    """Runs on the controller whatever the host; subclasses set SPEC and implement ``act``."""

    TRANSFERS_FILES = False
    _requires_connection = False
    SPEC: dict = {}

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        spec = dict(ATTESTATION_ARGUMENT_SPEC)
        spec.update(self.SPEC)
        validation = ArgumentSpecValidator(spec, mutually_exclusive=ATTESTATION_MUTUALLY_EXCLUSIVE).validate(
            self._task.args)
        if validation.error_messages:
            raise AnsibleActionFail("; ".join(validation.error_messages))
        for deprecation in validation._deprecations:  # pylint: disable=protected-access
            display.deprecated(deprecation["msg"], version=deprecation.get("version"),
                               collection_name=deprecation.get("collection_name"))
        args = validation.validated_parameters
        try:
            settings = settings_from_args(args, self._loader.get_basedir())
            result.update(self.act(args, settings))
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

    def load_admin_priv_key(self, path):
        from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import load_priv_key
        try:
            with open(path, "rb") as handle:
                return load_priv_key(handle.read())
        except OSError as err:
            raise InputError("admin_priv_key_file", "a readable private key file",
                             "%s (%s)" % (path, err.strerror)) from None
