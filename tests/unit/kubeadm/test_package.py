# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kubeadm package re-exports the public names of its modules only: private helpers are imported
from their own module (``kubeadm.operations._PrivateConfig``), so they can change freely."""

from __future__ import annotations

import ast
from pathlib import Path

from ansible_collections.constellation.cluster.plugins.module_utils import kubeadm

PACKAGE = Path(kubeadm.__file__)


def test_the_package_re_exports_no_private_name():
    tree = ast.parse(PACKAGE.read_text())
    private = [alias.name for node in tree.body if isinstance(node, ast.ImportFrom) for alias in node.names
               if alias.name.startswith("_") and node.module != "__future__"]
    assert private == []
    assert not [name for name in vars(kubeadm) if name.startswith("_") and not name.startswith("__")]
