# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The image's predicted measurements: the Core's attestation/image_prediction.py computes each PCR from the UKI
(and the pinned OVMF profile for PCR 7); the build writes its measurements document and signs it."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Dict, Optional

_MODULE = "ansible_collections.constellation.cluster.plugins.module_utils.attestation.image_prediction"


def prediction_module():
    """The Core's prediction module, or None where this checkout does not have it yet."""
    try:
        return importlib.import_module(_MODULE)
    except ImportError:
        return None


def predict(uki: Path, set_name: str) -> Optional[Dict[str, Any]]:
    """{"document": the measurements document, "pcrs": {index: hex}, "note": ...} or None without the module."""
    module = prediction_module()
    if module is None:
        return None
    raise NotImplementedError  # filled in with the module's API
