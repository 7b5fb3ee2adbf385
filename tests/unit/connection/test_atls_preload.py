# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The atls_preload callback: the main process loads the atls connection plugin, so the workers Ansible
forks per task and host inherit it (its module and its option definitions) instead of loading it again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ansible_collections.constellation.cluster.plugins.callback import atls_preload

# <root>/ansible_collections/constellation/cluster/plugins/callback/atls_preload.py
COLLECTIONS_ROOT = Path(atls_preload.__file__).resolve().parents[5]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# Run in a fresh interpreter (this one may have imported the plugin already): what a forked worker
# finds, without and with the callback's play start in the main process before the fork.
PROBE = r"""
import json, os, sys
from ansible import constants as C
from ansible.plugins.loader import callback_loader, connection_loader, init_plugin_loader

init_plugin_loader([sys.argv[1]])
MODULE = "ansible_collections.constellation.cluster.plugins.connection.atls"


def worker_view():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        before = MODULE in sys.modules, C.config.has_configuration_definition("connection", MODULE)
        connection_loader.get("constellation.cluster.atls", class_only=True)
        os.write(write, json.dumps({"inherited_module": before[0], "inherited_options": before[1],
                                    "loads": MODULE in sys.modules}).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as handle:
        return json.loads(handle.read())


callback = callback_loader.get("constellation.cluster.atls_preload")
without = worker_view()
callback.v2_playbook_on_play_start(None)
print(json.dumps({"without": without, "with": worker_view()}))
"""


def test_workers_inherit_the_preloaded_plugin():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", PROBE, str(COLLECTIONS_ROOT)], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    # Without the callback each worker loads the plugin itself; with it, it finds both loaded already.
    assert seen["without"] == {"inherited_module": False, "inherited_options": False, "loads": True}
    assert seen["with"] == {"inherited_module": True, "inherited_options": True, "loads": True}


def test_a_plugin_that_cannot_load_is_a_warning_not_a_failure(monkeypatch):
    def broken(*_args, **_kwargs):
        raise ImportError("No module named 'tpm2_pytss'")

    warnings = []
    monkeypatch.setattr(atls_preload.connection_loader, "get", broken)
    callback = atls_preload.CallbackModule()
    monkeypatch.setattr(callback._display, "warning", warnings.append)  # pylint: disable=protected-access
    callback.v2_playbook_on_play_start(None)
    callback.v2_playbook_on_play_start(None)  # tried once per run, not once per play
    assert warnings == ["constellation.cluster.atls_preload: constellation.cluster.atls not preloaded: "
                        "No module named 'tpm2_pytss'"]


def test_the_project_configuration_enables_it():
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    env.pop("ANSIBLE_CALLBACKS_ENABLED", None)
    proc = subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible-config"), "dump", "--only-changed"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    enabled = [line for line in proc.stdout.splitlines() if line.startswith("CALLBACKS_ENABLED")]
    assert enabled and "constellation.cluster.atls_preload" in enabled[0], proc.stdout
