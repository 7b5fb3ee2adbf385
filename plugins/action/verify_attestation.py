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

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.constellation.cluster.plugins.module_utils import atls, netns
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import pcr_rows, settings_from_args
from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import VERIFY_ATTESTATION_ARGS
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (
    AttestationError, ConstellationError, MissingDependency)
from ansible_collections.constellation.cluster.plugins.module_utils.rpc.client import AgentClient, connect_enrolling
from ansible_collections.constellation.cluster.plugins.plugin_utils import certified_aks, quiet_library_warnings
from ansible_collections.constellation.cluster.plugins.plugin_utils.cluster_action import (
    control_path_dir, controller_lacks, valid_args, validated_args)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = valid_args(VERIFY_ATTESTATION_ARGS)
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        quiet_library_warnings()
        result = super().run(tmp, task_vars)
        del tmp
        args = validated_args(VERIFY_ATTESTATION_ARGS, self._task.args)
        result.update(changed=False, endpoint=args["endpoint"], variant=args["variant"])
        try:
            address = atls.parse_endpoint(args["endpoint"])
            settings = settings_from_args(args, self._loader.get_basedir())
            settings.trust = certified_aks.share(settings.trust, control_path_dir(self._templar, task_vars), os.getppid())
            result.setdefault("warnings", []).extend(settings.warnings)  # an insecure variant, acknowledged

            def connect(validators):
                try:
                    raw_sock = netns.create_connection(address, settings.timeout, settings.netns)
                except OSError as err:
                    raise ConstellationError("cannot connect to %s: %s" % (args["endpoint"], err)) from None
                conn = atls.client_handshake(raw_sock, validators, timeout=settings.timeout,
                                             attestation_timeout=settings.attestation_timeout)
                return AgentClient(conn.sock, attested=conn)

            # qemu-vtpm-ek: a peer whose AK is not certified yet is enrolled first (EnrollAK).
            conn = connect_enrolling(connect, settings.validators()).attested
        except MissingDependency as err:  # this controller's fault, never the peer's
            raise AnsibleActionFail(controller_lacks(err)) from None
        except AttestationError as err:
            result.update(failed=True, msg="attestation of %s refused: %s" % (args["endpoint"], err),
                          pcrs=pcr_rows(getattr(err, "checks", [])))
            return result
        except ConstellationError as err:
            raise AnsibleActionFail(str(err)) from None
        # Nothing is sent over the verified channel: this task only checks the peer.
        conn.sock.close()
        result.update(
            oid=conn.variant_oid,
            pcrs=pcr_rows(conn.validation.checks),
            measurements={str(i): v.hex() for i, v in sorted(conn.validation.pcrs.items())},
        )
        if conn.validation.warnings:
            result.setdefault("warnings", []).extend(conn.validation.warnings)
        if not result.get("warnings"):
            result.pop("warnings", None)
        return result
