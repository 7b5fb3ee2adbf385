# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``dummy`` variant (docs/attestation.md, "Variants and their OIDs"): no TPM, no security.

The document is the JSON ``{"UserData": <b64>, "Nonce": <b64>}``, exactly what Constellation's
FakeIssuer produces, so aTLS can be exercised without a TPM. It proves nothing about the peer
and must never be configured outside tests.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
from typing import Optional

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.variant import DUMMY, Validation
from ansible_collections.constellation.cluster.plugins.module_utils.encoding import load_json
from ansible_collections.constellation.cluster.plugins.module_utils.errors import AttestationError


class DummyIssuer:
    """``ek_pub_sha256``: an EK identity the document claims (tests of the join's admission); none by default,
    which leaves the document exactly Constellation's."""

    oid = DUMMY.oid

    def __init__(self, ek_pub_sha256: Optional[str] = None):
        self.ek_pub_sha256 = ek_pub_sha256

    def issue(self, user_data: bytes, nonce: bytes) -> bytes:
        document = {
            "UserData": base64.b64encode(user_data).decode("ascii"),
            "Nonce": base64.b64encode(nonce).decode("ascii"),
        }
        if self.ek_pub_sha256 is not None:
            document["EKPubSHA256"] = self.ek_pub_sha256
        return json.dumps(document).encode("ascii")


class DummyValidator:
    oid = DUMMY.oid

    def validate(self, document: bytes, nonce: bytes) -> Validation:
        try:
            parsed = load_json(document, "dummy attestation document")  # InputError is a ValueError
            user_data = base64.b64decode(parsed["UserData"], validate=True)
            doc_nonce = base64.b64decode(parsed["Nonce"], validate=True)
        except (ValueError, TypeError, KeyError, binascii.Error) as err:
            raise AttestationError("dummy attestation document is malformed: %s" % err) from None
        if not hmac.compare_digest(doc_nonce, nonce):
            raise AttestationError("dummy attestation document was made for another nonce")
        ek = parsed.get("EKPubSHA256")
        return Validation(user_data=user_data, ek_pub_sha256=ek if isinstance(ek, str) else None)


# The chooser's factories (choose.py): no TPM, no policy, no trust.
def make_issuer(tcti=None, **kwargs) -> DummyIssuer:
    return DummyIssuer()


def make_validator(policy, trust) -> DummyValidator:
    return DummyValidator()
