# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin verify_attestation: attests a host's aTLS endpoint from the controller.

An action plugin because the verifier is the admin's controller (as Constellation's CLI is): the
policy, the nonce and the verdict never depend on the host being checked. Documentation is in
plugins/modules/verify_attestation.py.
"""

from __future__ import annotations

import os
from dataclasses import asdict

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase

from ansible_collections.constellation.cluster.plugins.module_utils import atls
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    AttestationError, ConstellationError, InputError)

ARGUMENT_SPEC = dict(
    endpoint=dict(type="str", required=True),
    measurements=dict(type="dict"),
    measurements_path=dict(type="path"),
    variant=dict(type="str", choices=["qemu-vtpm", "dummy"], default="qemu-vtpm"),
    timeout=dict(type="float", default=atls.HANDSHAKE_TIMEOUT),
    attestation_timeout=dict(type="float", default=atls.ATTESTATION_TIMEOUT),
)
MUTUALLY_EXCLUSIVE = [("measurements", "measurements_path")]


def _load_policy(args, basedir):
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
        Measurements)
    if args["measurements_path"] is not None:
        path = args["measurements_path"]
        if not os.path.isabs(path):
            path = os.path.join(basedir, path)
        try:
            import yaml  # JSON is YAML: one loader for both spellings of the policy
            with open(path, encoding="utf-8") as handle:
                data = yaml.safe_load(handle)
        except OSError as err:
            raise InputError("measurements_path", "a readable JSON or YAML file", "%s (%s)" % (path, err.strerror))
        except yaml.YAMLError as err:
            raise InputError("measurements_path", "a JSON or YAML file", "%s (%s)" % (path, err))
        policy = Measurements.from_dict(data)
    elif args["measurements"] is not None:
        policy = Measurements.from_dict(args["measurements"])
    else:
        raise InputError("measurements", "a measurements policy (measurements or measurements_path) "
                                         "for variant %s" % args["variant"])
    if not policy.pcrs:
        raise InputError("measurements", "at least one PCR: an empty policy would accept any TPM", {})
    return policy


def _validator(args, basedir):
    if args["variant"] == "dummy":
        from ansible_collections.constellation.cluster.plugins.module_utils.attestation.dummy import (
            DummyValidator)
        return DummyValidator()
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import VTPMValidator
    return VTPMValidator(_load_policy(args, basedir))


def _table(checks):
    return [asdict(check) for check in checks]


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        validation = ArgumentSpecValidator(ARGUMENT_SPEC, mutually_exclusive=MUTUALLY_EXCLUSIVE).validate(
            self._task.args)
        if validation.error_messages:
            raise AnsibleActionFail("; ".join(validation.error_messages))
        args = validation.validated_parameters
        result.update(changed=False, endpoint=args["endpoint"], variant=args["variant"])
        try:
            atls.parse_endpoint(args["endpoint"])
            validator = _validator(args, self._loader.get_basedir())
            conn = atls.connect(args["endpoint"], [validator], timeout=args["timeout"],
                                attestation_timeout=args["attestation_timeout"])
        except AttestationError as err:
            result.update(failed=True, msg="attestation of %s refused: %s" % (args["endpoint"], err),
                          pcrs=_table(getattr(err, "checks", [])))
            return result
        except ConstellationError as err:
            raise AnsibleActionFail(str(err)) from None
        # Nothing is sent over the verified channel: this task only checks the peer.
        conn.sock.close()
        result.update(
            oid=conn.variant_oid,
            pcrs=_table(conn.validation.checks),
            measurements={str(i): v.hex() for i, v in sorted(conn.validation.pcrs.items())},
        )
        if conn.validation.warnings:
            result["warnings"] = list(conn.validation.warnings)
        return result
