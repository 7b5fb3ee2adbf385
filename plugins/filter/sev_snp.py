# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filter sev_snp_report: a thin adapter over module_utils/attestation/sev_snp.py.
Its documentation is in sev_snp_report.yml next to this file."""

from __future__ import annotations

import base64
import binascii
import datetime

from ansible.errors import AnsibleFilterError

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import sev_snp
from ansible_collections.constellation.cluster.plugins.module_utils.errors import ConstellationError


def _report_bytes(value) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if not isinstance(value, str):
        raise AnsibleFilterError("sev_snp_report: report: found %s, wanted the report as base64 or hex text"
                                 % type(value).__name__)
    text = "".join(value.split())
    if len(text) == 2 * sev_snp.REPORT_SIZE:
        try:
            return bytes.fromhex(text)
        except ValueError:
            pass
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise AnsibleFilterError("sev_snp_report: report: found text that is neither base64 nor hex, wanted the "
                                 "report (%d bytes) as base64 or hex" % sev_snp.REPORT_SIZE) from None


def _moment(value):
    if value is None or value == "":
        return None
    if isinstance(value, datetime.datetime):
        moment = value
    else:
        try:
            moment = datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            raise AnsibleFilterError("sev_snp_report: now: found %r, wanted an ISO 8601 time such as "
                                     "2025-01-01T00:00:00Z" % (str(value)[:64],)) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.timezone.utc)


def sev_snp_report(report, signer=None, chain="", policy=None, now=None, amd_roots=None):
    """report | sev_snp_report(signer=PEM, chain=PEM, policy=None, now=None) -> the verified report's fields."""
    if not signer:
        raise AnsibleFilterError("sev_snp_report: signer: found nothing, wanted the VCEK or VLEK certificate (PEM)")
    try:
        parsed = sev_snp.parse_report(_report_bytes(report))
        roots = sev_snp.load_roots(str(amd_roots).encode(), "amd_roots") if amd_roots else None
        snp_policy = sev_snp.SNPPolicy.from_dict(policy, "snp") if policy is not None else None
        if snp_policy is not None and roots is None and snp_policy.amd_root_key is not None:
            roots = snp_policy.roots()
        verified = sev_snp.verify_report(parsed, signer, chain or b"", roots=roots, now=_moment(now))
        if snp_policy is not None:
            snp_policy.check(verified.report)
    except ConstellationError as err:
        raise AnsibleFilterError("sev_snp_report: %s" % err) from None
    return verified.to_dict()


class FilterModule:
    def filters(self):
        return {"sev_snp_report": sev_snp_report}
