# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""kubeadm, by concern: ``validate.py`` (constants, argument specs, validation, tokens, the CA hash),
``config.py`` (the documents), ``pki.py`` (the kubelet serving certificate signed with the cluster CA,
kubeconfig identities), ``command.py`` (running kubeadm through ``module_utils/command.py``)
and ``operations.py`` (conditions and operations). This module re-exports their public names; private
helpers (``_name``) stay in their own module and are imported from there.

kubeadm: the configuration documents Constellation generates, the pinned CA hash, bootstrap tokens,
certificate keys, and the one place that runs ``kubeadm``.

Three layers, lowest first (the community.crypto ``luks_device`` pattern):

* command seam: ``run_command`` is the only function that starts a program; ``Kubeadm`` builds the
  command lines and parses kubeadm's structured outputs (``token list -o json``, the token that
  ``token create`` prints) and the files kubeadm writes (``admin.conf``, ``pki/ca.crt``); never
  free-text scraping.
* conditions: ``is_initialised`` / ``is_joined`` look at what kubeadm left on disk and decide whether
  anything must change.
* operations: ``init_control_plane``, ``join_node``, ``ensure_token``, ``remove_token``: decide with the
  conditions, render the configuration, run kubeadm, read the results back.

Secrets (bootstrap token, certificate key) travel only inside a 0600 configuration file in a private
temporary directory, never on a command line (other users can read ``/proc/*/cmdline``), and every
configuration that is reported is redacted first. Joining always pins the cluster CA by its
SubjectPublicKeyInfo hash: there is deliberately no way to express ``unsafeSkipCAVerification``.
"""

from __future__ import annotations

# Each concern's public names (no two of them define one name differently).
# pylint: disable=wildcard-import,unused-wildcard-import
from ansible_collections.constellation.cluster.plugins.module_utils.command import CommandResult, run_command  # noqa: F401
from ansible_collections.constellation.cluster.plugins.module_utils.errors import (  # noqa: F401
    ConstellationError,
    ExternalCommandError,
    InputError,
    StateError,
)
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.validate import *  # noqa: F401,F403
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.pki import *  # noqa: F401,F403
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.config import *  # noqa: F401,F403
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.command import *  # noqa: F401,F403
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.operations import *  # noqa: F401,F403
from ansible_collections.constellation.cluster.plugins.module_utils.kubeadm.nodes import *  # noqa: F401,F403
