# -*- coding: utf-8 -*-
# Copyright: constellation.cluster contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""README "Running it", followed literally from bare lab hosts (``lab up --bare``: a TPM and an sshd each, no
agent) to a verified cluster and an added node.

The commands are parsed out of README.md (its numbered list, one command per step) and run as they are, through
the shell from the repository root; only the inventory's path (``inventories/mycluster``, here in the test's
folder) and the vault password file (``F``) are substituted. What a step asks the operator to do by hand is
done as the README says, nothing more: the copied ``hosts.yml`` gets the lab's addresses where it says CHANGE-ME,
and the trust files the lab made (the image's signed measurements, the pinned key, the EK roots) are put beside
it. The lab adds to ``hosts.yml`` only what a lab host needs and a real one has: how the controller reaches it
(the lab's SSH key and ProxyCommand, the admin machine's namespace for aTLS), its TPM and the node_agent role's
folders in the host's own folder (the hosts share one file system; no systemd), and Kubernetes off.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

from lab.lab import Lab
from tests.support import ROOT
from tests.support.playbook import ansible_env

pytestmark = pytest.mark.lab

LAB = "wk"
README = ROOT / "README.md"
# What the operator's inventory needs on a lab host and a real host has anyway (see the docstring).
LAB_GROUP_VARS = ("constellation_atls_netns", "constellation_kubernetes", "ansible_python_interpreter", "ansible_user",
                  "ansible_ssh_private_key_file", "ansible_ssh_common_args", "ansible_control_path_dir")
TRUST_FILES = ("measurements.json", "measurements.json.sig", "measurements.pub", "ek_ca.pem")
# The example's hosts and the lab hosts whose addresses replace their placeholders; worker-2 is added in step 6.
NAMES = {"cp-0": "h1", "worker-0": "h2", "worker-1": "h3", "worker-2": "h4"}
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def readme_walk(text: str) -> List[str]:
    """The commands of README "Running it": its numbered list, one fenced command per step, in order."""
    section = text.split("\n## Running it\n", 1)[1].split("\n## ", 1)[0]
    items = re.split(r"(?m)^(\d+)\. ", section)[1:]
    numbers, bodies = [int(n) for n in items[0::2]], items[1::2]
    assert numbers == list(range(1, len(numbers) + 1)), numbers
    commands = []
    for number, body in zip(numbers, bodies):
        body = re.split(r"\n(?=\S)", body, maxsplit=1)[0]  # the item ends where a line starts unindented
        blocks = re.findall(r"(?ms)^ *```sh\n(.*?)^ *```", body)
        lines = [line.strip() for block in blocks for line in block.splitlines() if line.strip()]
        assert len(lines) == 1, "step %d: expected one command, got %r" % (number, lines)
        commands.append(lines[0])
    return commands


def readme_more(text: str) -> List[str]:
    """The commands README "Running it" shows after its list: the --limit runs, and the run without a dead host."""
    section = text.split("\n## Running it\n", 1)[1].split("\n## ", 1)[0]
    after = re.split(r"(?m)^\d+\. ", section)[-1].split("\n\n", 1)[1]
    blocks = re.findall(r"(?ms)^```sh\n(.*?)^```", after)
    return [line.strip() for block in blocks for line in block.splitlines()
            if "--limit" in line or "constellation_max_fail_percentage" in line]


class Walk:
    def __init__(self, lab: Lab, lab_inv: Path, base: Path, vault_pass: Path):
        self.lab, self.lab_inv, self.base, self.vault_pass = lab, lab_inv, base, vault_pass
        self.inv = base / "mycluster"
        self.steps = readme_walk(README.read_text())
        self.log: List[str] = []

    def command(self, step) -> str:
        """Step ``step``'s command (or the command ``step``) with only the inventory path and the vault password
        file substituted."""
        cmd = (self.steps[step - 1] if isinstance(step, int) else step).replace("inventories/mycluster", str(self.inv))
        return re.sub(r"--vault-password-file \S+", "--vault-password-file %s" % self.vault_pass, cmd)

    def run(self, step, *extra: str) -> subprocess.CompletedProcess:
        cmd = " ".join([self.command(step)] + list(extra))
        env = dict(os.environ, **ansible_env())
        proc = subprocess.run(cmd, shell=True, cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=900,
                              check=False)
        self.log.append("$ %s\n%s%s" % (cmd, proc.stdout[-3000:], proc.stderr[-2000:]))
        return proc

    def lab_host_vars(self, name: str) -> Dict[str, object]:
        lab_hosts = yaml.safe_load((self.lab_inv / "hosts.yml").read_text())
        for group in lab_hosts["all"]["children"].values():
            if NAMES[name] in (group.get("hosts") or {}):
                return {k: v for k, v in group["hosts"][NAMES[name]].items() if k.startswith("node_agent_")}
        raise KeyError(name)

    def edit_hosts(self, add: str = "") -> None:
        """The operator's edit of hosts.yml (README step 1; step 6 with ``add``): each CHANGE-ME address replaced
        with the host's; plus, lab only, what its hosts need (see the docstring)."""
        path = self.inv / "hosts.yml"
        doc = yaml.safe_load(path.read_text())
        groups = doc["all"]["children"]
        if add:
            groups["nodes"]["hosts"][add] = {"constellation_public_endpoint": "%s.CHANGE-ME.invalid:9000" % add}
        lab_vars = yaml.safe_load((self.lab_inv / "group_vars" / "all" / "lab.yml").read_text())
        doc["all"]["vars"] = {key: lab_vars[key] for key in LAB_GROUP_VARS}
        for group in groups.values():
            for name, values in group["hosts"].items():
                values["constellation_public_endpoint"] = values["constellation_public_endpoint"].replace(
                    "%s.CHANGE-ME.invalid:9000" % name, self.lab.host(NAMES[name]).public_endpoint)
                values.update(self.lab_host_vars(name))
        path.write_text(yaml.safe_dump(doc, sort_keys=False))

    def agents(self) -> Dict[str, bool]:
        return {row["host"]: row["agent"] for row in self.lab.status()}


def recap(proc: subprocess.CompletedProcess) -> Dict[str, Dict[str, int]]:
    return {m.group(1): {"ok": int(m.group(2)), "changed": int(m.group(3)), "unreachable": int(m.group(4)),
                         "failed": int(m.group(5))} for m in RECAP.finditer(proc.stdout)}


def out(proc: subprocess.CompletedProcess) -> str:
    return (proc.stdout + proc.stderr)[-6000:]


@pytest.fixture(scope="module")
def walk(tmp_path_factory):
    base = tmp_path_factory.mktemp("walk")
    lab_inv = base / "lab-inventory"
    lab = Lab(LAB, inventory_dir=lab_inv)
    lab.up(hosts=3, tpm=True, bare=True)
    vault_pass = base / "vault_pass"
    vault_pass.write_text(os.urandom(16).hex() + "\n")
    vault_pass.chmod(0o600)
    try:
        yield Walk(lab, lab_inv, base, vault_pass)
    finally:
        lab.down()


def test_the_walk_is_one_numbered_list_of_one_command_each():
    steps = readme_walk(README.read_text())
    assert steps[0] == "cp -r inventories/example inventories/mycluster"
    playbooks = [re.match(r"ansible-playbook (\S+) -i inventories/mycluster/hosts.yml --vault-password-file F$",
                          step) for step in steps[1:]]
    assert [m.group(1) if m else step for m, step in zip(playbooks, steps[1:])] == [
        "playbooks/secrets.yml", "playbooks/bootstrap.yml", "site.yml", "playbooks/verify.yml",
        "playbooks/add_nodes.yml"]
    more = readme_more(README.read_text())
    assert [re.sub(r"^ansible-playbook (\S+) -i inventories/mycluster/hosts.yml --vault-password-file F ", r"\1 ", cmd)
            for cmd in more] == ["site.yml --limit worker-1", "playbooks/verify.yml --limit worker-1",
                                 "site.yml -e constellation_max_fail_percentage=25"], more


def test_from_bare_hosts_to_a_verified_cluster(walk):
    assert not any(walk.agents().values()), walk.agents()  # bare hosts: no agent yet
    # 1. Copy the example inventory, edit the addresses, put the trust files beside it.
    proc = walk.run(1)
    assert proc.returncode == 0, out(proc)
    walk.edit_hosts()
    for name in TRUST_FILES:
        shutil.copy(walk.lab_inv / name, walk.inv / name)

    # 2. The secrets, vault-encrypted in the inventory's folder.
    proc = walk.run(2)
    assert proc.returncode == 0, out(proc)
    for name in ("init_secret", "admin_key", "constellation-mastersecret.json", "constellation-measurement-salt.json"):
        assert (walk.inv / name).read_text().startswith("$ANSIBLE_VAULT;"), name

    # 3. Bootstrap: predicted first (--check writes nothing and starts nothing), then the agents installed over SSH.
    proc = walk.run(3, "--check")
    assert proc.returncode == 0, out(proc)
    assert all(row["changed"] > 0 for row in recap(proc).values()), recap(proc)
    assert not any(walk.agents().values()), walk.agents()
    proc = walk.run(3)
    assert proc.returncode == 0, out(proc)
    assert set(recap(proc)) == {"cp-0", "worker-0", "worker-1"}
    assert all(row["failed"] == 0 and row["changed"] > 0 for row in recap(proc).values()), recap(proc)
    assert all(walk.agents().values()), walk.agents()
    again = walk.run(3)  # every agent answers now: every host is skipped
    assert again.returncode == 0, out(again)
    assert all(row["changed"] == 0 and row["failed"] == 0 for row in recap(again).values()), recap(again)

    # 4. site.yml: the cluster, with the init secret the agents were given the hashes of.
    proc = walk.run(4)
    assert proc.returncode == 0, out(proc)
    assert all(row["failed"] == 0 and row["unreachable"] == 0 for row in recap(proc).values()), recap(proc)
    assert recap(proc)["cp-0"]["changed"] > 0

    # 5. verify.yml: every peer ours and in the mesh.
    proc = walk.run(5)
    assert proc.returncode == 0, out(proc)
    assert set(recap(proc)) == {"cp-0", "worker-0", "worker-1"}
    assert all(row["failed"] == 0 for row in recap(proc).values()), recap(proc)


def test_a_host_is_added(walk):
    """6. A new bare host boots; it is put in hosts.yml and add_nodes.yml gives it its agent and activates it."""
    assert (walk.inv / "constellation-mastersecret.json").exists(), "needs the cluster of the test before"
    walk.lab.grow(4)
    walk.edit_hosts(add="worker-2")
    proc = walk.run(6)
    assert proc.returncode == 0, out(proc)
    rows = recap(proc)
    assert rows["worker-2"]["changed"] > 0 and rows["worker-2"]["failed"] == 0, rows
    assert all(rows[name]["changed"] == 0 and rows[name]["failed"] == 0 for name in ("cp-0", "worker-0", "worker-1")), rows
    proc = walk.run(5)
    assert proc.returncode == 0, out(proc)
    assert set(recap(proc)) == set(NAMES) and all(row["failed"] == 0 for row in recap(proc).values()), recap(proc)


def test_limit_runs_on_the_converged_cluster(walk):
    """README: ``--limit`` on site.yml and verify.yml checks and configures only the host named."""
    assert (walk.inv / "constellation-mastersecret.json").exists(), "needs the cluster of the tests before"
    for cmd in [c for c in readme_more(README.read_text()) if "--limit" in c]:
        proc = walk.run(cmd)
        assert proc.returncode == 0, out(proc)
        rows = recap(proc)
        assert set(rows) == {"worker-1"}, rows
        assert rows["worker-1"]["changed"] == 0 and rows["worker-1"]["failed"] == 0, rows


def test_a_dead_host_fails_alone(walk):
    """A host dies (every process on it stops: its agent, sshd and the sessions of the runs before; nothing
    answers): site.yml names it alone and stops before anything is sent; with README's
    constellation_max_fail_percentage the others are checked and configured."""
    from lab.procs import kill_all, pids_in_netns

    dead = walk.lab.host(NAMES["worker-2"])
    kill_all(pids_in_netns(dead.netns))
    healthy = ("cp-0", "worker-0", "worker-1")
    proc = walk.run(4)
    assert proc.returncode != 0, out(proc)
    rows = recap(proc)
    assert rows["worker-2"]["failed"] + rows["worker-2"]["unreachable"] == 1, rows
    assert all(rows[n]["failed"] == 0 and rows[n]["unreachable"] == 0 and rows[n]["changed"] == 0 for n in healthy), rows
    flat = " ".join(proc.stdout.split())  # the callback wraps long messages
    assert "refused or unreachable: worker-2" in flat and "the run stops here" in flat, out(proc)
    (cmd,) = [c for c in readme_more(README.read_text()) if "constellation_max_fail_percentage" in c]
    proc = walk.run(cmd)
    assert proc.returncode != 0, out(proc)
    rows = recap(proc)
    assert rows["worker-2"]["failed"] + rows["worker-2"]["unreachable"] == 1, rows
    assert all(rows[n]["failed"] == 0 and rows[n]["unreachable"] == 0 and rows[n]["changed"] == 0 for n in healthy), rows
    assert "the run goes on without them" in " ".join(proc.stdout.split()), out(proc)
