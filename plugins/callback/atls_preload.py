# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Callback plugin atls_preload: loads the atls connection plugin once, in the controller's main process.

Ansible forks a worker process for every task and host, and each worker loads the task's connection
plugin. Ansible loads its own connection plugins in the main process before the first play
(playbook_executor.py: "preload become/connection/shell to set config defs cached"), so the workers
inherit them; a collection's connection plugin it does not, and every worker compiles atls.py and
its helpers from source and parses its DOCUMENTATION again (~9 ms of CPU per task and host on the
benchmark machine). Loaded here once, the workers inherit the module and its option definitions.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: atls_preload
type: aggregate
short_description: Load the atls connection plugin once per playbook run, not once per task and host
description:
  - Ansible runs every task on every host in a worker process forked from its main process, and each
    worker loads the task's connection plugin. Ansible's own connection plugins are loaded in the main
    process before the first play, so the workers inherit them; the
    P(constellation.cluster.atls#connection) connection plugin is not, and every worker compiles it
    and parses its option documentation again.
  - This callback loads it in the main process when a play starts, so the workers inherit it. Every
    task over C(atls) then starts faster (most of all those that run on the controller only, such as
    C(set_fact), C(assert) and skipped tasks); nothing else changes. A playbook that does not use
    C(atls) pays the loading once (a few milliseconds).
  - It prints nothing. If the plugin cannot be loaded, the preloading is skipped with a warning and the
    task that uses C(atls) reports the error as it would without this callback.
version_added: 0.3.0
author:
  - constellation.cluster contributors (@constellation-cluster)
requirements:
  - Enabled in C(ansible.cfg) (C(callbacks_enabled = constellation.cluster.atls_preload) under
    C([defaults])) or with E(ANSIBLE_CALLBACKS_ENABLED). The project's C(ansible.cfg) enables it.
"""

from ansible.errors import AnsibleError
from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import connection_loader

ATLS_CONNECTION = "constellation.cluster.atls"


class CallbackModule(CallbackBase):
    """Loads the atls connection plugin in the main process before a play's workers are forked."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "constellation.cluster.atls_preload"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._loaded = False

    def preload(self) -> None:
        """Load the plugin (once; the loader keeps it, so the next call only checks a flag)."""
        if self._loaded:
            return
        self._loaded = True
        try:
            connection_loader.get(ATLS_CONNECTION, class_only=True)
        except (AnsibleError, ImportError, SyntaxError) as exc:
            self._display.warning("constellation.cluster.atls_preload: %s not preloaded: %s" % (ATLS_CONNECTION, exc))

    # A play's start reaches the callbacks in the main process before its first task is queued, in
    # ansible-playbook and in ad-hoc ansible (with bin_ansible_callbacks) alike.
    def v2_playbook_on_play_start(self, play):  # pylint: disable=unused-argument
        self.preload()
