# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The tests' kit, in one place (the integration tests and the benchmarks use it; the product never does):

- ``ROOT`` (the repository), ``VENV_BIN``;
- ``wait.until``: poll a condition;
- ``procs``: processes by pid (the zombie check, waiting for an end);
- ``threads``: ``run_in_threads``, one piece of work in several threads at once;
- ``keys``: ``measurements_key``, a signing key whose public key a file pins;
- ``cluster``: ``LabCluster`` (the admin's side of a lab: keys, agents, clients) and ``lab_cluster``, the one
  factory of a lab with its cluster for module fixtures;
- ``playbook``: the one ansible-playbook runner (ansible-runner), results read from its events;
- ``fixtures``: pytest fixtures (``lab_factory``), imported by tests/conftest.py.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = ROOT / ".venv" / "bin"
