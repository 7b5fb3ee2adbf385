"""The lab of simulated hosts (``python -m lab``). See lab/lab.py."""

import sys
from pathlib import Path

# The lab uses the collection's Core (plugins/module_utils) through the link that
# scripts/setup.sh makes: collections/ansible_collections/constellation/cluster -> root.
_COLLECTIONS = str(Path(__file__).resolve().parent.parent / "collections")
if _COLLECTIONS not in sys.path:
    sys.path.insert(0, _COLLECTIONS)
