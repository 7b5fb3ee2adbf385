# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every variant module of the collection, for Ansible's module packer: the one such list.

The chooser (choose.py) imports a variant's module by name, and only when the variant is chosen.
AnsiballZ cannot see such an import: it packs only the module_utils a module imports. A module that
chooses a variant on a host imports this module instead, so every registered variant travels with it;
the controller's cluster actions import it once so that their task workers inherit it.
The repository's test_choose.py checks that it names exactly the modules of the chooser's
registrations.
"""

from __future__ import annotations

from ansible_collections.constellation.cluster.plugins.module_utils.attestation import (  # noqa: F401 pylint: disable=unused-import
    aws_snp,
    azure_snp,
    dummy,
    ek,
    snp,
    vtpm,
)
