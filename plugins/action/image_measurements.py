# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin image_measurements: a node image's predicted PCRs and its signed measurements document, computed on
the controller from the image's UKI (attestation/image_prediction.py). Documentation in
plugins/modules/image_measurements.py.

An action plugin because the UKI, the keys and the document are the operator's files on the controller, and the
prediction runs systemd-measure there; nothing is sent to a host."""

from __future__ import annotations

import os

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import image_prediction as ip
from ansible_collections.constellation.cluster.plugins.module_utils.attestation import signature as sig
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.measurements import (
    as_sets, parse_policy)
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import read_policy_document
from ansible_collections.constellation.cluster.plugins.module_utils.controller_options import IMAGE_MEASUREMENTS_ARGS
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError, InputError
from ansible_collections.constellation.cluster.plugins.plugin_utils.action_args import ArgSpecAction, valid_args


def _resolve(path, basedir):
    return os.path.join(basedir, path) if path and basedir and not os.path.isabs(path) else path


def make(args, basedir, check_mode):
    """The task's results: the prediction, the document kept at ``dest``."""
    firmware = ip.FIRMWARE_PROFILES.get(args["firmware"])
    if firmware is None:
        raise InputError("firmware", "one of %s" % ", ".join(ip.FIRMWARE_PROFILES), args["firmware"])
    key = pinned = None
    if args.get("priv_key_file"):
        key = sig.load_private_key_file(_resolve(args["priv_key_file"], basedir), "priv_key_file",
                                        args.get("priv_key_passphrase"))
    if args.get("pub_key_file"):
        pinned = sig.load_public_key_file(_resolve(args["pub_key_file"], basedir), "pub_key_file")
        if key is not None and not sig.same_public_key(pinned, key.public_key()):
            raise InputError("priv_key_file", "the key whose public half pub_key_file pins", None)
    base = None
    if args.get("base_file"):
        # With pub_key_file the document in force is taken only when its signature verifies.
        base = as_sets(parse_policy(read_policy_document(args["base_file"], basedir,
                                                         _resolve(args.get("pub_key_file"), basedir))))
    prediction = ip.predict(_resolve(args["uki"], basedir), firmware)
    doc = ip.document(prediction, args["name"], args.get("version"), base)
    kept = ip.keep_document(doc, _resolve(args["dest"], basedir), key, check_mode)
    return dict(kept, pcrs={str(i): v.hex() for i, v in prediction.values().items()},
                prediction=prediction.to_dict(), version=doc.version, sets=list(doc.sets))


class ActionModule(ArgSpecAction):
    TRANSFERS_FILES = False
    _VALID_ARGS = valid_args(IMAGE_MEASUREMENTS_ARGS)
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        args = self.validated_args(IMAGE_MEASUREMENTS_ARGS)
        try:
            result.update(make(args, self._loader.get_basedir(), self._task.check_mode))
        except ConstellationError as err:
            result.update(failed=True, changed=False, msg=str(err))
        return result
