# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The admin admits nodes to join (the action admit_nodes; AdmitNodes, core/admissions.py): each node's EK read on
the controller, then one request to the Coordinator through ``controller.open_coordinator``."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.ek import ek_pub_sha256
from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import AttestationSettings
from ansible_collections.constellation.cluster.plugins.module_utils.errors import InputError
from ansible_collections.constellation.cluster.plugins.plugin_utils.controller import open_coordinator, open_peer


def admission_ek(node: Dict[str, Any], settings: AttestationSettings, index: int) -> str:
    """The EK a node is admitted by (hex SHA-256 of its public key): given (``ek_pub_sha256``), from its EK
    certificate (``ek_cert_file``, PEM or DER; a host not reachable yet), or read from its TPM as the controller
    attests it (``endpoint``: with qemu-vtpm-ek the AK is trusted only through credential activation with that EK)."""
    field = "nodes[%d]" % index
    if node.get("ek_pub_sha256"):  # checked by the Coordinator, naming the field
        return node["ek_pub_sha256"].strip().lower()
    if node.get("ek_cert_file"):
        try:
            with open(node["ek_cert_file"], "rb") as handle:
                data = handle.read(64 * 1024)
        except OSError as err:
            raise InputError(field + ".ek_cert_file", "a readable EK certificate file", "%s (%s)"
                             % (node["ek_cert_file"], err.strerror or err)) from None
        return ek_pub_sha256(data, field + ".ek_cert_file")
    if node.get("endpoint"):
        with open_peer(node["endpoint"], settings) as client:
            ek = getattr(client.attested.validation, "ek_pub_sha256", None)
        if ek is None:
            raise InputError(field + ".endpoint", "a host attested with variant qemu-vtpm-ek (only it names the EK)",
                             node["endpoint"])
        return ek
    raise InputError(field, "one of ek_pub_sha256, ek_cert_file or endpoint (the host, to read its EK)")


def admit_nodes(coordinator_public_endpoint: str, nodes: Sequence[Dict[str, Any]], settings: AttestationSettings,
                admin_priv_key, cluster_id: Optional[bytes] = None, check_mode: bool = False) -> Dict[str, Any]:
    """Admits (or, ``state: absent``, removes) nodes to join on the Coordinator (AdmitNodes, core/admissions.py),
    attested and admin-authenticated; each node's EK from ``admission_ek``. ``check_mode``: the Coordinator only
    predicts. The Coordinator's answer plus ``before`` (its admissions before)."""
    request = []
    for index, node in enumerate(nodes):
        entry = {"name": node.get("name"), "state": node.get("state") or "present"}
        if entry["state"] == "present" or any(node.get(k) for k in ("ek_pub_sha256", "ek_cert_file", "endpoint")):
            entry["ek_pub_sha256"] = admission_ek(node, settings, index)
        request.append(entry)
    with open_coordinator(coordinator_public_endpoint, settings, admin_priv_key, cluster_id,
                          " (admit_nodes)") as client:
        before = client.invoke("AdmitNodes", nodes=[], check=True)["admissions"]
        absent = [e for e in request if e["state"] == "absent" and "ek_pub_sha256" not in e]
        for entry in absent:  # removed by name: the EK the Coordinator holds for it
            entry["ek_pub_sha256"] = next((a["ek_pub_sha256"] for a in before if a["name"] == entry["name"]), None)
        request = [e for e in request if e.get("ek_pub_sha256")]
        answer = dict(client.invoke("AdmitNodes", nodes=request, check=bool(check_mode)))
    answer["before"] = before
    return answer
