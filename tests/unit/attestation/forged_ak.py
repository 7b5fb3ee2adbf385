# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The forged-AK attacker: a plain software P-256 key that *declares* itself a restricted,
fixedTPM signing key (TPMT_PUBLIC attributes are just bits the key's owner writes) and signs a
TPMS_ATTEST quote of its own making over the verifier's nonce, claiming the PCR values the policy wants.
No TPM is involved. The signature is sound, so only the variant's AK trust can tell."""

from __future__ import annotations

import base64
import hashlib
import os
from typing import Dict, Optional

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from tpm2_pytss import (
    TPM2_ALG,
    TPM2_GENERATED,
    TPM2_ST,
    TPMA_OBJECT,
    TPML_PCR_SELECTION,
    TPMS_ATTEST,
    TPMS_QUOTE_INFO,
    TPMS_SIGNATURE_ECC,
    TPMT_PUBLIC,
    TPMT_SIGNATURE,
    TPMU_ATTEST,
    TPMU_SIGNATURE,
)

from ansible_collections.constellation.cluster.plugins.module_utils.attestation.vtpm import (
    ALL_PCRS,
    encode_document,
    make_extra_data,
    make_tpm_nonce,
)

SHA256_BANK = 0x000B


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class SoftwareAKIssuer:
    """Issues qemu-vtpm-shaped documents with a software key. ``pcrs``: the values it claims (all 24
    PCRs; unnamed ones are zeros). ``oid``: the variant it claims to be. ``ek_cert``: a genuine EK
    certificate it offers in an enrollment (EK certificates are public); it cannot activate the
    credential, since the AK lives in no TPM, so it answers with random bytes."""

    def __init__(self, pcrs: Dict[int, bytes], oid: str, ek_cert: Optional[bytes] = None):
        self.oid = oid
        self.ek_cert = ek_cert
        self.priv_key = ec.generate_private_key(ec.SECP256R1())
        numbers = self.priv_key.public_key().public_numbers()
        attrs = (TPMA_OBJECT.RESTRICTED | TPMA_OBJECT.SIGN_ENCRYPT | TPMA_OBJECT.FIXEDTPM | TPMA_OBJECT.FIXEDPARENT
                 | TPMA_OBJECT.SENSITIVEDATAORIGIN | TPMA_OBJECT.USERWITHAUTH)
        public = TPMT_PUBLIC.parse("ecc256:ecdsa-sha256:null", objectAttributes=attrs)
        public.unique.ecc.x = numbers.x.to_bytes(32, "big")
        public.unique.ecc.y = numbers.y.to_bytes(32, "big")
        self.public = public
        self.ak_pub = public.marshal()
        self.pcrs = {i: pcrs.get(i, bytes(32)) for i in ALL_PCRS}
        self.enrollment_answers = 0

    def issue(self, user_data: bytes, nonce: bytes) -> bytes:
        tpm_nonce = make_tpm_nonce(None, make_extra_data(bytes(user_data), bytes(nonce)))
        digest = hashlib.sha256(b"".join(self.pcrs[i] for i in ALL_PCRS)).digest()
        selection = TPML_PCR_SELECTION.parse("sha256:" + ",".join(str(i) for i in ALL_PCRS))
        attest = TPMS_ATTEST(magic=TPM2_GENERATED.VALUE, type=TPM2_ST.ATTEST_QUOTE,
                             qualifiedSigner=self.public.get_name(), extraData=tpm_nonce,
                             attested=TPMU_ATTEST(quote=TPMS_QUOTE_INFO(pcrSelect=selection, pcrDigest=digest)))
        blob = attest.marshal()
        r, s = decode_dss_signature(self.priv_key.sign(blob, ec.ECDSA(hashes.SHA256())))
        signature = TPMT_SIGNATURE(sigAlg=TPM2_ALG.ECDSA, signature=TPMU_SIGNATURE(ecdsa=TPMS_SIGNATURE_ECC(
            hash=TPM2_ALG.SHA256, signatureR=r.to_bytes(32, "big"), signatureS=s.to_bytes(32, "big"))))
        quote = {"quote": _b64(blob), "raw_sig": _b64(signature.marshal()),
                 "pcrs": {"hash": SHA256_BANK, "pcrs": {str(i): _b64(v) for i, v in self.pcrs.items()}}}
        return encode_document({"ak_pub": _b64(self.ak_pub), "quotes": [quote]}, None, bytes(user_data))

    # qemu-vtpm-ek's enrollment, as far as an attacker without the AK in a TPM can go.
    def enrollment_request(self) -> Dict[str, str]:
        return {"ek_cert": _b64(self.ek_cert or b""), "ak_pub": _b64(self.ak_pub)}

    def activate_credential(self, challenge) -> bytes:  # pylint: disable=unused-argument
        self.enrollment_answers += 1
        return os.urandom(32)
