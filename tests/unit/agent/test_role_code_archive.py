# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node_agent role's code archive (verified before it is unpacked), the whole role run by
ansible-playbook on this machine (local connection, every path in a temporary folder, no packages, no
service): the archive is built in a private folder of the run (0700, removed at the end, also when the run
fails), reproducibly (Molecule node_agent's idempotence run: the same bytes, nothing changed), and the node checks its copy
against the SHA-256 taken on the controller before it unpacks it. An archive changed after its digest was
taken (a callback plugin swaps it right after the role's digest task) fails the run naming both digests
and the file, and leaves the installed code as it was. Check mode predicts the change without writing."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

PLAY = """
- name: Node agent
  hosts: node
  gather_facts: false
  roles:
    - constellation.cluster.node_agent
"""

# Runs in ansible-playbook's main process, which handles a task's results before it starts the next task:
# right after the role's digest task it records the archive, its digest and its folder's mode, and with
# TAMPER_WITH swaps the archive's bytes for that file's (before the copy to the node). It records failed
# tasks too.
CALLBACK = '''
import json
import os
import shutil

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "archive_tamper"
    CALLBACK_NEEDS_ENABLED = True

    def v2_runner_on_ok(self, result):
        if result._task.name != "The code archive's SHA-256 (on the controller)":
            return
        stat = result._result["stat"]
        with open(stat["path"], "rb") as f:
            built = f.read()
        record = {"path": stat["path"], "sha256": stat["checksum"], "bytes": built.hex(),
                  "folder_mode": oct(os.stat(os.path.dirname(stat["path"])).st_mode & 0o7777)}
        if os.environ.get("TAMPER_WITH"):
            shutil.copyfile(os.environ["TAMPER_WITH"], stat["path"])
        with open(os.environ["ARCHIVE_RECORD"], "a") as f:
            f.write(json.dumps(record) + "\\n")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        with open(os.environ["ARCHIVE_RECORD"] + ".failed", "a") as f:
            f.write(json.dumps({"task": result._task.name, "stderr": result._result.get("stderr", ""),
                                "msg": result._result.get("msg", "")}) + "\\n")
'''


@pytest.fixture
def lab(tmp_path):
    """The collection's files the role installs, copied so that a test can change them, and the callback."""
    source = tmp_path / "source"
    shutil.copytree(os.path.join(REPO, "plugins", "module_utils"), source / "plugins" / "module_utils",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (source / "bin").mkdir()
    shutil.copy2(os.path.join(REPO, "bin", "constellation-agent"), source / "bin")
    (source / "files").mkdir()
    shutil.copy2(os.path.join(REPO, "files", "constellation-agent.service"), source / "files")
    (tmp_path / "callbacks").mkdir()
    (tmp_path / "callbacks" / "archive_tamper.py").write_text(CALLBACK)
    (tmp_path / "play.yml").write_text(PLAY)
    return tmp_path


def run_role(lab, *options, tamper_with=None):
    node = lab / "node"
    record = lab / "record.jsonl"
    record.write_text("")
    failed = lab / "record.jsonl.failed"
    failed.write_text("")
    extra = {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "node_agent_source_dir": str(lab / "source"),
        "node_agent_install_packages": False, "node_agent_manage_service": False,
        "node_agent_install_dir": str(node / "opt"), "node_agent_config_dir": str(node / "etc"),
        "node_agent_unit_dir": str(node / "systemd"), "node_agent_state_dir": str(node / "state"),
        "constellation_public_ip": "192.0.2.10", "node_agent_insecure_unauthenticated_activation": True,
        "node_agent_variant": "qemu-vtpm", "node_agent_insecure_trust_any_ak": True,
        "node_agent_insecure_unsigned_measurements": True,
        "node_agent_measurements": {"4": {"expected": "aa" * 32}},
    }
    args = [os.path.join(REPO, ".venv", "bin", "ansible-playbook"), "-i", "node,", str(lab / "play.yml"),
            "-e", json.dumps(extra), *options]
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(lab / "tmp"), ANSIBLE_CALLBACK_PLUGINS=str(lab / "callbacks"),
               ANSIBLE_CALLBACKS_ENABLED="archive_tamper", ARCHIVE_RECORD=str(record))
    env.pop("TAMPER_WITH", None)
    if tamper_with:
        env["TAMPER_WITH"] = str(tamper_with)
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO, timeout=120, check=False)
    built = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(built) == 1, proc.stdout + proc.stderr
    proc.failed_tasks = [json.loads(line) for line in failed.read_text().splitlines()]
    return proc, built[0]


def code_tree(lab):
    """Every file of the installed code (path -> bytes)."""
    root = lab / "node" / "opt" / "collections"
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def recap_changed(proc):
    line = next(line for line in proc.stdout.splitlines() if line.startswith("node "))
    return int(line.split("changed=")[1].split()[0])


def tampered_archive(lab):
    """A valid code archive, but not the one the controller built."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        payload = b"raise SystemExit('not the code the controller built')\n"
        member = tarfile.TarInfo("agent.py")
        member.size = len(payload)
        tar.addfile(member, io.BytesIO(payload))
    path = lab / "tampered.tar.gz"
    path.write_bytes(buffer.getvalue())
    return path


def test_an_archive_changed_after_its_digest_was_taken_is_refused_on_the_node(lab):
    # The code installed before (by an earlier run, with the content hash it recorded).
    code_dir = lab / "node/opt/collections/ansible_collections/constellation/cluster/plugins/module_utils"
    code_dir.mkdir(parents=True)
    (code_dir / "agent.py").write_text("# the code installed before\n")
    (code_dir / ".code-sha256").write_text("0" * 64 + "\n")
    installed = code_tree(lab)
    node_archive = lab / "node" / "opt" / "agent-code.tar.gz"
    tampered = tampered_archive(lab)

    proc, built = run_role(lab, tamper_with=tampered)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    # The unpack step failed, naming the file and both digests: the controller's (taken before the swap)
    # and the node's copy's.
    assert [f["task"].split(" (")[0] for f in proc.failed_tasks] == ["Agent code"], output
    assert built["sha256"] == hashlib.sha256(bytes.fromhex(built["bytes"])).hexdigest()
    assert proc.failed_tasks[0]["stderr"] == (
        f"code archive {node_archive}: SHA-256 mismatch, expected {built['sha256']} (built on the controller), "
        f"found {sha256(tampered)}; the installed code is unchanged"), output
    assert sha256(node_archive) == sha256(tampered) != built["sha256"]  # checked on the node, on its copy
    assert code_tree(lab) == installed
    assert sorted(p.name for p in code_dir.parent.iterdir()) == ["module_utils"]  # no unpacked leftovers
    assert built["folder_mode"] == "0o700"
    assert not os.path.exists(os.path.dirname(built["path"]))  # removed although the run failed


def test_the_archive_is_private_and_checked_in_check_mode_too(lab):
    # A second run building the same bytes and changing nothing: Molecule node_agent's idempotence run.
    node_archive = lab / "node" / "opt" / "agent-code.tar.gz"
    code = lab / "node/opt/collections/ansible_collections/constellation/cluster/plugins/module_utils"

    # A fresh install: the archive in a private folder of the run, gone afterwards; its digest is the node's copy's.
    proc, first = run_role(lab)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert first["folder_mode"] == "0o700"
    assert os.path.basename(first["path"]).startswith("constellation-agent-") and first["path"].endswith(".tar.gz")
    assert not os.path.exists(os.path.dirname(first["path"]))
    assert sha256(node_archive) == first["sha256"] == hashlib.sha256(bytes.fromhex(first["bytes"])).hexdigest()
    assert (code / "agent" / "daemon.py").read_bytes() == (lab / "source/plugins/module_utils/agent/daemon.py").read_bytes()
    installed = code_tree(lab)

    # Changed code: check mode predicts the change and writes nothing on the node.
    changed_file = lab / "source" / "plugins" / "module_utils" / "fileutil.py"
    changed_file.write_text(changed_file.read_text() + "\n# changed\n")
    proc, third = run_role(lab, "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert third["sha256"] != first["sha256"] and not os.path.exists(os.path.dirname(third["path"]))
    assert recap_changed(proc) > 0, proc.stdout
    assert code_tree(lab) == installed and sha256(node_archive) == first["sha256"]
