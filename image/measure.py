# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The image's predicted measurements: the Core (attestation/image_prediction.py) computes PCRs 4, 7, 9 and 11
from the UKI and the pinned OVMF profile; the build writes its measurements document (one set named after the
image, PCR 13 zero) and signs it with the same Core the measurements_signature module uses."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Dict, Optional

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import image_prediction, signature
from ansible_collections.constellation.cluster.plugins.module_utils.fileutil import atomic_write


def predict(uki: Path, set_name: str) -> Dict[str, Any]:
    """{"prediction": Prediction, "document": MeasurementSets, "pcrs": {index: hex}, "events": ...}."""
    prediction = image_prediction.predict(str(uki))
    doc = image_prediction.document(prediction, set_name)
    return {"prediction": prediction, "document": doc,
            "pcrs": {str(i): v.hex() for i, v in prediction.values().items()},
            "detail": prediction.to_dict()}


def write(doc, out: Path, signing_key: Optional[Path]) -> None:
    """measurements.json (+ .sig when a signing key is given), each written atomically."""
    if signing_key is None:
        atomic_write(str(out), doc.dumps().encode("utf-8"), 0o644)
        # A signature of an earlier build would no longer match (the document is signed offline).
        with contextlib.suppress(FileNotFoundError):
            os.remove(signature.signature_path(str(out)))
        return
    key = signature.load_private_key_file(str(signing_key), "--signing-key")
    image_prediction.write_signed(doc, str(out), key)
