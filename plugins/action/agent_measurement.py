# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin agent_measurement: an agent's PCR 13 computed on the controller, and its entry in the signed
measurements document (attestation/agent_measurement.py). Documentation in plugins/modules/agent_measurement.py.

An action plugin because the default code is this collection's own (``agent_measurement.code_root()``): a module
packed by Ansible holds only the files it imports, and would measure another tree."""

from __future__ import annotations

import hashlib
import os

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import agent_measurement as am
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import choose
from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import AGENT_MEASUREMENT_ARGS
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError
from ansible_collections.constellation.cluster.plugins.plugin_utils.cluster_action import AttestingAction, valid_args


def _resolve(path, basedir):
    return os.path.join(basedir, path) if path and basedir and not os.path.isabs(path) else path


def measure(args, basedir):
    """(AgentMeasurement, extra results) of the task's code (archive, src or this collection's) and trust
    configuration, as the agent measures itself (unsealing.py: the variant and the EK CAs it loads)."""
    if args.get("archive") and args.get("src"):
        raise InputError("archive", "either archive or src, not both", "both")
    extra = {}
    if args.get("archive"):
        path = _resolve(args["archive"], basedir)
        code = am.archive_code_digest(path, "archive")
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        extra["archive_sha256"] = digest.hexdigest()
    elif args.get("src"):
        code = am.source_code_digest(_resolve(args["src"], basedir), "src")
    else:
        code = am.code_digest(am.code_root())
    variant = args["variant"]
    trust = choose.load_trust(variant, args.get("ek_ca_path"), basedir, "ek_ca_path", args.get("insecure_trust_any_ak"))
    config = am.config_digest(am.measured_config(variant, trust.ek_ca_certs))
    return am.AgentMeasurement(code, config), extra


def keep(args, basedir, entry, check_mode):
    """Lists (or retires) the agent ``args["name"]`` in the document ``measurements_file``, re-signed
    (agent_measurement.keep_agent_entry): a dict of results (changed, version, entry, diff texts)."""
    from ansible_collections.constellation.cluster.plugins.module_utils.attestation import signature as sig

    if args.get("measurements") is not None or not args.get("measurements_file"):
        raise InputError("measurements_file", "the measurements document to keep the agent in (a file: inline "
                         "measurements cannot be kept)", None)
    key = pinned = None
    if args.get("priv_key_file"):
        key = sig.load_private_key_file(_resolve(args["priv_key_file"], basedir), "priv_key_file",
                                        args.get("priv_key_passphrase"))
    if args.get("measurements_pub_key_file"):
        pinned = sig.load_public_key_file(_resolve(args["measurements_pub_key_file"], basedir),
                                          "measurements_pub_key_file")
    return am.keep_agent_entry(_resolve(args["measurements_file"], basedir), args["name"],
                               entry if args["state"] == "present" else None, key, pinned, check_mode)


class ActionModule(AttestingAction):
    TRANSFERS_FILES = False
    _VALID_ARGS = valid_args(AGENT_MEASUREMENT_ARGS)
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        args = self.attested_args(AGENT_MEASUREMENT_ARGS)
        basedir = self._loader.get_basedir()
        if not choose.spec(args["variant"]).quotes_pcrs:
            # Nothing checks PCR 13 for such a variant (attestation/policy.py peer_policies): no agent to list.
            result.update(changed=False, skipped=True, msg="variant %s quotes no PCRs: no agent measurement (PCR 13) "
                          "is checked or listed; the launch measurement in the snp object covers the agent"
                          % args["variant"])
            return result
        try:
            measurement, extra = measure(args, basedir)
            entry = measurement.to_dict()
            result.update(changed=False, value=entry["value"], events=entry["events"], code_digest=measurement.code.hex(),
                          config_digest=measurement.config.hex(), entry=entry, **extra)
            warning = choose.insecure_warning(args["variant"])
            if warning:
                result["warnings"] = [warning]
            if args["state"] == "absent" and not args.get("name"):
                raise InputError("name", "the agent to retire (state=absent)", None)
            if args.get("name"):
                kept = keep(args, basedir, entry, self._task.check_mode)
                before, after = kept.pop("before"), kept.pop("after")
                result.update(kept)
                if self._task.diff:
                    result["diff"] = {"before": before, "after": after, "before_header": kept["measurements_file"],
                                      "after_header": kept["measurements_file"]}
        except ConstellationError as err:
            result.update(failed=True, changed=False, msg=str(err))
        except OSError as err:
            result.update(failed=True, changed=False, msg="%s: %s" % (err.filename or "agent_measurement", err.strerror or err))
        return result
