# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin accepted_measurements: SetMeasurements on the attested Coordinator (a rolling image upgrade).

Documentation is in plugins/modules/accepted_measurements.py; the shared base is plugin_utils/cluster_action.py.
"""

from __future__ import annotations

import os

from ansible_collections.constellation.cluster.plugins.module_utils import controller_options
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.plugin_utils.cluster_action import ClusterAction, valid_args

MAX_DOCUMENT = 1024 * 1024


class ActionModule(ClusterAction):
    SPEC = controller_options.ACCEPTED_MEASUREMENTS_ARGS
    _VALID_ARGS = valid_args(SPEC)

    def act(self, args, settings):
        from ansible_collections.constellation.cluster.plugins.module_utils.attestation.signature import signature_path
        from ansible_collections.constellation.cluster.plugins.plugin_utils.controller import open_peer

        path = args.get("accepted_measurements_file")
        document = signature = None
        if path:  # without a document: only what is in force and which set each peer runs
            if not os.path.isabs(path):
                path = os.path.join(self._loader.get_basedir(), path)
            document = _read(path, "accepted_measurements_file", MAX_DOCUMENT)
            sig_path = signature_path(path)
            signature = _read(sig_path, "accepted_measurements_file", 4096).decode("ascii", "replace").strip() \
                if os.path.exists(sig_path) else None
        priv_key = self.load_admin_priv_key(args["admin_priv_key_file"])
        with open_peer(args["endpoint"], settings) as client:
            client.admin_auth(priv_key)
            answer = client.invoke("SetMeasurements", document=document, signature=signature,
                                   check=bool(self._task.check_mode))
        before = [n for n in answer["sets"] if n not in (answer.get("added") or [])] + list(answer.get("removed") or [])
        return {"changed": answer["changed"], "version": answer["version"], "sets": answer["sets"],
                "added": answer.get("added") or [], "removed": answer.get("removed") or [],
                "peers": answer.get("peers") or {}, "agents": answer.get("agents") or {},
                "diff": {"before": {"accepted": before}, "after": {"accepted": answer["sets"]}}}


def _read(path: str, field: str, limit: int) -> bytes:
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as err:
        raise InputError(field, "a readable file", "%s (%s)" % (path, err.strerror)) from None
    if len(data) > limit:
        raise InputError(field, "at most %d bytes" % limit, path)
    return data
