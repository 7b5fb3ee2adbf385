# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The tests' one way to run ansible-playbook: through ansible-runner, reading the results from its
events (per host and task) and its stats (ok/changed/failed counts per host), never from scraped output.

``run_playbook(path, inventory, work_dir, ...)`` runs a playbook file; ``run_tasks(work_dir, tasks, ...)``
runs tasks on localhost (the local connection). Both return a ``PlayRun``. ``LabPlaybooks`` runs the
repository's playbooks against a lab's inventory and reads the admin's settings and key from it."""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import ansible_runner

from tests.support import ROOT, VENV_BIN

# A task's result, per host, comes from the last of these events for it.
_RESULT_EVENTS = ("runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable",
                  "runner_item_on_ok", "runner_item_on_failed")


@dataclass
class PlayRun:
    """What one ansible-playbook run did: ``rc``, ``status`` (ansible-runner's), ``stdout`` (for messages
    on failure), its ``events`` and ``stats``."""

    rc: int
    status: str
    stdout: str
    events: List[dict] = field(repr=False)
    stats: Dict[str, Dict[str, int]]

    @property
    def returncode(self) -> int:
        return self.rc

    @property
    def stderr(self) -> str:
        """Nothing: ansible-runner runs ansible-playbook on a terminal, its stderr is in ``stdout``."""
        return ""

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def results(self, host: str = "localhost") -> Dict[str, dict]:
        """Task name -> that task's result on ``host`` (its last one: a looped task's overall result)."""
        out: Dict[str, dict] = {}
        for event in self.events:
            data = event.get("event_data") or {}
            if event.get("event") in _RESULT_EVENTS[:4] and data.get("host") == host:
                res = dict(data.get("res") or {})
                res.setdefault("failed", event["event"] == "runner_on_failed")
                res.setdefault("skipped", event["event"] == "runner_on_skipped")
                res.setdefault("unreachable", event["event"] == "runner_on_unreachable")
                out[data.get("task", "")] = res
        return out

    def failed_tasks(self, host: Optional[str] = None) -> List[str]:
        return [e["event_data"].get("task", "") for e in self.events if e.get("event") == "runner_on_failed"
                and (host is None or e["event_data"].get("host") == host)]

    def counts(self, host: str) -> Dict[str, int]:
        """The recap of ``host``: ok, changed, failed, skipped, unreachable, rescued, ignored."""
        names = {"ok": "ok", "changed": "changed", "failures": "failed", "skipped": "skipped",
                 "dark": "unreachable", "rescued": "rescued", "ignored": "ignored"}
        stats = self.stats or {}
        return {name: int((stats.get(key) or {}).get(host, 0)) for key, name in names.items()}

    def recap(self) -> Dict[str, Dict[str, int]]:
        """host -> counts(host), for every host the run reached (PLAY RECAP, from the stats)."""
        hosts = set()
        for per_host in (self.stats or {}).values():
            hosts.update(per_host or {})
        return {host: self.counts(host) for host in sorted(hosts)}

    def changed(self, host: Optional[str] = None) -> int:
        """How many tasks changed something (on ``host``, or on every host)."""
        per_host = (self.stats or {}).get("changed") or {}
        return int(per_host.get(host, 0)) if host else sum(per_host.values())


def ansible_env(**extra: str) -> Dict[str, str]:
    """The environment a test's ansible-playbook runs with: the project's ansible.cfg, the checkout's venv
    first on PATH, no colours."""
    env = {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": "%s:%s" % (VENV_BIN, os.environ.get("PATH", "")),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_playbook(playbook: Path, inventory: str, work_dir: Path, args: Sequence[str] = (),
                 env: Optional[Dict[str, Any]] = None, cwd: Optional[Path] = None, timeout: int = 300,
                 limit: Optional[str] = None, binary: Optional[str] = None) -> PlayRun:
    """Runs ``ansible-playbook -i inventory [args] playbook`` (``inventory``: a path; ``binary``: another
    ansible-playbook) with ansible_env() and ``env``; ansible-runner's folder is a fresh one under ``work_dir``."""
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    runs = sorted(work_dir.glob("runner-*"))
    private = work_dir / ("runner-%d" % len(runs))
    private.mkdir()
    envvars = ansible_env(**(env or {}))
    kwargs: Dict[str, Any] = {}
    if binary:
        kwargs["binary"] = binary
    runner = ansible_runner.run(
        private_data_dir=str(private), project_dir=str(cwd or ROOT), playbook=str(playbook), inventory=inventory,
        limit=limit, cmdline=" ".join(shlex.quote(a) for a in args) or None, envvars=envvars, quiet=True,
        timeout=timeout, suppress_env_files=True, **kwargs)
    stdout = runner.stdout.read() if runner.stdout else ""
    events = list(runner.events)
    rc = runner.rc if runner.rc is not None else -1
    return PlayRun(rc=rc, status=runner.status, stdout=stdout, events=events, stats=runner.stats or {})


def run_tasks(work_dir: Path, tasks: List[dict], args: Sequence[str] = (), play: Optional[dict] = None,
              python: Optional[str] = None, **kw: Any) -> PlayRun:
    """Runs ``tasks`` on localhost (the local connection, ``python``: the venv's by default); ``play``: more
    keys of the play (vars, module_defaults); the rest as run_playbook."""
    work_dir = Path(work_dir)
    doc = {"hosts": "localhost", "gather_facts": False}
    doc.update(play or {})
    doc["tasks"] = tasks
    path = work_dir / ("play-%d.yml" % len(list(work_dir.glob("play-*.yml"))))
    work_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([doc], default=str))
    inventory = work_dir / "localhost.ini"  # as `-i localhost,` (ansible-runner takes a string for the inventory's text)
    inventory.write_text("localhost\n")
    args = ["-e", "ansible_connection=local", "-e", "ansible_python_interpreter=%s" % (python or VENV_BIN / "python")] \
        + list(args)
    return run_playbook(path, str(inventory), work_dir, args, **kw)


class LabPlaybooks:
    """A lab and the inventory folder ``inv`` made for it (hosts.yml, vault_pass and, once site.yml ran,
    measurements.json, ek_ca.pem, admin_key)."""

    def __init__(self, lab, inv: Path):
        self.lab = lab
        self.inv = inv

    def play(self, playbook: str, *extra: str) -> PlayRun:
        """Runs the repository's ``playbook`` (a path below ROOT) on the inventory with its vault password."""
        args = ["--vault-password-file", str(self.inv / "vault_pass"),
                "-e", "ansible_python_interpreter=%s" % (VENV_BIN / "python")]
        return run_playbook(ROOT / playbook, str(self.inv / "hosts.yml"), self.inv.parent / ("%s-runs" % self.inv.name),
                            args + list(extra))

    def attestation_settings(self):
        """The attestation settings the controller takes for this lab from the inventory site.yml wrote."""
        from ansible_collections.constellation.cluster.plugins.module_utils.attestation.policy import settings_from_args

        amd_roots = self.inv / "amd_roots.pem"  # the SEV-SNP variants: the lab's AMD
        return settings_from_args({"measurements_file": str(self.inv / "measurements.json"),
                                   "variant": self.lab.variant, "ek_ca_path": str(self.inv / "ek_ca.pem"),
                                   "amd_roots": str(amd_roots) if amd_roots.exists() else None,
                                   "netns": self.lab.bridge_netns, "timeout": 10.0, "attestation_timeout": 30.0})

    def admin_key(self):
        """The admin's private key site.yml wrote to the inventory."""
        from ansible_collections.constellation.cluster.plugins.module_utils.rpc.admin_key import load_priv_key

        return load_priv_key((self.inv / "admin_key").read_bytes())
